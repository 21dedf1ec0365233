package codex

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxHeader bounds the rollout header line: it is read from a file the daemon does not
// control, so at most this many bytes are read, whatever the file holds.
const MaxHeader = 64 << 10

// Header is what the first line of a rollout file says about its thread.
type Header struct {
	ID  string // the thread (session) id, validated
	Cwd string
}

// ReadHeader reads the first line of a rollout (at most MaxHeader bytes, newline included)
// and parses it. Two shapes exist: {"type":"session_meta","payload":{"id":...,"cwd":...}}
// and the older bare {"id":...,"cwd":...}.
func ReadHeader(r io.Reader) (Header, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, MaxHeader), 4096)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			return Header{}, errors.New("codex: rollout header: no complete first line within the bound")
		}
		return Header{}, fmt.Errorf("codex: rollout header: %w", err)
	}
	return ParseHeader(bytes.TrimSuffix(line, []byte("\n")))
}

// ParseHeader parses one rollout header line.
func ParseHeader(line []byte) (Header, error) {
	var h struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
		ID      string          `json:"id"`
		Cwd     string          `json:"cwd"`
	}
	if err := json.Unmarshal(line, &h); err != nil {
		return Header{}, errors.New("codex: rollout header is not a JSON object")
	}
	if h.Type == "session_meta" {
		var p struct {
			ID  string `json:"id"`
			Cwd string `json:"cwd"`
		}
		if err := json.Unmarshal(h.Payload, &p); err != nil {
			return Header{}, errors.New("codex: rollout header payload is not an object")
		}
		h.ID, h.Cwd = p.ID, p.Cwd
	} else if h.Type != "" {
		return Header{}, fmt.Errorf("codex: rollout header has type %q, want session_meta", h.Type)
	}
	id, err := ValidID(h.ID)
	if err != nil {
		return Header{}, fmt.Errorf("codex: rollout header id: %w", err)
	}
	return Header{ID: id, Cwd: h.Cwd}, nil
}
