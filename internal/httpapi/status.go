package httpapi

import "net/http"

// statuses are the HTTP statuses of the protocol's error codes (docs/protocol.md §3.1). The
// bus names refusals by code only; the status is an HTTP matter, decided here for http.sock
// and the federation listener alike.
var statuses = map[string]int{
	"bad_request":          http.StatusBadRequest,
	"bad_sender":           http.StatusBadRequest,
	"unregistered":         http.StatusBadRequest,
	"unknown_peer":         http.StatusBadRequest,
	"no_forward":           http.StatusBadRequest,
	"not_recipient":        http.StatusForbidden,
	"op_denied":            http.StatusForbidden,
	"peer_rejected":        http.StatusForbidden,
	"unattested":           http.StatusForbidden,
	"not_found":            http.StatusNotFound,
	"method_not_allowed":   http.StatusMethodNotAllowed,
	"ambiguous":            http.StatusConflict,
	"conflict":             http.StatusConflict,
	"gone":                 http.StatusGone,
	"payload_too_large":    http.StatusRequestEntityTooLarge,
	"body_too_large":       http.StatusRequestEntityTooLarge,
	"rate_limited":         http.StatusTooManyRequests,
	"internal":             http.StatusInternalServerError,
	"insecure_socket_dir":  http.StatusInternalServerError,
	"inbox_unavailable":    http.StatusBadGateway,
	"delivery_failed":      http.StatusBadGateway,
	"service_unavailable":  http.StatusServiceUnavailable,
	"hub_busy":             http.StatusServiceUnavailable,
	"credentials_stale":    http.StatusServiceUnavailable,
	"peer_unreachable":     http.StatusServiceUnavailable,
	"inbox_timeout":        http.StatusGatewayTimeout,
	"insufficient_storage": http.StatusInsufficientStorage,
}

// Status is the HTTP status of error code code; a code the table does not know (a peer's,
// say) is 500.
func Status(code string) int {
	if s, ok := statuses[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}
