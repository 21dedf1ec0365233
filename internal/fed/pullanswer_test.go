package fed

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/xmsg/xmsg/internal/hub"
)

// TestPullAnswerIsWriteJSON: the pull's answer written from the rows' wire JSON is, byte for
// byte, what writeJSON writes for the same PullAnswer, so a leaf reads it the same; with
// rejects and without, with no rows and with several.
func TestPullAnswerIsWriteJSON(t *testing.T) {
	rows := []hub.Row{
		{ID: "a", Origin: json.RawMessage(`{"kind":"fed","host":"hub","principal":"claude:<x>"}`), Body: "hi <&> \u2028", To: "svc:bot", CreatedAt: 1},
		{ID: "b", Origin: json.RawMessage(`{"kind":"anonymous"}`), Body: "", To: "bot", Principal: json.RawMessage(`{"harness":"svc","name":"m"}`), PushReplies: true, ThreadID: "t", CreatedAt: 2},
	}
	for _, c := range []struct {
		acked, rejected int
		rows            []hub.Row
	}{{0, 0, nil}, {3, 0, rows[:1]}, {1, 2, rows}} {
		var wire []hub.Wire
		for _, r := range c.rows {
			w, err := hub.EncodeRow(r)
			if err != nil {
				t.Fatal(err)
			}
			wire = append(wire, hub.Wire{ID: r.ID, JSON: w})
		}
		ans := PullAnswer{Acked: c.acked, Rejected: c.rejected, Rows: append([]hub.Row{}, c.rows...)}
		rec := httptest.NewRecorder()
		writeJSON(rec, 200, ans)
		if got := appendPullAnswer(nil, c.acked, c.rejected, wire); !bytes.Equal(got, rec.Body.Bytes()) {
			t.Errorf("appendPullAnswer = %s\nwriteJSON      = %s", got, rec.Body.Bytes())
		}
	}
}

// TestQuickPullAnswerIsUnmarshal: the leaf's own pass over a pull's answer reads what
// json.Unmarshal reads, for answers as this hub writes them (which it must take) and for
// others (which it may leave to json.Unmarshal, never read otherwise). Mutants tried: str
// taking an escaped string as it is: red; raw not checking what valueEnd spans: red.
func TestQuickPullAnswerIsUnmarshal(t *testing.T) {
	rows := []hub.Row{
		{ID: "a", Origin: json.RawMessage(`{"kind":"fed","host":"hub","principal":"claude:<x>"}`), Body: "hi <&> \u2028 \"q\" \\ \n \x01 é", To: "svc:bot", CreatedAt: 1},
		{ID: "b", Origin: nil, Body: "", To: "bot", Principal: json.RawMessage(`{"harness":"svc","name":"m","n":[1,2.5e3,{"x":null}]}`), PushReplies: true, ThreadID: "t\u00e9", CreatedAt: -2},
	}
	var wire []hub.Wire
	for _, r := range rows {
		w, err := hub.EncodeRow(r)
		if err != nil {
			t.Fatal(err)
		}
		wire = append(wire, hub.Wire{ID: r.ID, JSON: w})
	}
	ours := [][]byte{appendPullAnswer(nil, 0, 0, nil), appendPullAnswer(nil, 3, 1, wire), appendPullAnswer(nil, 1, 0, wire[1:])}
	for _, raw := range ours {
		var got PullAnswer
		if !quickPullAnswer(raw, &got) {
			t.Fatalf("quickPullAnswer left this hub's answer to json.Unmarshal: %s", raw)
		}
		samePullAnswer(t, raw, got)
	}
	for _, raw := range []string{
		`{"acked":1,"rows":[]}`, `{"rows":[],"acked":1}`, `{"acked":1, "rows":[]}`, `{"acked":01,"rows":[]}`,
		`{"acked":1.5,"rows":[]}`, `{"acked":1,"rows":[{"id":"a","origin":{"k":1},"body":"\ud800","to":"x","push_replies":true,"created_at":1}]}`,
		`{"acked":1,"rows":[{"id":"a","origin":{"k":},"body":"","to":"x","push_replies":true,"created_at":1}]}`,
		`{"acked":1,"rows":[{"id":"a","origin":"x","body":"` + "\xff" + `","to":"x","push_replies":true,"created_at":1}]}`,
		`{"acked":1,"rows":[{"id":"a","origin":{"k",1},"body":"","to":"x","push_replies":true,"created_at":1}]}`,
		`{"acked":1,"rows":[{"id":"a","origin":tru,"body":"","to":"x","push_replies":true,"created_at":1}]}`,
		`{"acked":1,"rows":[]}x`, `{"acked":99999999999999999999,"rows":[]}`,
	} {
		var got PullAnswer
		if quickPullAnswer([]byte(raw), &got) {
			samePullAnswer(t, []byte(raw), got)
		}
	}
}

func samePullAnswer(t *testing.T, raw []byte, got PullAnswer) {
	t.Helper()
	var want PullAnswer
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatalf("quickPullAnswer took %q, which json.Unmarshal refuses: %v", raw, err)
	}
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		t.Fatalf("quickPullAnswer(%q) = %s, json.Unmarshal = %s", raw, g, w)
	}
}

func FuzzQuickPullAnswer(f *testing.F) {
	f.Add([]byte(`{"acked":1,"rows":[{"id":"a","origin":{"k":1},"body":"b\n","to":"x","push_replies":true,"created_at":1}]}`), "body", []byte(`{"a":1}`), "t", int64(3))
	f.Add([]byte(`{"acked":0,"rejected":2,"rows":[]}`), "\xff\u2028<", []byte(`[1,"\u0041"]`), "", int64(-1))
	f.Fuzz(func(t *testing.T, raw []byte, body string, principal []byte, thread string, at int64) {
		var got PullAnswer
		if quickPullAnswer(raw, &got) {
			samePullAnswer(t, raw, got)
		}
		// And a row as this hub writes it is always taken.
		r := hub.Row{ID: "id", Origin: json.RawMessage(`{"kind":"fed"}`), Body: body, To: "svc:x", Principal: principal, ThreadID: thread, CreatedAt: at}
		w, err := hub.EncodeRow(r)
		if err != nil {
			return // a principal that is not JSON is never written
		}
		ans := appendPullAnswer(nil, 1, 0, []hub.Wire{{ID: r.ID, JSON: w}})
		if !quickPullAnswer(ans, &got) {
			t.Fatalf("quickPullAnswer left this hub's answer to json.Unmarshal: %s", ans)
		}
		samePullAnswer(t, ans, got)
	})
}
