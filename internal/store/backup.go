package store

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the whole store to w: the file as one read transaction
// sees it (bbolt's Tx.WriteTo), so every write committed before Backup began is in it and
// none that is half done. Writes go on meanwhile; only the file's growth waits for the copy
// to end (bbolt remaps the file under a lock its readers hold), so w should not stall.
// begin, when set, is called with the copy's exact size before its first byte. When the whole
// copy is written the time is recorded for Info (one small commit).
func (s *Store) Backup(w io.Writer, begin func(size int64)) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		if begin != nil {
			begin(tx.Size())
		}
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("store: backup: %w", err)
	}
	now := uint64(time.Now().Unix())
	// The record is best effort: the copy is made and answered whether or not it is kept.
	s.Update(func(tx *Tx) error { return tx.btx.Bucket(bucketMeta).Put(keyBackup, u64(now)) })
	return n, nil
}

// Info describes the store file for `xmsg doctor`.
type Info struct {
	Path       string
	Format     uint64
	Size       int64     // bytes of the file (-1: unknown)
	LastBackup time.Time // zero: none made by this store
}

// Info returns the store's format, size and last backup time.
func (s *Store) Info() Info {
	in := Info{Path: s.path, Format: Format, Size: -1}
	if fi, err := os.Stat(s.path); err == nil {
		in.Size = fi.Size()
	}
	s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyBackup); len(v) == 8 {
			in.LastBackup = time.Unix(int64(binary.BigEndian.Uint64(v)), 0).UTC()
		}
		return nil
	})
	return in
}
