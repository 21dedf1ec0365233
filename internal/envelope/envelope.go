// Package envelope holds xmsg's sender sanitizers and message envelopes
// (docs/protocol.md §5.3–§5.5 and §6). Everything here is a pure function of its
// arguments: no I/O, no clock, no randomness, so it can be fuzzed freely.
//
// Two kinds of sender names exist. An anonymous name (HTTP `from`) is a claim
// by an unauthenticated caller, so it is rejected rather than repaired when it
// contains anything that could imitate an attested badge. An attested name
// (agent.sock, svc, federation principals) was established by the daemon, so
// it is repaired, never rejected: the sender is already known and only the
// label shown to the recipient must be made harmless.
package envelope

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/jsonline"
)

// MaxSenderRunes is the maximum length of a sender badge in Unicode scalars,
// including the "xmsg@<host> · " prefix (docs/protocol.md §5.6).
const MaxSenderRunes = 64

// MaxIdempotencyKeyRunes is the maximum length of an idempotency key (§5.5).
const MaxIdempotencyKeyRunes = 128

// SenderError reports an anonymous `from` that must be refused with
// 400 bad_sender. Error returns the human-readable detail for the response.
type SenderError struct {
	Detail string
}

func (e *SenderError) Error() string { return e.Detail }

// Details of the SenderErrors returned by Anonymous.
const (
	detailSenderSeparator = "sender name must not contain ':' or '/'"
	detailSenderPrintable = "sender name must be printable ASCII"
	detailSenderEmpty     = "sender name is empty after sanitization"
)

