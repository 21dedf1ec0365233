package claude

import (
	"strings"
	"testing"

	"github.com/google/uuid"
)

const reportID = "01a24296-62ec-73f1-b938-c2e9503f33c5"

func TestParseReport(t *testing.T) {
	line := func(status, extra string) []byte {
		return []byte(`{"type":"control","action":"peer_message_status","status":"` + status + `","reason":"x","from":"uds:/a/1.sock","orig_msg_id":"` + reportID + `"` + extra + `}`)
	}
	cases := []struct {
		in     []byte
		want   Report
		ok     bool
		hasErr bool
	}{
		{line("held", ""), Report{Status: ReportHeld, MessageID: reportID}, true, false},
		{line("expired", `,"status_detail":"refused"`), Report{Status: ReportRefused, MessageID: reportID, Detail: "refused"}, true, false},
		{line("dropped", `,"drop_reason":"queue-full"`), Report{Status: ReportDropped, MessageID: reportID, Detail: "queue-full"}, true, false},
		{[]byte(`{"type":"user","message":{"role":"user","content":"hi"}}`), Report{}, false, false},
		{line("written", ""), Report{}, false, true},
		{line("approved", ""), Report{}, false, true},
		{[]byte(`{"type":"control","action":"peer_message_status","status":"held","orig_msg_id":"../x"}`), Report{}, false, true},
		{[]byte(`[]`), Report{}, false, true},
	}
	for _, c := range cases {
		got, ok, err := ParseReport(c.in)
		if got != c.want || ok != c.ok || (err != nil) != c.hasErr {
			t.Errorf("ParseReport(%.80s) = %+v, %v, %v; want %+v, %v, err %v", c.in, got, ok, err, c.want, c.ok, c.hasErr)
		}
	}
}

func TestReportDir(t *testing.T) {
	if got := ReportDir("/run/user/1000", 1000); got != "/run/user/1000/cc-socks" {
		t.Errorf("ReportDir = %s", got)
	}
	if got := ReportDir("/"+strings.Repeat("d", 100), 7); got != "/tmp/cc-socks-7" {
		t.Errorf("ReportDir(long) = %s, want /tmp/cc-socks-7", got)
	}
	if got := ReportDir("", 7); got != "/tmp/cc-socks-7" {
		t.Errorf("ReportDir(unset) = %s", got)
	}
	// A name of at most 16 hex digits is what Claude Code accepts in its default directories.
	if n := strings.TrimSuffix(ReportName(1<<22), ".sock"); len(n) != 16 || strings.Trim(n, "0123456789abcdef") != "" {
		t.Errorf("ReportName = %s", n)
	}
}

func FuzzParseReport(f *testing.F) {
	f.Add([]byte(`{"type":"control","action":"peer_message_status","status":"held","orig_msg_id":"` + reportID + `"}`))
	f.Add([]byte(`{"type":"control","action":"peer_message_status","status":"expired","status_detail":"refused","orig_msg_id":"` + reportID + `"}`))
	f.Add([]byte(`{"type":"user"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, ok, err := ParseReport(line)
		if err != nil || !ok {
			return
		}
		// What is accepted names one known status and a canonical message id.
		if !reports[r.Status] {
			t.Fatalf("accepted status %q", r.Status)
		}
		if u, err := uuid.Parse(r.MessageID); err != nil || u.String() != r.MessageID {
			t.Fatalf("accepted id %q", r.MessageID)
		}
	})
}
