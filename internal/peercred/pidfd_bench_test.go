//go:build linux

package peercred

import (
	"os"
	"testing"
)

func BenchmarkGuardAlive(b *testing.B) {
	p := Proc{}
	st, err := p.StartTime(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	g := p.Guard(os.Getpid(), st)
	defer g.Close()
	b.ReportAllocs()
	for b.Loop() {
		if !g.Alive() {
			b.Fatal("dead")
		}
	}
}

func BenchmarkProcAlive(b *testing.B) {
	p := Proc{}
	st, _ := p.StartTime(os.Getpid())
	b.ReportAllocs()
	for b.Loop() {
		p.Alive(os.Getpid(), st)
	}
}
