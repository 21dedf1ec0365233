package jsonline

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReadLine: the framer never returns a line longer than max, and the lines it returns
// (with their newlines) are exactly the input up to the first oversized line.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc"), 3)
	f.Add([]byte("toolong\nx\n"), 3)
	f.Add(bytes.Repeat([]byte("x"), 70000), 65536)
	f.Add([]byte("\n\n\n"), 0)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		if max < 0 || max > 1<<20 {
			return
		}
		// A small buffer forces lines across ReadSlice's ErrBufferFull path.
		r := bufio.NewReaderSize(bytes.NewReader(in), 16)
		var rebuilt []byte
		for {
			line, err := ReadLine(r, max)
			if len(line) > max {
				t.Fatalf("line of %d bytes, max %d", len(line), max)
			}
			switch {
			case err == nil:
				if bytes.IndexByte(line, '\n') >= 0 {
					t.Fatalf("line %q contains a newline", line)
				}
				rebuilt = append(append(rebuilt, line...), '\n')
				continue
			case errors.Is(err, ErrTooLong):
				if !bytes.HasPrefix(in, rebuilt) {
					t.Fatalf("lines %q are not a prefix of %q", rebuilt, in)
				}
				rest := in[len(rebuilt):]
				if i := bytes.IndexByte(rest, '\n'); i >= 0 && i <= max || i < 0 && len(rest) <= max {
					t.Fatalf("ErrTooLong for a line that fits: %q (max %d)", rest, max)
				}
				return
			case errors.Is(err, io.ErrUnexpectedEOF):
				rebuilt = append(rebuilt, line...)
			case errors.Is(err, io.EOF):
				if len(line) != 0 {
					t.Fatalf("EOF with data %q", line)
				}
			default:
				t.Fatalf("unexpected error %v", err)
			}
			if !bytes.Equal(rebuilt, in) {
				t.Fatalf("rebuilt %q, want %q", rebuilt, in)
			}
			return
		}
	})
}
