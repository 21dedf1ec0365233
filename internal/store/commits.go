package store

import (
	"sync/atomic"
	"time"
)

// CommitBuckets are the upper bounds, in seconds, of the commit-duration histogram: from a
// fast SSD's fsync (100 µs) to a disk in trouble (1 s).
var CommitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// commitTimes is a histogram of commit durations (a transaction's writes, its fsyncs): what a
// send waits for the disk. Atomic counters, so observing costs a commit two clock reads.
type commitTimes struct {
	buckets [12]atomic.Uint64 // len(CommitBuckets); past the last one counts only in n
	n       atomic.Uint64
	sumNS   atomic.Uint64
}

func (c *commitTimes) observe(d time.Duration) {
	s := d.Seconds()
	for i, le := range CommitBuckets {
		if s <= le {
			c.buckets[i].Add(1)
			break
		}
	}
	c.n.Add(1)
	c.sumNS.Add(uint64(d))
}

// CommitTimes is the commit-duration histogram so far: counts per bucket of CommitBuckets (not
// cumulative), the number of commits and their total time in seconds.
func (s *Store) CommitTimes() (perBucket []uint64, n uint64, sum float64) {
	perBucket = make([]uint64, len(CommitBuckets))
	for i := range perBucket {
		perBucket[i] = s.times.buckets[i].Load()
	}
	return perBucket, s.times.n.Load(), float64(s.times.sumNS.Load()) / 1e9
}
