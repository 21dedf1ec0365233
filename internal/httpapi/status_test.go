package httpapi

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestStatusTable: Status agrees with docs/protocol.md §3.1 for every code the table lists
// (bad_request's 403 and 415 rows are the TCP listener's own refusals, written with
// writeRefusal), and the table lists every code Status knows.
func TestStatusTable(t *testing.T) {
	raw, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i := strings.Index(doc, "### 3.1 ")
	j := strings.Index(doc[i:], "\n### ")
	row := regexp.MustCompile("(?m)^\\| (\\d{3}) \\| (.+?) \\|")
	code := regexp.MustCompile("`([a-z_]+)`")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(doc[i:i+j], -1) {
		status, _ := strconv.Atoi(m[1])
		for _, c := range code.FindAllStringSubmatch(m[2], -1) {
			documented[c[1]] = true
			if c[1] == "bad_request" && status != 400 {
				continue
			}
			if got := Status(c[1]); got != status {
				t.Errorf("Status(%q) = %d, docs/protocol.md §3.1 says %d", c[1], got, status)
			}
		}
	}
	for c := range statuses {
		if !documented[c] {
			t.Errorf("code %q has a status but is not in docs/protocol.md §3.1", c)
		}
	}
	if got := Status("no_such_code"); got != 500 {
		t.Errorf("an unknown code: %d, want 500", got)
	}
}
