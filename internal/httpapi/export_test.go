package httpapi

import "runtime"

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
