package store

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// bucketProcessSessions maps a session process to the id minted for it the first time it
// registered: key harness 0x00 boot id 0x00 pid 0x00 start time. The boot id is part of the
// key because a start time counts clock ticks since boot: after a reboot the same pid and
// start time name another process, which must not inherit the id.
var bucketProcessSessions = []byte("process_sessions")

// ProcessSession is the durable id of one session process (docs/protocol.md §4.2: a fresh
// UUID v4 per session process, kept durably).
type ProcessSession struct {
	Harness   string `json:"harness"`
	Boot      string `json:"boot"`
	PID       int    `json:"pid"`
	Start     string `json:"start"`
	SessionID string `json:"sessionId"`
	CreatedAt int64  `json:"createdAt"`
}

func processKey(harness, boot string, pid int, start string) []byte {
	k := make([]byte, 0, len(harness)+len(boot)+len(start)+16)
	k = append(k, harness...)
	k = append(k, 0)
	k = append(k, boot...)
	k = append(k, 0)
	k = strconv.AppendInt(k, int64(pid), 10)
	k = append(k, 0)
	return append(k, start...)
}

// ProcessSession returns the id recorded for the process (harness, boot, pid, start).
func (t *Tx) ProcessSession(harness, boot string, pid int, start string) (ProcessSession, bool, error) {
	return get[ProcessSession](t.btx.Bucket(bucketProcessSessions), processKey(harness, boot, pid, start))
}

// PutProcessSession records the id of a session process.
func (t *Tx) PutProcessSession(p ProcessSession) error {
	return put(t.btx.Bucket(bucketProcessSessions), processKey(p.Harness, p.Boot, p.PID, p.Start), p)
}

// ProcessSessions returns every recorded session process.
func (t *Tx) ProcessSessions() ([]ProcessSession, error) {
	var out []ProcessSession
	err := t.btx.Bucket(bucketProcessSessions).ForEach(func(k, v []byte) error {
		var p ProcessSession
		if err := json.Unmarshal(v, &p); err != nil {
			return fmt.Errorf("store: decode process session: %w", err)
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// DeleteProcessSession forgets a session process (it exited: its id is never handed out again).
func (t *Tx) DeleteProcessSession(p ProcessSession) error {
	return t.btx.Bucket(bucketProcessSessions).Delete(processKey(p.Harness, p.Boot, p.PID, p.Start))
}
