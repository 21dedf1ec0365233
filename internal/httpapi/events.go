package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
)

// Tier is what GET /v1/events and GET /metrics ask of the daemon (docs/protocol.md §3.10,
// §3.11): its event stream's monitors, the store's replay of what it still holds, and the
// metrics exposition.
type Tier interface {
	// Watch attaches a monitor taking the events keep accepts; ledger.ErrWatchersFull
	// when the tier's bound is reached.
	// With text, the watch's items hold the text of their message or reply, where the stream
	// was handed one.
	Watch(keep func(*ledger.Event) bool, text bool) (*ledger.Watch, error)
	// MaxWatches is the tier's bound on monitors.
	MaxWatches() int
	// Replay calls fn with the events the store still holds from since on (messages as
	// sent, replies as replied), in time order, until fn returns false.
	Replay(since time.Time, keep func(*ledger.Event) bool, fn func(*ledger.Event) bool) error
	// Metrics writes the exposition (text format 0.0.4).
	Metrics(w io.Writer)
}

// MaxMonitorsPerPID bounds the monitors one client process holds at once, so that one
// process cannot take every place of the tier's bound.
const MaxMonitorsPerPID = 2

// monitorWriteTimeout bounds each write of a monitor's stream: a client that stops reading
// for this long loses its connection (its ring meanwhile drops events, never a send's time).
// It is set again before every write, so a quiet stream is never cut by the request's write
// timeout.
const monitorWriteTimeout = 60 * time.Second

// metricsContentType is the Prometheus text exposition format's.
const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

func (h *handler) metrics(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Tier == nil {
		writeError(w, &bus.Error{Code: ledger.NotFound, Detail: "this daemon serves no metrics"})
		return
	}
	var buf bytes.Buffer
	h.cfg.Tier.Metrics(&buf)
	w.Header().Set("Content-Type", metricsContentType)
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	w.Write(buf.Bytes())
}

// eventFilter is a monitor's query (docs/protocol.md §3.10).
type eventFilter struct {
	from, to, harness, peer, message string
	kinds                            map[ledger.Kind]bool
	text                             bool // text=1: the texts of messages and replies too
}

func parseEventFilter(r *http.Request) (f eventFilter, since time.Time, err error) {
	q := r.URL.Query()
	f = eventFilter{from: q.Get("from"), to: q.Get("to"), harness: q.Get("harness"), peer: q.Get("peer"), message: q.Get("message")}
	if ev := q.Get("event"); ev != "" {
		f.kinds = map[ledger.Kind]bool{}
		for _, w := range strings.Split(ev, ",") {
			k, ok := ledger.ParseKind(strings.TrimSpace(w))
			if !ok {
				return f, since, fmt.Errorf("event %q is not one of %s", w, kindWords())
			}
			f.kinds[k] = true
		}
	}
	if s := q.Get("since"); s != "" {
		if since, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return f, since, errors.New("since must be an RFC 3339 time")
		}
	}
	switch q.Get("text") {
	case "":
	case "1":
		f.text = true
	default:
		return f, since, errors.New("text must be 1 (or absent)")
	}
	return f, since, nil
}

func kindWords() string {
	var w []string
	for _, k := range ledger.Kinds() {
		w = append(w, k.String())
	}
	return strings.Join(w, ", ")
}

// keep reports whether e passes the filter: from and to match when they are part of the
// event's sender or recipient, the others exactly; message matches the message and its
// replies.
func (f *eventFilter) keep(e *ledger.Event) bool {
	switch {
	case f.kinds != nil && !f.kinds[e.Kind]:
		return false
	case f.from != "" && !strings.Contains(e.From, f.from):
		return false
	case f.to != "" && !strings.Contains(e.To, f.to):
		return false
	case f.harness != "" && e.Harness != f.harness:
		return false
	case f.peer != "" && e.Peer != f.peer:
		return false
	case f.message != "" && e.MessageID != f.message && e.InReplyTo != f.message:
		return false
	}
	return true
}

// seamKey is what identifies an event across the replay and the live stream: a message's
// kind of change, or one reply.
type seamKey struct {
	kind ledger.Kind
	id   string
	seq  uint64
}

