package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FuzzCheck: Check is the oracle's gate. Whatever the bytes, it does not panic; and a file it
// lets through is one bbolt opens and reads through (every bucket, every key) without a
// panic or a fault, which is what it is for.
func FuzzCheck(f *testing.F) {
	for _, seed := range []string{"testdata/format1.db", "testdata/other.sqlite"} {
		raw, err := os.ReadFile(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := filepath.Join(t.TempDir(), "x.db")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		if Check(path) != nil {
			return
		}
		s, err := Open(path, time.Second)
		if err != nil {
			return
		}
		defer s.Close()
		s.db.View(func(tx *bolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
				return b.ForEach(func(k, v []byte) error { return nil })
			})
		})
	})
}
