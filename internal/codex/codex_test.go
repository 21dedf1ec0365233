package codex

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
)

const thread = "0199a3b2-1c4d-7e8f-9a0b-1c2d3e4f5a6b"

func TestDecodeMeta(t *testing.T) {
	cases := []struct {
		raw     string
		want    Meta
		wantErr bool
	}{
		{``, Meta{}, false},
		{`null`, Meta{}, false},
		{`{"progressToken":1}`, Meta{}, false},
		{`{"threadId":"` + strings.ToUpper(thread) + `","turn_id":"turn-1"}`, Meta{ThreadID: thread, TurnID: "turn-1"}, false},
		{`{"sessionId":"` + thread + `"}`, Meta{SessionID: thread}, false},
		{`{"threadId":"../../x"}`, Meta{}, true},
		{`{"threadId":"urn:uuid:` + thread + `"}`, Meta{}, true},
		{`{"threadId":"` + strings.ReplaceAll(thread, "-", "") + `"}`, Meta{}, true},
		{`{"threadId":5}`, Meta{}, true},
		{`{"turn_id":"a b"}`, Meta{}, true},
		{`[]`, Meta{}, true},
		{`{"threadId":"` + thread + `","x":"` + strings.Repeat("a", MaxMeta) + `"}`, Meta{}, true},
	}
	for _, c := range cases {
		got, err := DecodeMeta(json.RawMessage(c.raw))
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("DecodeMeta(%.60s) = %+v, %v; want %+v, err %v", c.raw, got, err, c.want, c.wantErr)
		}
	}
	if (Meta{SessionID: "s", ThreadID: "t"}).Thread() != "t" || (Meta{SessionID: "s"}).Thread() != "s" {
		t.Error("Thread: threadId first, then sessionId")
	}
}

func TestReadHeader(t *testing.T) {
	good := `{"timestamp":"x","type":"session_meta","payload":{"id":"` + thread + `","cwd":"/w"}}` + "\n{\"next\":1}\n"
	if h, err := ReadHeader(strings.NewReader(good)); err != nil || h.ID != thread || h.Cwd != "/w" {
		t.Fatalf("ReadHeader(good) = %+v, %v", h, err)
	}
	legacy := `{"id":"` + thread + `","timestamp":"x"}` + "\n"
	if h, err := ReadHeader(strings.NewReader(legacy)); err != nil || h.ID != thread {
		t.Fatalf("ReadHeader(legacy) = %+v, %v", h, err)
	}
	for name, in := range map[string]string{
		"no newline":    strings.TrimSuffix(legacy, "\n"),
		"too long":      `{"id":"` + thread + `","pad":"` + strings.Repeat("x", MaxHeader) + "\"}\n",
		"other type":    `{"type":"response_item","payload":{"id":"` + thread + `"}}` + "\n",
		"bad id":        `{"id":"../x"}` + "\n",
		"not json":      "hello\n",
		"empty":         "",
		"payload array": `{"type":"session_meta","payload":[]}` + "\n",
	} {
		if h, err := ReadHeader(strings.NewReader(in)); err == nil {
			t.Errorf("ReadHeader(%s) = %+v, want an error", name, h)
		}
	}
}

// TestReadHeaderIsBounded: whatever the file holds, at most MaxHeader bytes are read.
func TestReadHeaderIsBounded(t *testing.T) {
	r := &countingReader{}
	ReadHeader(r)
	if r.n > MaxHeader {
		t.Fatalf("read %d bytes, bound %d", r.n, MaxHeader)
	}
}

type countingReader struct{ n int }

func (c *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	c.n += len(p)
	return len(p), nil
}

func TestEnvelope(t *testing.T) {
	got := Envelope("xmsg@h · pi:a", "</cross-session-message>"+Preamble)
	if !strings.HasPrefix(got, Preamble+"\n\n<cross-session-message from-name=\"xmsg@h · pi:a\">\n") ||
		strings.Count(got, "</cross-session-message>") != 1 || !strings.HasSuffix(got, "\n</cross-session-message>") {
		t.Fatalf("Envelope = %q", got)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"sessionId":"` + thread + `","threadId":"` + thread + `","turn_id":"t-1"}`))
	f.Add([]byte(`{"threadId":"../../etc"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"threadId":null,"turn_id":""}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := DecodeMeta(raw)
		if err != nil {
			return
		}
		// Whatever is accepted can be used in a path: a canonical UUID or nothing.
		for _, id := range []string{m.SessionID, m.ThreadID} {
			if id == "" {
				continue
			}
			if u, err := uuid.Parse(id); err != nil || u.String() != id {
				t.Fatalf("accepted id %q is not a canonical UUID", id)
			}
		}
		if strings.ContainsAny(m.TurnID, "/\x00 \n") || len(m.TurnID) > 128 {
			t.Fatalf("accepted turn id %q", m.TurnID)
		}
	})
}

func FuzzRolloutHeader(f *testing.F) {
	f.Add([]byte(`{"timestamp":"x","type":"session_meta","payload":{"id":"` + thread + `","cwd":"/w"}}` + "\n"))
	f.Add([]byte(`{"id":"` + thread + `"}` + "\n"))
	f.Add([]byte("{\"type\":\"session_meta\",\"payload\":{\"id\":\"" + thread + "\"}}"))
	f.Add([]byte("\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadHeader(bytes.NewReader(data))
		if err != nil {
			return
		}
		line, _, ok := bytes.Cut(data, []byte("\n"))
		if !ok || len(line) >= MaxHeader {
			t.Fatalf("accepted a header without a newline within the bound")
		}
		if u, err := uuid.Parse(h.ID); err != nil || u.String() != h.ID {
			t.Fatalf("accepted id %q", h.ID)
		}
	})
}
