package ledger

import "net/http"

// Code is one of the protocol's error codes (docs/protocol.md §3.1). It is a closed set: the
// only values are the constants below, each with its wire word and HTTP status in one table,
// so a code that is not in the table cannot be written (a string is not a Code) and a
// transport never decides a status of its own.
type Code uint8

// The codes, in the table's order. Internal is the zero value's neighbour on purpose: the
// zero Code is Internal too, so a refusal built without a code fails closed as a 500.
const (
	Internal Code = iota
	BadRequest
	BadSender
	Unregistered
	UnknownPeer
	NoForward
	NotRecipient
	OpDenied
	PeerRejected
	Unattested
	NotFound
	MethodNotAllowed
	Ambiguous
	Conflict
	Gone
	PayloadTooLarge
	BodyTooLarge
	RateLimited
	InsecureSocketDir
	InboxUnavailable
	DeliveryFailed
	ServiceUnavailable
	HubBusy
	CredentialsStale
	PeerUnreachable
	InboxTimeout
	InsufficientStorage
	numCodes
)

// codes is the one table of wire words and HTTP statuses (docs/protocol.md §3.1).
var codes = [numCodes]struct {
	word   string
	status int
}{
	Internal:            {"internal", http.StatusInternalServerError},
	BadRequest:          {"bad_request", http.StatusBadRequest},
	BadSender:           {"bad_sender", http.StatusBadRequest},
	Unregistered:        {"unregistered", http.StatusBadRequest},
	UnknownPeer:         {"unknown_peer", http.StatusBadRequest},
	NoForward:           {"no_forward", http.StatusBadRequest},
	NotRecipient:        {"not_recipient", http.StatusForbidden},
	OpDenied:            {"op_denied", http.StatusForbidden},
	PeerRejected:        {"peer_rejected", http.StatusForbidden},
	Unattested:          {"unattested", http.StatusForbidden},
	NotFound:            {"not_found", http.StatusNotFound},
	MethodNotAllowed:    {"method_not_allowed", http.StatusMethodNotAllowed},
	Ambiguous:           {"ambiguous", http.StatusConflict},
	Conflict:            {"conflict", http.StatusConflict},
	Gone:                {"gone", http.StatusGone},
	PayloadTooLarge:     {"payload_too_large", http.StatusRequestEntityTooLarge},
	BodyTooLarge:        {"body_too_large", http.StatusRequestEntityTooLarge},
	RateLimited:         {"rate_limited", http.StatusTooManyRequests},
	InsecureSocketDir:   {"insecure_socket_dir", http.StatusInternalServerError},
	InboxUnavailable:    {"inbox_unavailable", http.StatusBadGateway},
	DeliveryFailed:      {"delivery_failed", http.StatusBadGateway},
	ServiceUnavailable:  {"service_unavailable", http.StatusServiceUnavailable},
	HubBusy:             {"hub_busy", http.StatusServiceUnavailable},
	CredentialsStale:    {"credentials_stale", http.StatusServiceUnavailable},
	PeerUnreachable:     {"peer_unreachable", http.StatusServiceUnavailable},
	InboxTimeout:        {"inbox_timeout", http.StatusGatewayTimeout},
	InsufficientStorage: {"insufficient_storage", http.StatusInsufficientStorage},
}

// String is the code's wire word.
func (c Code) String() string {
	if c >= numCodes {
		return codes[Internal].word
	}
	return codes[c].word
}

// Status is the HTTP status the code is answered with on http.sock and the federation wire.
func (c Code) Status() int {
	if c >= numCodes {
		return http.StatusInternalServerError
	}
	return codes[c].status
}

// Server reports whether the code is the daemon's fault or its resources' (a 5xx), not the
// request's: such refusals are logged at error level.
func (c Code) Server() bool { return c.Status() >= 500 }

// MarshalText writes the wire word.
func (c Code) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads a wire word; a word the table does not know (a newer peer's) reads as
// Internal, which is what an unknown code has always meant here.
func (c *Code) UnmarshalText(b []byte) error {
	*c, _ = ParseCode(string(b))
	return nil
}

// ParseCode is the code of a wire word; ok is false (and the code Internal) for a word the
// table does not know.
func ParseCode(word string) (c Code, ok bool) {
	for i := range codes {
		if codes[i].word == word {
			return Code(i), true
		}
	}
	return Internal, false
}

// Codes are all codes, in table order (docs and tests walk them).
func Codes() []Code {
	out := make([]Code, numCodes)
	for i := range out {
		out[i] = Code(i)
	}
	return out
}
