// Package agy attests Antigravity (`agy`) sessions and delivers to them.
//
// An agy session is a conversation that a trusted Antigravity process is present in. The
// proof comes from the kernel: an ancestor of the caller runs one of the trusted executables
// (`--agy-exe`, canonical /proc/<pid>/exe) and holds an open descriptor of
// <presence_dir>/<conversation_id>.lock, matched by device and inode against the file opened
// beneath the presence directory with no symlink on the path, and /proc/locks shows an
// exclusive FLOCK on that same file. Conversation ids are validated (UUIDs) before any path is
// built from them.
//
// Credentials (the language server address and CSRF token) arrive on register.sock from the
// agy hook, are kept in memory only and are never logged. Delivery runs
// `agy agentapi send-message --title <from> <conversation> <envelope>` as an argv vector with
// the credentials only in the child's environment (see Runner).
package agy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// ValidConversation checks a conversation id (a UUID in its 36-character form) and returns it
// in lowercase.
func ValidConversation(s string) (string, error) {
	if len(s) != 36 {
		return "", errors.New("agy: conversation id is not a UUID")
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", errors.New("agy: conversation id is not a UUID")
	}
	return u.String(), nil
}

// Credentials let the daemon reach one conversation through agentapi.
type Credentials struct {
	Conversation string
	LSAddress    string
	CSRFToken    string
}

// Limits of credential fields: they become environment values of a child process.
const (
	maxAddress = 256
	maxToken   = 1024
)

// DecodeCredentials parses the credential frame {"conversation_id","ls_address","csrf_token"}
// (camelCase aliases accepted) and validates every field: the conversation id is a UUID, the
// address and token are printable ASCII without spaces and bounded.
func DecodeCredentials(obj map[string]json.RawMessage) (Credentials, error) {
	get := func(names ...string) (string, error) {
		for _, n := range names {
			raw, ok := obj[n]
			if !ok || string(raw) == "null" {
				continue
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", fmt.Errorf("invalid json: field '%s' must be a string", n)
			}
			return s, nil
		}
		return "", nil
	}
	conv, err := get("conversation_id", "conversationId")
	if err != nil {
		return Credentials{}, err
	}
	addr, err := get("ls_address", "lsAddress")
	if err != nil {
		return Credentials{}, err
	}
	token, err := get("csrf_token", "csrfToken")
	if err != nil {
		return Credentials{}, err
	}
	if conv == "" || addr == "" || token == "" {
		return Credentials{}, errors.New("conversation_id, ls_address and csrf_token are required")
	}
	if conv, err = ValidConversation(conv); err != nil {
		return Credentials{}, errors.New("conversation_id is not a valid conversation id")
	}
	if !token68(addr, maxAddress) {
		return Credentials{}, errors.New("ls_address is not a valid address")
	}
	if !token68(token, maxToken) {
		return Credentials{}, errors.New("csrf_token is not a valid token")
	}
	return Credentials{Conversation: conv, LSAddress: addr, CSRFToken: token}, nil
}

// token68 reports whether s is 1..max printable ASCII characters with no space (nothing that
// could split an environment entry or a log line).
func token68(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' })
}
