package peercred

import "testing"

func TestParseLocks(t *testing.T) {
	data := []byte(`1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
2: POSIX  ADVISORY  READ 99 fd:00:42 0 EOF
2: -> POSIX  ADVISORY  WRITE 98 fd:00:42 0 EOF
3: FLOCK  ADVISORY  READ 7 00:1a:9 0 EOF
garbage
4: FLOCK ADVISORY WRITE x 08:01:1 0 EOF
5: FLOCK ADVISORY WRITE 1 zz:01:1 0 EOF
`)
	got := ParseLocks(data)
	want := []Lock{
		{Kind: "FLOCK", Mode: "ADVISORY", Access: "WRITE", PID: 1234, Major: 8, Minor: 1, Ino: 5678, Exclusive: true},
		{Kind: "POSIX", Mode: "ADVISORY", Access: "READ", PID: 99, Major: 0xfd, Minor: 0, Ino: 42},
		{Kind: "FLOCK", Mode: "ADVISORY", Access: "READ", PID: 7, Major: 0, Minor: 0x1a, Ino: 9},
	}
	if len(got) != len(want) {
		t.Fatalf("ParseLocks = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("lock %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func FuzzParseLocks(f *testing.F) {
	f.Add([]byte("1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF\n"))
	f.Add([]byte("2: -> POSIX  ADVISORY  WRITE 98 fd:00:42 0 EOF\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, l := range ParseLocks(data) {
			if l.Exclusive != (l.Access == "WRITE") || l.PID < 0 {
				t.Fatalf("inconsistent lock %+v", l)
			}
		}
	})
}
