package answer

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
)

func ptr[T any](v T) *T { return &v }

// shapes are a full and a bare value of each shape, made from the bus's results as a
// transport makes them, with the bytes docs/protocol.md says each goes out as: the full value
// has every field, the bare one shows which are null and which are left out.
var shapes = []struct {
	name       string
	full, bare any
	fullJSON   string
	bareJSON   string
}{
	{
		name: "Delivery", // §3.5, §4.1 send, §8.3 step 10
		full: DeliveryOf(bus.Delivery{SessionID: "svc:bot", FromName: "xmsg@host · alice", Bytes: 42, MessageID: "m1", Outcome: ledger.Queued,
			Harness: "svc", Peer: "p"}),
		bare:     DeliveryOf(bus.Delivery{}),
		fullJSON: `{"sessionId":"svc:bot","fromName":"xmsg@host · alice","bytes":42,"messageId":"m1","outcome":"queued"}`,
		bareJSON: `{"sessionId":"","fromName":"","bytes":0,"messageId":"","outcome":""}`,
	},
	{
		name: "Session", // §3.3: name, entrypoint, version string|null; registered omitted for claude
		full: SessionOf(bus.Session{SessionID: "s1", Name: ptr("alice"), PID: 7, Cwd: "/w", Status: "busy", Kind: "interactive",
			Entrypoint: ptr("cli"), Version: ptr("2.1"), StartedAt: json.RawMessage("1700000000000"), UpdatedAt: json.RawMessage("1700000000001"),
			Harness: "pi", Registered: ptr(false)}),
		bare: SessionOf(bus.Session{SessionID: "s2", Harness: "claude", StartedAt: json.RawMessage{}}), // a time left empty, nil or not, is null
		fullJSON: `{"sessionId":"s1","name":"alice","pid":7,"cwd":"/w","status":"busy","kind":"interactive","entrypoint":"cli",` +
			`"version":"2.1","startedAt":1700000000000,"updatedAt":1700000000001,"harness":"pi","registered":false}`,
		bareJSON: `{"sessionId":"s2","name":null,"pid":0,"cwd":"","status":"","kind":"","entrypoint":null,"version":null,` +
			`"startedAt":null,"updatedAt":null,"harness":"claude"}`,
	},
	{
		name:     "RemoteSession", // §3.3 ?peer=: exactly these keys
		full:     RemoteSessionOf(bus.RemoteSession{Harness: "svc", Kind: "daemon", Name: ptr("bot"), Ref: "svc:bot@b", SessionID: "svc:bot", Status: "idle"}),
		bare:     RemoteSessionOf(bus.RemoteSession{}),
		fullJSON: `{"harness":"svc","kind":"daemon","name":"bot","ref":"svc:bot@b","sessionId":"svc:bot","status":"idle"}`,
		bareJSON: `{"harness":"","kind":"","name":null,"ref":"","sessionId":"","status":""}`,
	},
	{
		name: "Reply", // §3.7: pushOutcome/pushedMessageId null when absent
		full: ReplyOf(bus.Reply{Seq: 3, MessageID: "m1", CreatedAt: 1700000000, ReplierSessionID: "svc:bot", Text: "<pong> & \"more\"",
			PushOutcome: ledger.Pushed, PushedMessageID: "m2"}),
		bare: ReplyOf(bus.Reply{Seq: 1, MessageID: "m1", Text: "t"}),
		fullJSON: `{"seq":3,"messageId":"m1","createdAt":1700000000,"replierSessionId":"svc:bot","text":"<pong> & \"more\"",` +
			`"pushOutcome":"pushed","pushedMessageId":"m2"}`,
		bareJSON: `{"seq":1,"messageId":"m1","createdAt":0,"replierSessionId":"","text":"t","pushOutcome":null,"pushedMessageId":null}`,
	},
	{
		name: "ReplyResult", // §4.1 reply: pushOutcome/pushedMessageId null without a push
		full: ReplyResultOf(bus.ReplyResult{MessageID: "m1", Seq: 2, SessionRef: "svc:bot", ReplierSessionID: "svc:bot", CreatedAt: 5, Text: "ok",
			PushOutcome: ledger.SenderGone}),
		bare: ReplyResultOf(bus.ReplyResult{MessageID: "m1", Seq: 1, Text: "ok"}),
		fullJSON: `{"messageId":"m1","seq":2,"sessionRef":"svc:bot","replierSessionId":"svc:bot","createdAt":5,"text":"ok",` +
			`"pushOutcome":"sender_gone","pushedMessageId":null}`,
		bareJSON: `{"messageId":"m1","seq":1,"sessionRef":"","replierSessionId":"","createdAt":0,"text":"ok","pushOutcome":null,"pushedMessageId":null}`,
	},
	{
		name: "Message", // §3.6: returnHarness/returnSessionId null without a return address, report only when known, replies a list
		full: MessageOf(bus.Message{ID: "m1", CreatedAt: 9, SessionID: "c1", FromName: "xmsg@h · anon:x", Bytes: 4, Outcome: ledger.Held,
			RecipientHarness: "claude", ReturnHarness: "pi", ReturnSessionID: "pi:1", PushReplies: true, ThreadID: "m1", Report: "held",
			Replies: []bus.Reply{{Seq: 1, MessageID: "m1", Text: "r", PushOutcome: ledger.PushDisabled}}}),
		bare: MessageOf(bus.Message{ID: "m2", Outcome: ledger.Delivered, RecipientHarness: "svc"}),
		fullJSON: `{"id":"m1","createdAt":9,"sessionId":"c1","fromName":"xmsg@h · anon:x","bytes":4,"outcome":"held",` +
			`"recipientHarness":"claude","returnHarness":"pi","returnSessionId":"pi:1","pushReplies":true,"threadId":"m1","report":"held",` +
			`"replies":[{"seq":1,"messageId":"m1","createdAt":0,"replierSessionId":"","text":"r","pushOutcome":"disabled","pushedMessageId":null}]}`,
		bareJSON: `{"id":"m2","createdAt":0,"sessionId":"","fromName":"","bytes":0,"outcome":"delivered","recipientHarness":"svc",` +
			`"returnHarness":null,"returnSessionId":null,"pushReplies":false,"threadId":"","replies":[]}`,
	},
	{
		name:     "Deliver", // §4.2: origin only for svc, {"kind":"anonymous"} when none was recorded; §4.1 poll and peek
		full:     DeliverOf(bus.Queued{ID: "m1", FromName: "xmsg@h · anon:x", Text: "hi\n<b>", Envelope: "[xmsg] ...", Origin: json.RawMessage(`{"kind":"local","harness":"pi","sessionId":"pi:1"}`)}, true),
		bare:     DeliverOf(bus.Queued{ID: "m2", Origin: json.RawMessage(`{"kind":"local"}`)}, false),
		fullJSON: `{"action":"deliver","messageId":"m1","fromName":"xmsg@h · anon:x","text":"hi\n<b>","envelope":"[xmsg] ...","origin":{"kind":"local","harness":"pi","sessionId":"pi:1"}}`,
		bareJSON: `{"action":"deliver","messageId":"m2","fromName":"","text":"","envelope":""}`,
	},
	{
		name:     "Deliver, anonymous", // §4.2: a service's message queued without an origin
		full:     DeliverOf(bus.Queued{ID: "m3"}, true),
		bare:     DeliverOf(bus.Queued{ID: "m3"}, false),
		fullJSON: `{"action":"deliver","messageId":"m3","fromName":"","text":"","envelope":"","origin":{"kind":"anonymous"}}`,
		bareJSON: `{"action":"deliver","messageId":"m3","fromName":"","text":"","envelope":""}`,
	},
}

