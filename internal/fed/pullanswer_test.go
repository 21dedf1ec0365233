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
