package main

import (
	"strings"
	"testing"
	"time"
)

// TestMonitorLineEscapes: a name with an escape sequence, a bidirectional override or invalid
// UTF-8 reaches the terminal escaped, never as the bytes that would act on it. Mutant tried:
// printable returning its input: the ESC byte is printed.
func TestMonitorLineEscapes(t *testing.T) {
	e := &streamEvent{Time: time.Unix(0, 0), Event: "refused", From: "anon:a\x1b[2Jb", To: "x\u202ey\xffz", Transport: "http", Code: "not_found"}
	line := formatEvent(e)
	for _, bad := range []string{"\x1b", "\u202e", "\xff"} {
		if strings.Contains(line, bad) {
			t.Errorf("line %q holds %q", line, bad)
		}
	}
	for _, want := range []string{`anon:a\x1b[2Jb`, `x\u202ey\xffz`, "refused", "not_found", "http"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	if got := printable("plain · name"); got != "plain · name" {
		t.Errorf("printable changed a clean name: %q", got)
	}
	if got := formatEvent(&streamEvent{Event: "missed", Count: 7}); got != "# missed 7 events\n" {
		t.Errorf("missed line %q", got)
	}
}
