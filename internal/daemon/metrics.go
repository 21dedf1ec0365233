package daemon

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/fed"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/httpapi"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/relaunch"
	"github.com/xmsg/xmsg/internal/store"
	"github.com/xmsg/xmsg/internal/version"
)

// tier is the daemon as GET /v1/events and GET /metrics see it (httpapi.Tier): its event
// stream's monitors, its store's replay, and the metrics (docs/operations.md, "Watching a
// tier").
type tier struct {
	d     *Daemon
	ev    *events
	start time.Time
}

var _ httpapi.Tier = (*tier)(nil)

func (t *tier) Watch(keep func(*ledger.Event) bool, text bool) (*ledger.Watch, error) {
	return t.ev.watchers.Watch(keep, text)
}

func (t *tier) MaxWatches() int { return t.ev.watchers.Max() }

// Replay reads the messages and replies the store still holds from since on, as the events
// that recorded them: a message as sent (with its outcome as stored now), a reply as replied.
func (t *tier) Replay(since time.Time, keep func(*ledger.Event) bool, fn func(*ledger.Event) bool) error {
	at := since.Unix()
	var msgs, replies []ledger.Event
	err := t.d.store.View(func(tx *store.Tx) error {
		if err := tx.MessagesSince(at, func(m store.Message) bool {
			msgs = append(msgs, ledger.Event{Kind: ledger.Sent, Time: time.Unix(m.CreatedAt, 0), MessageID: m.ID, From: m.FromName,
				To: m.SessionID, Harness: m.RecipientHarness, Outcome: m.Outcome, Bytes: m.Bytes})
			return true
		}); err != nil {
			return err
		}
		return tx.RepliesSince(at, func(r store.Reply) bool {
			replies = append(replies, ledger.Event{Kind: ledger.Replied, Time: time.Unix(r.CreatedAt, 0), MessageID: r.PushedMessageID,
				InReplyTo: r.MessageID, ReplySeq: r.Seq, From: r.ReplierSessionID, To: r.MessageID, Outcome: r.PushOutcome, Bytes: len(r.Text)})
			return true
		})
	})
	if err != nil {
		return err
	}
	// Both lists are in time order; merged, a reply follows the messages of its second.
	for i, j := 0, 0; i < len(msgs) || j < len(replies); {
		var e *ledger.Event
		if j == len(replies) || (i < len(msgs) && !msgs[i].Time.After(replies[j].Time)) {
			e, i = &msgs[i], i+1
		} else {
			e, j = &replies[j], j+1
		}
		if keep != nil && !keep(e) {
			continue
		}
		if !fn(e) {
			return nil
		}
	}
	return nil
}

// buildVersion is the binary's version and VCS revision (internal/version, which --version
// and /healthz read too), "unknown" where the build recorded none.
func buildVersion() (v, revision string) {
	i := version.Get()
	return cmp.Or(i.Version, "unknown"), cmp.Or(i.Revision, "unknown")
}