// TestShapes: each shape goes out as the bytes docs/protocol.md gives it (names, order, null
// and left-out fields), in the one encoding the transports use (jsonline.Encode: no HTML
// escaping). Mutants tried: ReplyOf writing "" for no push outcome instead of null: red;
// Session's registered without omitempty: red; MessageOf leaving a message without replies
// as null: red; SessionOf passing an empty time through: red.
func TestShapes(t *testing.T) {
	for _, s := range shapes {
		for _, c := range []struct {
			v    any
			want string
		}{{s.full, s.fullJSON}, {s.bare, s.bareJSON}} {
			got, err := jsonline.Encode(c.v)
			if err != nil || string(got) != c.want+"\n" {
				t.Errorf("%s: got %s (%v)\nwant %s", s.name, got, err, c.want)
			}
		}
	}
}

// TestShapesDocumented: the keys of each shape, in order, are the ones docs/protocol.md lists
// for it, wherever it lists them (a delivery in §3.5, §4.1 and §8.3). Mutant tried: a key
// renamed in Reply's tag (pushedMessageID): red.
func TestShapesDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	quoted := regexp.MustCompile(`"([A-Za-z]+)"(?::"[^"]*")?`) // a key, and its example value if it is a string
	ticked := regexp.MustCompile("`([A-Za-z]+)`")
	// between is doc's text in section sec after the first from, up to the first to.
	between := func(sec, from, to string) string {
		t.Helper()
		i := strings.Index(doc, "\n### "+sec+" ")
		if i < 0 {
			t.Fatalf("protocol.md has no §%s", sec)
		}
		body := doc[i+1:]
		if j := strings.Index(body, "\n### "); j >= 0 {
			body = body[:j]
		}
		a := strings.Index(body, from)
		if a < 0 {
			t.Fatalf("protocol.md §%s has no %q", sec, from)
		}
		body = body[a+len(from):]
		b := strings.Index(body, to)
		if b < 0 {
			t.Fatalf("protocol.md §%s has no %q after %q", sec, to, from)
		}
		return body[:b]
	}
	names := func(re *regexp.Regexp, s string) []string {
		var out []string
		for _, m := range re.FindAllStringSubmatch(s, -1) {
			out = append(out, m[1])
		}
		return out
	}
	byName := map[string]any{}
	for _, s := range shapes {
		byName[s.name] = s.full
	}
	for _, c := range []struct {
		shape, where string
		keys         []string
	}{
		{"Delivery", "§3.5", names(quoted, between("3.5", "Response 202:\n```", "```"))},
		{"Delivery", "§4.1 send", names(quoted, between("4.1", "success `{\"status\":\"ok\",\"delivery\":{", "}"))},
		{"Delivery", "§8.3 step 10", names(quoted, between("8.3", "10. 202 `{", "}"))},
		{"Session", "§3.3", names(ticked, between("3.3", "- Session object:", "Never"))},
		{"RemoteSession", "§3.3 ?peer=", strings.Split(between("3.3", "set of each entry: `", "`"), ", ")},
		{"Reply", "§3.7", names(quoted, between("3.7", "Reply object: `{", "}`"))},
		{"ReplyResult", "§4.1 reply", names(quoted, between("4.1", `{"status":"ok","reply":{`, "}"))},
		{"Message", "§3.6", names(quoted, between("3.6", "200:\n```", "```"))},
		{"Deliver", "§4.2", names(quoted, between("4.2", "unacknowledged message for this session:", "}`"))},
	} {
		if got := keys(t, byName[c.shape]); !slices.Equal(got, c.keys) {
			t.Errorf("%s has keys %v; protocol.md %s lists %v", c.shape, got, c.where, c.keys)
		}
	}
}

