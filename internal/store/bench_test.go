package store

import (
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkBaselineBboltCommit is one fsynced bbolt transaction with one small put: the floor
// every durable send pays. The group-commit benchmarks below are read against it.
func BenchmarkBaselineBboltCommit(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "x.db"))
	defer s.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := newID(b)
		err := s.db.Update(func(tx *bboltTx) error { return tx.Bucket(bucketMessages).Put([]byte(id), []byte(`{}`)) })
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdateSingleWriter is Store.Update with one writer: must cost one commit, with no
// batching delay.
func BenchmarkUpdateSingleWriter(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "x.db"))
	defer s.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := newID(b)
		if err := s.Update(func(tx *Tx) error { return tx.PutMessage(Message{ID: id}) }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdate64Writers is Store.Update from 64 concurrent writers sharing commits.
func BenchmarkUpdate64Writers(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "x.db"))
	defer s.Close()
	b.SetParallelism(64 / max(1, runtimeProcs()))
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := newID(b)
			if err := s.Update(func(tx *Tx) error { return tx.PutMessage(Message{ID: id}) }); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
}
