package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
)

// Claude Code reports what became of a peer message it holds for its user's decision: a
// `peer_message_status` control line, written to the reply address the message named
// (`from`, "uds:<path>") and keyed by the message's `msg_id` (docs/protocol.md §6.3). xmsg
// names a socket of its own there, so that it learns when a session holds its mail and
// what the person decided.

// The statuses a session reports, and "written": the line reached the inbox and no report
// has come (an accepted message gets none; Claude Code reports only what it holds).
const (
	ReportWritten   = "written"
	ReportHeld      = "held"
	ReportDelivered = "delivered"
	ReportDenied    = "denied"
	ReportExpired   = "expired"
	ReportRefused   = "refused"
	ReportDropped   = "dropped"
)

// reports are the statuses a line may carry.
var reports = map[string]bool{ReportHeld: true, ReportDelivered: true, ReportDenied: true, ReportExpired: true, ReportRefused: true, ReportDropped: true}

// Final reports whether a report settles the message (every report but held).
func Final(report string) bool {
	return report != "" && report != ReportWritten && report != ReportHeld
}

// MaxReportLine bounds one line read from a reporting session.
const MaxReportLine = 64 << 10

// Report is one peer_message_status line.
type Report struct {
	Status    string // one of the Report* statuses but written
	MessageID string // the orig_msg_id: the xmsg message id (a UUID, lowercase)
	Detail    string // drop_reason or status_detail, when given
}

// ParseReport parses a line from a session. ok is false for a line of another kind (a user
// message a session's model sent to the reply address: not a report, and ignored).
func ParseReport(line []byte) (r Report, ok bool, err error) {
	var v struct {
		Type         string `json:"type"`
		Action       string `json:"action"`
		Status       string `json:"status"`
		StatusDetail string `json:"status_detail"`
		DropReason   string `json:"drop_reason"`
		OrigMsgID    string `json:"orig_msg_id"`
	}
	if err := json.Unmarshal(line, &v); err != nil {
		return Report{}, false, errors.New("claude: report is not a JSON object")
	}
	if v.Type != "control" || v.Action != "peer_message_status" {
		return Report{}, false, nil
	}
	if !reports[v.Status] {
		return Report{}, false, fmt.Errorf("claude: report status %q unknown", v.Status)
	}
	id, err := uuid.Parse(v.OrigMsgID)
	if err != nil || len(v.OrigMsgID) != 36 {
		return Report{}, false, errors.New("claude: report orig_msg_id is not a message id")
	}
	// An expiry of a refused message is the refusal (Claude Code reads it so too).
	if v.Status == ReportExpired && v.StatusDetail == ReportRefused {
		v.Status = ReportRefused
	}
	detail := v.DropReason
	if detail == "" {
		detail = v.StatusDetail
	}
	return Report{Status: v.Status, MessageID: id.String(), Detail: detail}, true, nil
}

// ReportDir is the directory Claude Code itself puts inbox sockets in for the environment
// runtimeDir ($XDG_RUNTIME_DIR) and uid: <runtimeDir>/cc-socks when the socket path fits in
// 103 bytes, else /tmp/cc-socks-<uid>. A session accepts a reply address in the directory
// of its own socket, or in one of these with a name of at most 16 hex digits.
func ReportDir(runtimeDir string, uid int) string {
	if runtimeDir != "" {
		d := filepath.Join(runtimeDir, "cc-socks")
		if len(filepath.Join(d, ReportName(1<<22))) <= 103 {
			return d
		}
	}
	return fmt.Sprintf("/tmp/cc-socks-%d", uid)
}

// ReportName is the file name of the reply socket of the daemon with pid: "786d7367" (xmsg)
// and the pid in 8 hex digits, so it is never a session's <pid>.sock.
func ReportName(pid int) string { return fmt.Sprintf("786d7367%08x.sock", pid) }

// ReportPath is ReportDir/ReportName for this process.
func ReportPath(runtimeDir string) string {
	return filepath.Join(ReportDir(runtimeDir, os.Getuid()), ReportName(os.Getpid()))
}

// Address is the reply address naming the socket at path, as a line's `from`.
func Address(path string) string { return "uds:" + path }

// ValidAddress reports whether path can be named as a reply address (an absolute path of
// characters Claude Code accepts there, ending in .sock).
func ValidAddress(path string) bool {
	return filepath.IsAbs(path) && strings.HasSuffix(path, ".sock") && !strings.ContainsAny(path, " \t\n\"\\")
}
