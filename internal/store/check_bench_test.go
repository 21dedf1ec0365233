package store

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkCheck measures the check every open makes against the open itself (which rebuilds
// the freelist by walking the same pages), on a store of about 40 MiB.
func BenchmarkCheck(b *testing.B) {
	path := filepath.Join(b.TempDir(), "x.db")
	s := open(b, path)
	text := strings.Repeat("x", 2000)
	for batch := range 20 {
		err := s.Update(func(tx *Tx) error {
			for i := range 1000 {
				id := fmt.Sprintf("01900000-0000-7000-9000-%06d%06d", batch, i)
				if err := tx.PutMessage(Message{ID: id, FromName: text}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	s.Close()
	b.Run("check", func(b *testing.B) {
		for b.Loop() {
			if err := Check(path); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open", func(b *testing.B) {
		for b.Loop() {
			s, err := Open(path, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}
