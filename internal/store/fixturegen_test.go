//go:build fixturegen

package store

import (
	"flag"
	"testing"
	"time"
)

// The generator of testdata/format<N>.db, kept beside the test that reads it. It writes the
// rows of fixture() through the store's API, so it writes the format of the release it runs
// at: run it at that release's commit, e.g. for format 1 (the last commit without a format
// number) from a checkout of that commit with fixture_test.go and this file copied in:
//
//	go test -tags fixturegen -run TestGenerateFixture ./internal/store -fixture-out=$PWD/format1.db
var fixtureOut = flag.String("fixture-out", "", "the store file to write (must not exist)")

func TestGenerateFixture(t *testing.T) {
	if *fixtureOut == "" {
		t.Skip("no -fixture-out")
	}
	s, err := Open(*fixtureOut, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Update(fixture().write); err != nil {
		t.Fatal(err)
	}
}