// keys are the top-level keys of v's JSON, in order.
func keys(t *testing.T, v any) []string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.Token() // {
	var out []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestLists: a list keeps what it was: nil is null, empty is [] (the session list of a bus with
// none is [], never null).
func TestLists(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{SessionsOf(nil), "null"}, {SessionsOf([]bus.Session{}), "[]"},
		{RemoteSessionsOf(nil), "null"}, {RemoteSessionsOf([]bus.RemoteSession{}), "[]"},
		{RepliesOf(nil), "null"}, {RepliesOf([]bus.Reply{}), "[]"},
		{RepliesOf([]bus.Reply{{Seq: 1}, {Seq: 2}}), `[{"seq":1,"messageId":"","createdAt":0,"replierSessionId":"","text":"","pushOutcome":null,"pushedMessageId":null},` +
			`{"seq":2,"messageId":"","createdAt":0,"replierSessionId":"","text":"","pushOutcome":null,"pushedMessageId":null}]`},
	} {
		if got, _ := jsonline.Encode(c.v); string(got) != c.want+"\n" {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}

// TestPeerAnswers: a peer's answer, read through its shape, is the bus's value it was made
// from (what the peer's events alone know, Harness and Peer, stays the caller's).
func TestPeerAnswers(t *testing.T) {
	d := bus.Delivery{SessionID: "svc:bot", FromName: "f", Bytes: 3, MessageID: "m", Outcome: ledger.Delivered}
	var gotD Delivery
	roundTrip(t, DeliveryOf(d), &gotD)
	if gotD.Bus() != d {
		t.Errorf("delivery: got %+v, want %+v", gotD.Bus(), d)
	}
	for _, r := range []bus.Reply{
		{Seq: 2, MessageID: "m", CreatedAt: 5, ReplierSessionID: "svc:bot", Text: "t", PushOutcome: ledger.Pushed, PushedMessageID: "p"},
		{Seq: 1, MessageID: "m", Text: "t"},
	} {
		var got Reply
		roundTrip(t, ReplyOf(r), &got)
		if got.Bus() != r {
			t.Errorf("reply: got %+v, want %+v", got.Bus(), r)
		}
	}
	// A word this node does not know reads as none.
	var odd Reply
	if err := json.Unmarshal([]byte(`{"seq":1,"pushOutcome":"teleported","pushedMessageId":null}`), &odd); err != nil {
		t.Fatal(err)
	}
	if o := odd.Bus().PushOutcome; o != ledger.NoOutcome {
		t.Errorf("unknown push outcome read as %v", o)
	}
}

func roundTrip(t *testing.T, v, into any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatal(err)
	}
}
