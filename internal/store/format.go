package store

import (
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// The store's format version, as etcd keeps its schema version and SQLite its user_version.
//
// The format is a number in the meta bucket, written when the file is created and read at
// every open. A file of an older format is migrated at open by the steps below, in order,
// each in one transaction that also writes its new number: a crash leaves the file in the
// format before the step or the one after, never between, and a step run again (after a
// crash, or on a file a step already reached) finds its number and does nothing. A file of
// a newer format is refused before anything is written to it: this release cannot know
// what the newer one changed.
//
// Format 1 is the layout before there was a number: the buckets of format1Buckets and no
// meta bucket.
const Format = 2

var (
	bucketMeta = []byte("meta")
	keyFormat  = []byte("format")
	keyBackup  = []byte("last_backup") // Unix seconds of the last hot backup (Backup)
)

// format1Buckets are the buckets a store of format 1 may hold. A file without a meta bucket
// that holds another is not an xmsg store of format 1 (bbolt is used by other programs).
var format1Buckets = [][]byte{
	[]byte("messages"), []byte("replies"), []byte("reply_index"), []byte("queue"),
	[]byte("idempotency"), []byte("process_sessions"), []byte("outbound"), []byte("peer_mailbox"),
}

// migration is one step: from format to-1 to format to.
type migration struct {
	to   uint64
	name string
	run  func(tx *bolt.Tx) error
}

// migrations are the steps, in order: the last one's to is Format.
var migrations = []migration{
	{to: 2, name: "format number", run: func(tx *bolt.Tx) error {
		// Format 2 is format 1 with the meta bucket (the number itself is written by
		// migrate), and with every bucket of format 1: a format 1 file made by a release
		// before federation lacks the federation buckets, which format 1 created at open.
		for _, b := range append(format1Buckets, bucketMeta) {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}},
}

// migrateHook, set by tests only, is called at each point of a migration (see migrate), so
// that a test can kill the process there.
var migrateHook func(point string)

func hook(point string) {
	if migrateHook != nil {
		migrateHook(point)
	}
}

// formatOf reads the format of an open file: 0 for a file with no bucket at all (bbolt made
// it, the buckets were never created), 1 for the unversioned layout.
func formatOf(tx *bolt.Tx) (uint64, error) {
	if meta := tx.Bucket(bucketMeta); meta != nil {
		v := meta.Get(keyFormat)
		if len(v) != 8 {
			return 0, fmt.Errorf("the meta bucket holds no valid format number (%d bytes)", len(v))
		}
		return binary.BigEndian.Uint64(v), nil
	}
	var foreign []byte
	n := 0
	err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		n++
		if !slices.ContainsFunc(format1Buckets, func(b []byte) bool { return string(b) == string(name) }) {
			foreign = append([]byte(nil), name...)
		}
		return nil
	})
	switch {
	case err != nil:
		return 0, err
	case foreign != nil:
		return 0, fmt.Errorf("a bbolt file with a bucket %q that no xmsg format has: not an xmsg store (written by another program?)", foreign)
	case n == 0:
		return 0, nil
	}
	return 1, nil
}

func setFormat(tx *bolt.Tx, v uint64) error {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	return meta.Put(keyFormat, u64(v))
}

// create makes the buckets of a new store and writes its format, in one transaction.
func create(tx *bolt.Tx) error {
	for _, b := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return setFormat(tx, Format)
}

// migrate brings db from format from to Format, one transaction per step. Each step reads
// the format again in its own transaction, so a step already made is not made twice.
func migrate(db *bolt.DB, from uint64) error {
	for _, m := range migrations {
		if m.to <= from {
			continue
		}
		// A file that has the step's format already is not written to at all (an Update
		// that changes nothing still commits).
		var cur uint64
		if err := db.View(func(tx *bolt.Tx) (err error) { cur, err = formatOf(tx); return err }); err != nil {
			return fmt.Errorf("store: migrate to format %d (%s): %w", m.to, m.name, err)
		}
		if cur >= m.to {
			continue
		}
		hook(fmt.Sprintf("before %d", m.to))
		err := db.Update(func(tx *bolt.Tx) error {
			cur, err := formatOf(tx)
			if err != nil || cur >= m.to {
				return err
			}
			if err := m.run(tx); err != nil {
				return err
			}
			if err := setFormat(tx, m.to); err != nil {
				return err
			}
			hook(fmt.Sprintf("uncommitted %d", m.to))
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: migrate to format %d (%s): %w", m.to, m.name, err)
		}
		hook(fmt.Sprintf("committed %d", m.to))
	}
	return nil
}

// MigratedFrom is the format the file had when it was opened: Format for a new file or one of
// this release's format, less when Open migrated it.
func (s *Store) MigratedFrom() uint64 { return s.migratedFrom }
