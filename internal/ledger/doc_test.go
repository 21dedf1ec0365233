package ledger

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestCodesDocumented: the code table agrees with docs/protocol.md §3.1 for every code the doc
// lists (bad_request's 403 and 415 rows are the TCP listener's own refusals), and the doc
// lists every code of the table. Mutant tried: not_found answered 400 in the table: red.
func TestCodesDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i := strings.Index(doc, "### 3.1 ")
	j := strings.Index(doc[i:], "\n### ")
	row := regexp.MustCompile("(?m)^\\| (\\d{3}) \\| (.+?) \\|")
	word := regexp.MustCompile("`([a-z_]+)`")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(doc[i:i+j], -1) {
		status, _ := strconv.Atoi(m[1])
		for _, w := range word.FindAllStringSubmatch(m[2], -1) {
			documented[w[1]] = true
			if w[1] == "bad_request" && status != 400 {
				continue
			}
			c, ok := ParseCode(w[1])
			if !ok {
				t.Errorf("docs/protocol.md §3.1 lists %q, which the code table lacks", w[1])
				continue
			}
			if c.Status() != status {
				t.Errorf("%s answers %d, docs/protocol.md §3.1 says %d", w[1], c.Status(), status)
			}
		}
	}
	for _, c := range Codes() {
		if !documented[c.String()] {
			t.Errorf("code %q is not in docs/protocol.md §3.1", c)
		}
	}
}
