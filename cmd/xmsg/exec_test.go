package main

import (
	"errors"
	"strings"
	"testing"
)

// TestExecUsage: a bad command line is a usage error before anything is asked or run.
func TestExecUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--", "true"},                           // no --credential
		{"--credential", "tok"},                  // no command
		{"--credential", "tok", "--"},            // no command
		{"--credential", "../tok", "--", "true"}, // bad name
		{"--credential", "tok=1BAD", "--", "true"},            // bad variable
		{"--credential", "tok=A-B", "--", "true"},             // bad variable
		{"--credential", "tok", "--fd", "2", "--", "true"},    // stdio
		{"--credential", "tok", "--fd", "x", "--", "true"},    // not a number
		{"--credential", "tok", "--bogus", "1", "--", "true"}, // unknown flag
		{"tok", "--", "true"},                                 // not a flag
	} {
		var ue usageError
		if err := execCmd(args); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

func TestDefaultCredentialEnv(t *testing.T) {
	for in, want := range map[string]string{"gh-token": "GH_TOKEN_FILE", "a.b_c": "A_B_C_FILE", "X": "X_FILE"} {
		if got := defaultCredentialEnv(in); got != want || !validEnvName(got) {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	env := setEnv([]string{"A=1", "TOK=old", "B=2", "TOK=older"}, "TOK", "/proc/self/fd/3")
	if got := strings.Join(env, " "); got != "A=1 B=2 TOK=/proc/self/fd/3" {
		t.Errorf("setEnv: %s", got)
	}
}
