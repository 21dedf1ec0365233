package bus

import (
	"unicode"
	"unicode/utf8"
)

// regIndex finds the registrations a ref can name: by their bare session id or their name,
// as strings.EqualFold compares them, and by their pid. It is kept beside Bus.regs, under
// Bus.mu, so that resolving a ref reads the few registrations it names instead of comparing
// it with every one (a bus with hundreds of sessions and services did that per send).
type regIndex struct {
	byKey map[string][]*Registration // foldKey of the bare id, and of the name
	byPID map[int][]*Registration
}

func (x *regIndex) add(r *Registration) {
	if x.byKey == nil {
		x.byKey, x.byPID = map[string][]*Registration{}, map[int][]*Registration{}
	}
	id, name := foldKey(r.bareID()), foldKey(r.Name)
	x.byKey[id] = append(x.byKey[id], r)
	if name != id {
		x.byKey[name] = append(x.byKey[name], r)
	}
	x.byPID[r.PID] = append(x.byPID[r.PID], r)
}

func (x *regIndex) remove(r *Registration) {
	if x.byKey == nil {
		return // nothing was added
	}
	id, name := foldKey(r.bareID()), foldKey(r.Name)
	x.byKey[id] = without(x.byKey[id], r)
	if len(x.byKey[id]) == 0 {
		delete(x.byKey, id)
	}
	if name != id {
		if x.byKey[name] = without(x.byKey[name], r); len(x.byKey[name]) == 0 {
			delete(x.byKey, name)
		}
	}
	if x.byPID[r.PID] = without(x.byPID[r.PID], r); len(x.byPID[r.PID]) == 0 {
		delete(x.byPID, r.PID)
	}
}

// named returns, once each, the registrations whose bare id or name equals bare (folded),
// and with isPID those of pid.
func (x *regIndex) named(bare string, isPID bool, pid int) []*Registration {
	out := append([]*Registration(nil), x.byKey[foldKey(bare)]...)
	if isPID {
		for _, r := range x.byPID[pid] {
			if !containsReg(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

func without(rs []*Registration, r *Registration) []*Registration {
	for i, x := range rs {
		if x == r {
			return append(rs[:i:i], rs[i+1:]...)
		}
	}
	return rs
}

func containsReg(rs []*Registration, r *Registration) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// foldKey is s with each rune replaced by one rune of its case-folding orbit
// (unicode.SimpleFold): the smallest, or for an orbit with an ASCII letter that letter in
// lower case; and each invalid byte by U+FFFD, as strings.EqualFold decodes it. Two strings are
// EqualFold exactly when their foldKeys are equal.
func foldKey(s string) string {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || ('A' <= c && c <= 'Z') {
			plain = false
			break
		}
	}
	if plain {
		return s // ASCII without capitals: already its own key (the common case)
	}
	b := make([]byte, 0, len(s))
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		if 'A' <= m && m <= 'Z' {
			m += 'a' - 'A'
		}
		b = utf8.AppendRune(b, m)
	}
	return string(b)
}
