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

// TestOneTerminalRule: every place the CLI shows a string that came from elsewhere (an error's
// detail, a name in listen or replies, a quoted target) escapes the same characters as the
// monitor: control characters, invalid UTF-8 and format characters such as a bidi override,
// which would reorder what the terminal shows. Mutant tried: escapeControl with its old,
// control-only rule (red: the override reaches the terminal).
func TestOneTerminalRule(t *testing.T) {
	for _, s := range []string{"a\u202eb", "a\x1bb", "a\xffb", "a\u0085b"} {
		for name, got := range map[string]string{"escapeControl": escapeControl(s), "quoteIfOdd": quoteIfOdd(s), "printable": printable(s)} {
			for _, bad := range []string{"\u202e", "\x1b", "\xff", "\u0085"} {
				if strings.Contains(got, bad) {
					t.Errorf("%s(%q) = %q: %q reaches the terminal", name, s, got, bad)
				}
			}
		}
	}
}
