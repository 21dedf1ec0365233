package store

import (
	"runtime"

	bolt "go.etcd.io/bbolt"
)

type bboltTx = bolt.Tx

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