// Anonymous sanitizes an anonymous HTTP `from` (§6.1 steps 1–4) and returns
// the clean name. The outcomes are:
//   - a name containing ':' or '/' is refused, because a badge of the form
//     "<harness>:<name>" must only ever be produced by attestation;
//   - a name with any character outside printable ASCII (tabs, newlines,
//     non-ASCII, invalid UTF-8) is refused, so look-alike characters cannot
//     imitate an attested badge either;
//   - otherwise '"', '<' and '>' are dropped, space runs collapsed, and the
//     result trimmed; an empty result is refused.
//
// Every refusal is a *SenderError. '@' is allowed, as in the original xmsg
// (docs/protocol.md §6.1): without ':' it cannot form the "<harness>:" part
// of a badge.
func Anonymous(from string) (string, error) {
	if strings.ContainsAny(from, ":/") {
		return "", &SenderError{Detail: detailSenderSeparator}
	}
	// Checked bytewise: any byte outside 0x20..0x7E is either a control
	// character or part of a non-ASCII (or invalid) sequence.
	for i := 0; i < len(from); i++ {
		if from[i] < 0x20 || from[i] > 0x7e {
			return "", &SenderError{Detail: detailSenderPrintable}
		}
	}
	var b strings.Builder
	space := false
	for i := 0; i < len(from); i++ {
		c := from[i]
		switch {
		case c == '"' || c == '<' || c == '>':
			continue
		case c == ' ':
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteByte(c)
	}
	clean := b.String()
	if clean == "" {
		return "", &SenderError{Detail: detailSenderEmpty}
	}
	return clean, nil
}

// AnonymousBadge is the fromName of an anonymous send:
// "xmsg@<host> · <clean>", truncated to MaxSenderRunes scalars (§6.1 step 5).
func AnonymousBadge(host, clean string) string {
	return truncate("xmsg@"+host+" \u00b7 "+clean, MaxSenderRunes)
}

// AttestedName sanitizes the name of an attested caller (§6.2 steps 1–4):
// it drops '"', '<', '>', CR and LF, turns every non-ASCII character (and
// every byte of invalid UTF-8) into '_', drops the remaining ASCII control
// characters, collapses whitespace runs to one space and trims. An empty
// result becomes "agent". A leading "<harness>:" is removed so the badge
// does not read "claude:claude:x" (and the remainder is trimmed again).
//
// A raw name containing '@' or '·' (U+00B7) is dropped entirely (treated as
// empty, so "agent"): those are the separators of the badge
// "xmsg@<host> · <harness>:<name>", and a label carrying them could make a
// recipient read a different host or harness into it.
func AttestedName(harness, name string) string {
	if strings.ContainsAny(name, "@\u00b7") {
		return "agent"
	}
	var b strings.Builder
	space := false
	for _, r := range name { // invalid UTF-8 yields U+FFFD, which becomes '_'
		switch {
		case r == '"' || r == '<' || r == '>' || r == '\n' || r == '\r':
			continue
		case r > unicode.MaxASCII:
			r = '_'
		case r == ' ':
			space = true
			continue
		case r < 0x20 || r == 0x7f:
			// Control characters (tab included) are dropped, not turned
			// into spaces: step 3 drops them before collapsing whitespace.
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
	}
	clean := b.String()
	if harness != "" {
		if rest, ok := strings.CutPrefix(clean, harness+":"); ok {
			clean = strings.TrimSpace(rest)
		}
	}
	if clean == "" {
		return "agent"
	}
	return clean
}

// AttestedBadge is the fromName of an attested sender:
// "xmsg@<host> · <harness>:<AttestedName(harness, name)>", truncated to
// MaxSenderRunes scalars (§6.2 step 5, §5.4 replier badge). host and harness
// come from the daemon's configuration and attestation, not from the caller.
func AttestedBadge(host, harness, name string) string {
	return truncate("xmsg@"+host+" \u00b7 "+harness+":"+AttestedName(harness, name), MaxSenderRunes)
}

// truncate cuts s after n Unicode scalars. An invalid byte counts as one
// scalar and is kept as is; the JSON encoder replaces it on the wire.
func truncate(s string, n int) string {
	count := 0
	for i := range s {
		if count == n {
			return s[:i]
		}
		count++
	}
	return s
}

// ClaudeBody is the body delivered to a Claude session for a new message
// (§5.3): the text followed by the reply hint carrying the message id.
func ClaudeBody(text, messageID string) string {
	return text + "\n\n[xmsg] message_id=" + messageID + " \u2014 reply with the xmsg reply tool"
}

// ReplyBody is the body of a reply pushed to claude, agy, or a local pi/svc
// session (§5.4). Clients parse "reply to message_id=<id>" to correlate it.
func ReplyBody(origID, newID, text string) string {
	return "[xmsg] reply to message_id=" + origID + " \u2014 message_id=" + newID +
		"; reply with the xmsg reply tool\n\n" + text
}

// Plain is the plain-text envelope of a new message for agy, pi and svc
// sessions (§5.3).
func Plain(fromName, messageID, text string) string {
	return "[xmsg] from=" + fromName + " message_id=" + messageID +
		" \u2014 reply with the xmsg reply tool\n\n" + text
}

const tagName = "cross-session-message"

// EscapeTags returns s with every '<' that starts "cross-session-message" or
// "/cross-session-message" (ASCII case-insensitive) followed by a backslash,
// so text inside an envelope can never open or close one (§6.3). Nothing
// else changes.
func EscapeTags(s string) string {
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '<' {
			continue
		}
		rest := s[i+1:]
		rest = strings.TrimPrefix(rest, "/")
		if len(rest) >= len(tagName) && strings.EqualFold(rest[:len(tagName)], tagName) {
			if b.Len() == 0 {
				b.Grow(len(s) + 8)
			}
			b.WriteString(s[last : i+1])
			b.WriteByte('\\')
			last = i + 1
		}
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// ClaudeContent is the content string of a Claude inbox envelope (§6.3):
//
//	<cross-session-message from-name="<fromName>">\n<escaped body>\n</cross-session-message>
//
// Invalid UTF-8 in either argument is first replaced by U+FFFD (as the JSON
// encoder would do anyway) so that the escaping sees the same text the
// recipient will; replacing (not dropping) cannot join a '<' to a tag name.
// In fromName '"' becomes &quot; and, although the sanitizers already drop
// '<', the tag escape is applied to it too so no caller can break the frame.
func ClaudeContent(fromName, body string) string {
	fromName = strings.ToValidUTF8(fromName, "\ufffd")
	body = strings.ToValidUTF8(body, "\ufffd")
	from := EscapeTags(strings.ReplaceAll(fromName, `"`, "&quot;"))
	return "<" + tagName + ` from-name="` + from + "\">\n" + EscapeTags(body) + "\n</" + tagName + ">"
}

type claudeMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type claudeLine struct {
	Type    string        `json:"type"`
	Message claudeMessage `json:"message"`
	// The reply address and message id Claude Code reports a held message's status to
	// and by (its peer_message_status); absent when the daemon has no reply socket.
	From  string `json:"from,omitempty"`
	MsgID string `json:"msg_id,omitempty"`
	MsgV  int    `json:"msgV,omitempty"`
}

// ClaudeLine is the line written to a Claude session's inbox socket (§6.3):
// {"type":"user","message":{"role":"user","content":ClaudeContent(...)}}
// followed by one '\n'. It comes from a real JSON encoder, which escapes
// every control character (and U+2028/U+2029), so the terminator is the
// only newline in the line whatever the body. HTML escaping is off to match
// the original xmsg byte for byte (docs/protocol.md §6.3); it parses to the same content
// either way.
func ClaudeLine(fromName, body string) ([]byte, error) {
	return ClaudeLineReported(fromName, body, "", "")
}

// ClaudeLineReported is ClaudeLine with a reply address (replyTo, "uds:<path>") and the
// message's id (msgID, a UUID), under which the session reports the status of a message it
// holds (docs/protocol.md §6.3). Either "" leaves both out: the original line.
func ClaudeLineReported(fromName, body, replyTo, msgID string) ([]byte, error) {
	l := claudeLine{Type: "user", Message: claudeMessage{Role: "user", Content: ClaudeContent(fromName, body)}}
	if replyTo != "" && msgID != "" {
		l.From, l.MsgID, l.MsgV = replyTo, msgID, 1
	}
	return jsonline.Encode(l)
}

// Details of the errors returned by ValidIdempotencyKey.
const (
	detailKeyLength  = "idempotency key must be 1 to 128 characters"
	detailKeyControl = "idempotency key must not contain control characters"
	detailKeyUTF8    = "idempotency key must be valid UTF-8"
)

type keyError string

func (e keyError) Error() string { return string(e) }

// ValidIdempotencyKey checks an idempotency key (§5.5): 1 to 128 Unicode
// scalars, valid UTF-8, no control characters. The error text is the detail
// for a 400 bad_request. Invalid UTF-8 is refused rather than repaired
// because the key is stored and compared byte for byte.
func ValidIdempotencyKey(k string) error {
	if !utf8.ValidString(k) {
		return keyError(detailKeyUTF8)
	}
	n := utf8.RuneCountInString(k)
	if n < 1 || n > MaxIdempotencyKeyRunes {
		return keyError(detailKeyLength)
	}
	for _, r := range k {
		if unicode.IsControl(r) {
			return keyError(detailKeyControl)
		}
	}
	return nil
}

// Ref is a recipient ref as the protocol spells it (docs/protocol.md §1), parsed once where
// it enters the daemon and carried as it is through every layer: local ("svc:x",
// "claude:alice", a pid, a session id) or remote ("<target>@<host>", split at the last '@').
type Ref struct {
	raw    string
	target string // the ref without "@host"; the whole ref when local
	host   string // "" when local
}

// ParseRef parses a ref. Any string is a ref: whether it names anyone is the bus's question.
func ParseRef(raw string) Ref {
	if target, host, ok := SplitRemote(raw); ok {
		return Ref{raw: raw, target: target, host: host}
	}
	return Ref{raw: raw, target: raw}
}

// String is the ref as it was written.
func (r Ref) String() string { return r.raw }

// Target is the ref without its host: the whole ref when it is local.
func (r Ref) Target() string { return r.target }

// Host is the node a remote ref names ("" for a local ref).
func (r Ref) Host() string { return r.host }

// Remote reports whether the ref names a node ("<target>@<host>").
func (r Ref) Remote() bool { return r.host != "" }

// NamesHost reports whether the ref has an '@' anywhere: an inbound envelope's target must
// not, whether or not the '@' splits into a valid remote ref (no multi-hop forwarding,
// docs/protocol.md §8.3).
func (r Ref) NamesHost() bool { return strings.IndexByte(r.raw, '@') >= 0 }

// SplitRemote splits a remote ref "<target>@<host>" at its last '@'
// (docs/protocol.md §1). ok is false when there is no '@' or either part is
// empty; the ref is then local.
func SplitRemote(ref string) (target, host string, ok bool) {
	i := strings.LastIndexByte(ref, '@')
	if i <= 0 || i == len(ref)-1 {
		return "", "", false
	}
	return ref[:i], ref[i+1:], true
}

// Name lengths: a service's (on federation and in leaf mode, §5.6) and a federation peer's
// (a DNS label, since it is also the TLS server name).
const (
	MaxServiceName = 32
	MaxPeerName    = 63
)

// ValidName reports whether n matches ^[A-Za-z0-9._-]{1,max}$: the one rule for the names
// that appear in refs (x@name, svc:name), badges and TLS server names.
func ValidName(n string, max int) bool {
	if len(n) < 1 || len(n) > max {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidServiceName reports whether n matches ^[A-Za-z0-9._-]{1,32}$, the
// shape of svc names on federation and in leaf mode (§5.6).
func ValidServiceName(n string) bool { return ValidName(n, MaxServiceName) }

// ValidPeerName reports whether n matches ^[A-Za-z0-9._-]{1,63}$, the shape of a
// federation peer's name (in refs x@name, badges and the TLS server name).
func ValidPeerName(n string) bool { return ValidName(n, MaxPeerName) }

// FedReplyPlain is the body of a reply that came over federation and is pushed to a local
// pi or svc session (§5.4): it names the replier's badge, since the header has no other
// place for it.
func FedReplyPlain(origID, badge, newID, text string) string {
	return "[xmsg] reply to message_id=" + origID + " from=" + badge + " message_id=" + newID +
		" \u2014 reply with the xmsg reply tool\n\n" + text
}