// Metrics writes the Prometheus text exposition (format 0.0.4). Every label's values come
// from a closed set or from configuration (event kinds, transports, outcomes, codes, harness
// and service and peer names), never from a sender: no message id, pid or free text.
func (t *tier) Metrics(w io.Writer) {
	m := &expo{w: w}
	version, revision := buildVersion()
	m.family("xmsg_build_info", "gauge", "The running binary: 1, labelled with its version and VCS revision.")
	m.sample("xmsg_build_info", 1, "version", version, "revision", revision)
	m.family("xmsg_start_time_seconds", "gauge", "When the daemon started, in Unix seconds.")
	m.sample("xmsg_start_time_seconds", float64(t.start.UnixNano())/1e9)

	counts := t.ev.counts.Counts()
	labels := func(c ledger.Count) []string {
		return []string{"event", c.Kind.String(), "transport", c.Transport.String(), "harness", c.Harness,
			"peer", c.Peer, "outcome", c.Outcome.String(), "code", c.Code}
	}
	m.family("xmsg_events_total", "counter", "Events of messages' lives (sent, refused, failed, acked, replied, reported, pulled, watched).")
	for _, c := range counts {
		m.sample("xmsg_events_total", float64(c.Events), labels(c)...)
	}
	m.family("xmsg_event_bytes_total", "counter", "Bytes of the messages and replies the events counted (request bodies; never their text).")
	for _, c := range counts {
		if c.Bytes > 0 {
			m.sample("xmsg_event_bytes_total", float64(c.Bytes), labels(c)...)
		}
	}

	m.family("xmsg_monitors", "gauge", "Monitors (xmsg monitor) attached now.")
	m.sample("xmsg_monitors", float64(t.ev.watchers.Len()))
	m.family("xmsg_monitors_max", "gauge", "The tier's bound on monitors attached at once.")
	m.sample("xmsg_monitors_max", float64(t.ev.watchers.Max()))
	m.family("xmsg_monitor_events_dropped_total", "counter", "Events monitors lost because they read too slowly.")
	m.sample("xmsg_monitor_events_dropped_total", float64(t.ev.watchers.Dropped()))

	b := t.d.bus
	if b != nil {
		bySession := map[string]int{}
		for _, h := range b.Harnesses().All() {
			bySession[h.Name()] = 0
		}
		for _, s := range b.Sessions("", "") {
			if _, ok := bySession[s.Harness]; ok {
				bySession[s.Harness]++
			}
		}
		m.family("xmsg_sessions", "gauge", "Live sessions by harness.")
		for _, h := range sortedKeys(bySession) {
			m.sample("xmsg_sessions", float64(bySession[h]), "harness", h)
		}
		m.family("xmsg_connections", "gauge", "Connections served now on each JSON-line socket.")
		if t.d.agent != nil {
			m.sample("xmsg_connections", float64(t.d.agent.Conns()), "socket", "agent")
		}
		if t.d.register != nil {
			m.sample("xmsg_connections", float64(t.d.register.Conns()), "socket", "register")
		}
		m.family("xmsg_evictions_total", "counter", "Connections evicted on each JSON-line socket to make room for others (fairness, not failure).")
		if t.d.agent != nil {
			m.sample("xmsg_evictions_total", float64(t.d.agent.Evictions()), "socket", "agent")
		}
		if t.d.register != nil {
			m.sample("xmsg_evictions_total", float64(t.d.register.Evictions()), "socket", "register")
		}
		m.family("xmsg_reply_waiters", "gauge", "Reply long-polls waiting now.")
		c, _ := b.Counts()
		m.sample("xmsg_reply_waiters", float64(c.Waiters))
	}

	if st := t.d.store; st != nil {
		var c store.Counts
		depth := map[string]int{}
		oldest := map[string]int64{} // a non-empty queue's head's creation time
		err := st.View(func(tx *store.Tx) error {
			c = tx.Counts()
			names := t.d.cfg.SvcNames()
			if t.d.leaf != nil {
				names = append(names, t.d.leaf.id.Service)
			}
			for _, name := range names {
				depth[name] = tx.QueueLen(svc.SessionID(name))
				if depth[name] > 0 {
					if head, ok, err := tx.Head(svc.SessionID(name)); err == nil && ok {
						oldest[name] = head.CreatedAt
					}
				}
			}
			return nil
		})
		if err == nil {
			m.family("xmsg_store_records", "gauge", "Records the store holds, by bucket.")
			m.sample("xmsg_store_records", float64(c.Messages), "bucket", "messages")
			m.sample("xmsg_store_records", float64(c.Replies), "bucket", "replies")
			m.sample("xmsg_store_records", float64(c.Queued), "bucket", "queue")
			m.sample("xmsg_store_records", float64(c.IdempotencyKeys), "bucket", "idempotency")
			m.family("xmsg_queue_depth", "gauge", "Rows in each configured service's queue.")
			for _, name := range sortedKeys(depth) {
				m.sample("xmsg_queue_depth", float64(depth[name]), "service", name)
			}
			m.family("xmsg_queue_oldest_age_seconds", "gauge", "Age of the oldest message waiting in each configured service's queue (0 when none waits).")
			now := time.Now().Unix()
			for _, name := range sortedKeys(depth) {
				age := int64(0)
				if at, ok := oldest[name]; ok && now > at {
					age = now - at
				}
				m.sample("xmsg_queue_oldest_age_seconds", float64(age), "service", name)
			}
		}
		per, n, sum := st.CommitTimes()
		m.family("xmsg_store_commit_duration_seconds", "histogram", "Time of each store commit (its writes and fsyncs): what a send waits for the disk.")
		var cum uint64
		for i, le := range store.CommitBuckets {
			cum += per[i]
			m.sample("xmsg_store_commit_duration_seconds_bucket", float64(cum), "le", strconv.FormatFloat(le, 'g', -1, 64))
		}
		m.sample("xmsg_store_commit_duration_seconds_bucket", float64(n), "le", "+Inf")
		m.sample("xmsg_store_commit_duration_seconds_sum", sum)
		m.sample("xmsg_store_commit_duration_seconds_count", float64(n))
		if fi, err := os.Stat(t.d.cfg.DBPath); err == nil {
			m.family("xmsg_store_size_bytes", "gauge", "Size of the store's file.")
			m.sample("xmsg_store_size_bytes", float64(fi.Size()))
		}
	}
	if counts, up := t.d.fed.handshakes(); counts != nil {
		m.family("xmsg_fed_handshakes_total", "counter", "Federation TLS handshakes by peer (a configured name, or (unknown)), direction and result.")
		keys := make([]fed.HandshakeKey, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		for _, k := range keys {
			result := "refused"
			if k.OK {
				result = "ok"
			}
			m.sample("xmsg_fed_handshakes_total", float64(counts[k]), "peer", k.Peer, "direction", k.Direction, "result", result)
		}
		m.family("xmsg_fed_up", "gauge", "1 when a peer's last handshake in that direction succeeded, 0 when it was refused.")
		keys = keys[:0]
		for k := range up {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		for _, k := range keys {
			v := 0.0
			if up[k] {
				v = 1
			}
			m.sample("xmsg_fed_up", v, "peer", k.Peer, "direction", k.Direction)
		}
	}
	m.family("xmsg_relaunches", "gauge", "Times the daemon was started again in its relaunch chain (a session directory appeared) before this process.")
	m.sample("xmsg_relaunches", float64(relaunch.Relaunches()))
	if refused, evicted, ok := t.d.fed.listenerCounts(); ok {
		m.family("xmsg_fed_refused_capacity_total", "counter", "Federation connections refused before a handshake because the listener was full.")
		m.sample("xmsg_fed_refused_capacity_total", float64(refused))
		m.family("xmsg_fed_evictions_total", "counter", "Federation connections evicted before their handshake to make room for others.")
		m.sample("xmsg_fed_evictions_total", float64(evicted))
	}
	if tallies := t.d.custody.Tallies(); tallies != nil {
		m.family("xmsg_custody_total", "counter", "Custody hand-overs (code empty) and refusals (their code), per secret (a held one's name, else unknown).")
		keys := make([]custody.Tally, 0, len(tallies))
		for k := range tallies {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i].Secret+keys[i].Code < keys[j].Secret+keys[j].Code })
		for _, k := range keys {
			m.sample("xmsg_custody_total", float64(tallies[k]), "secret", k.Secret, "code", k.Code)
		}
	}
	if mail := t.d.fed.mailboxes(); mail != nil {
		m.family("xmsg_leaf_mailbox_depth", "gauge", "Messages waiting in each leaf's mailbox on this hub.")
		peers := t.d.fed.leafPeers()
		if lens, err := mail.Lens(peers); err == nil {
			for i, p := range peers {
				m.sample("xmsg_leaf_mailbox_depth", float64(lens[i]), "peer", p)
			}
		}
	}
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// expo writes the text exposition format 0.0.4: a family's HELP and TYPE, then its samples.
type expo struct{ w io.Writer }

func (m *expo) family(name, typ, help string) {
	fmt.Fprintf(m.w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// sample writes one sample; labels are name, value pairs.
func (m *expo) sample(name string, v float64, labels ...string) {
	var b strings.Builder
	b.WriteString(name)
	if len(labels) > 0 {
		b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(labels[i])
			b.WriteString(`="`)
			b.WriteString(labelEscaper.Replace(labels[i+1]))
			b.WriteByte('"')
		}
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	b.WriteByte('\n')
	io.WriteString(m.w, b.String())
}

// labelEscaper escapes a label value as the text format asks: backslash, double quote, and
// line feed.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// doctorLines are the running tier's facts for `xmsg doctor`: version, uptime, sessions by
// harness, queue depth, monitors attached.
func (t *tier) doctorLines() []string {
	version, revision := buildVersion()
	lines := []string{fmt.Sprintf("running: version %s (revision %s), up %s", version, revision, time.Since(t.start).Round(time.Second))}
	if b := t.d.bus; b != nil {
		n := map[string]int{}
		for _, s := range b.Sessions("", "") {
			n[s.Harness]++
		}
		var parts []string
		for _, h := range sortedKeys(n) {
			parts = append(parts, fmt.Sprintf("%s %d", h, n[h]))
		}
		if len(parts) == 0 {
			parts = []string{"none"}
		}
		lines = append(lines, "sessions: "+strings.Join(parts, ", "))
		if c, err := b.Counts(); err == nil {
			lines = append(lines, fmt.Sprintf("queue: %d rows queued, %d messages stored", c.Queued, c.Messages))
		}
	}
	lines = append(lines, fmt.Sprintf("monitors: %d attached (limit %d), %d events dropped", t.ev.watchers.Len(), t.ev.watchers.Max(), t.ev.watchers.Dropped()))
	return lines
}
