package bus

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// foldCases are strings whose case folding is not plain ASCII's: the Kelvin sign folds with k,
// the long s with s, final and medial sigma with Σ, the dotted and dotless i only with
// themselves, title-case digraphs with their pairs, the micro sign with mu, and invalid
// bytes with U+FFFD.
var foldCases = []string{"k", "K", "\u212a", "s", "S", "\u017f", "ß", "ẞ", "σ", "ς", "Σ", "ǅ", "Ǆ", "ǆ", "İ", "i", "I", "ı",
	"µ", "μ", "Μ", "\xff", "\xfe", "\ufffd", "a", "Z", "-", "1", ""}

// TestFoldKeyIsEqualFold: two strings have the same foldKey exactly when strings.EqualFold
// says they are equal.
func TestFoldKeyIsEqualFold(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		var b strings.Builder
		for range r.IntN(4) {
			b.WriteString(foldCases[r.IntN(len(foldCases))])
		}
		return b.String()
	}
	for range 20000 {
		a, b := word(), word()
		if (foldKey(a) == foldKey(b)) != strings.EqualFold(a, b) {
			t.Fatalf("foldKey(%q)=%q, foldKey(%q)=%q; EqualFold %v", a, foldKey(a), b, foldKey(b), strings.EqualFold(a, b))
		}
	}
}

func FuzzFoldKey(f *testing.F) {
	f.Add("Kelvin", "\u212aelvin")
	f.Add("svc:bot", "SVC:BOT")
	f.Fuzz(func(t *testing.T, a, b string) {
		if (foldKey(a) == foldKey(b)) != strings.EqualFold(a, b) {
			t.Fatalf("foldKey(%q)=%q, foldKey(%q)=%q; EqualFold %v", a, foldKey(a), b, foldKey(b), strings.EqualFold(a, b))
		}
	})
}

// TestRegIndexIsTheScan: what the index finds for a ref is what comparing the ref with every
// registration finds (its bare id or name EqualFold the ref, or its pid the ref's), after
// registrations come and go. Mutants tried: the name left out of the index (red); remove
// leaving the pid's entry (red).
func TestRegIndexIsTheScan(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	names := []string{"bot", "BOT", "\u212aey", "key", "Key", "alice", "ſam", "sam", "1", "2"}
	var x regIndex
	live := map[*Registration]bool{}
	for step := range 3000 {
		if len(live) > 0 && r.IntN(3) == 0 {
			for reg := range live {
				x.remove(reg)
				delete(live, reg)
				break
			}
		} else {
			h := []string{"svc", "pi"}[r.IntN(2)]
			name := names[r.IntN(len(names))]
			id := h + ":" + names[r.IntN(len(names))]
			reg := &Registration{Harness: h, SessionID: id, Name: name, PID: 1 + r.IntN(3)}
			x.add(reg)
			live[reg] = true
		}
		ref := names[r.IntN(len(names))]
		pid, isPID := 0, false
		if ref == "1" || ref == "2" {
			pid, isPID = int(ref[0]-'0'), true
		}
		var want []*Registration
		for reg := range live {
			if strings.EqualFold(reg.bareID(), ref) || strings.EqualFold(reg.Name, ref) || (isPID && reg.PID == pid) {
				want = append(want, reg)
			}
		}
		got := x.named(ref, isPID, pid)
		byPtr := func(a, b *Registration) int { return strings.Compare(a.SessionID+a.Name, b.SessionID+b.Name) }
		slices.SortFunc(got, byPtr)
		slices.SortFunc(want, byPtr)
		if len(got) != len(want) {
			t.Fatalf("step %d, ref %q: index found %d, the scan %d", step, ref, len(got), len(want))
		}
		for i := range got {
			if !live[got[i]] || got[i] != want[i] && byPtr(got[i], want[i]) != 0 {
				t.Fatalf("step %d, ref %q: index found %+v, the scan %+v", step, ref, got[i], want[i])
			}
		}
	}
}