func keyOf(e *ledger.Event) seamKey {
	if e.Kind == ledger.Replied {
		return seamKey{kind: e.Kind, id: e.InReplyTo, seq: e.ReplySeq}
	}
	return seamKey{kind: e.Kind, id: e.MessageID}
}

// events streams the tier's events as NDJSON (GET /v1/events), one line per event and a
// flush per batch, until the client hangs up or the daemon stops. With since, what the store
// still holds from then is replayed first: the watch is attached before the store is read,
// and the live events the replay already showed are dropped, so the seam has neither a gap
// nor a duplicate. A monitor that reads too slowly loses the oldest events of its ring and
// is told how many with the next batch ({"event":"missed","count":N}).
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	via := h.via("pid:" + strconv.Itoa(peerPID(r.Context())))
	refuse := func(err *bus.Error) {
		h.cfg.Bus.Events().Request(via, ledger.Watched, "events", "", ledger.Result{}, err)
		writeError(w, err)
	}
	if h.cfg.Tier == nil {
		refuse(&bus.Error{Code: ledger.NotFound, Detail: "this daemon serves no event stream"})
		return
	}
	// The stream names every message's id, sender and recipient, and a message id is all a
	// reply read asks for: it is served only where the peer gate admitted the caller as the
	// tier's own uid. The TCP listener checks no peer (any local user can connect), so it
	// refuses, as it does backups; its /metrics are counts with bounded labels only.
	if h.cfg.Socket == "tcp" {
		refuse(&bus.Error{Code: ledger.OpDenied, Detail: "the event stream is served on http.sock only (its peers are checked)"})
		return
	}
	f, since, err := parseEventFilter(r)
	if err != nil {
		refuse(&bus.Error{Code: ledger.BadRequest, Detail: err.Error()})
		return
	}
	release, ok := h.monitors.take(peerPID(r.Context()))
	if !ok {
		refuse(&bus.Error{Code: ledger.ServiceUnavailable, Detail: fmt.Sprintf("too many monitors from this process (limit %d)", MaxMonitorsPerPID)})
		return
	}
	defer release()
	watch, err := h.cfg.Tier.Watch(f.keep, f.text)
	if err != nil {
		refuse(&bus.Error{Code: ledger.ServiceUnavailable, Detail: fmt.Sprintf("too many monitors attached to this tier (limit %d)", h.cfg.Tier.MaxWatches())})
		return
	}
	defer watch.Close()
	// Who watches with text is audited as such: the texts are the tier's messages themselves.
	watching := "without text"
	if f.text {
		watching = "with text"
	}
	h.cfg.Bus.Events().Emit(ledger.Event{Kind: ledger.Watched, Request: "events", Transport: via.Transport, From: via.Actor, Detail: watching})

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flush := func() error {
		rc.SetWriteDeadline(time.Now().Add(monitorWriteTimeout))
		return rc.Flush()
	}
	// The header goes at once: a client that has it knows its watch is attached.
	if flush() != nil {
		return
	}
	ctx := hangupContext(w, r)
	var seen map[seamKey]bool
	if !since.IsZero() {
		seen = map[seamKey]bool{}
		n := 0
		err := h.cfg.Tier.Replay(since, f.keep, func(e *ledger.Event) bool {
			seen[keyOf(e)] = true
			writeEvent(w, e)
			if n++; n%256 == 0 {
				return flush() == nil && ctx.Err() == nil
			}
			return true
		})
		if err != nil {
			e := bus.AsError(err)
			writeEvent(w, map[string]string{"event": "error", "code": e.Code.String(), "detail": e.Detail})
			flush()
			return
		}
		if flush() != nil {
			return
		}
	}
	var buf []ledger.Item
	for {
		evs, lost, err := watch.Next(ctx, buf[:0])
		if err != nil {
			return
		}
		if lost > 0 {
			fmt.Fprintf(w, `{"event":"missed","count":%d}`+"\n", lost)
		}
		for i := range evs {
			if seen != nil && seen[keyOf(&evs[i].Event)] {
				continue
			}
			if f.text {
				writeEvent(w, &evs[i])
			} else {
				writeEvent(w, &evs[i].Event)
			}
		}
		if flush() != nil {
			return
		}
		buf = evs
	}
}

func writeEvent(w io.Writer, e any) {
	if line, err := jsonline.Encode(e); err == nil {
		w.Write(line)
	}
}
