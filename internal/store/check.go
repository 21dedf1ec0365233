package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// The check of a store file before bbolt opens it.
//
// bbolt trusts its file: a file cut short is mapped past its end (the first read of a missing
// page is a fault that kills the process), a zeroed page trips an assertion in the goroutine
// that rebuilds the freelist at open (a panic no caller can recover), and a file shorter than
// its meta page says may be opened and grown again, so that what was cut is silently gone.
// Check reads the file itself, with plain reads that cannot fault, and never writes: both
// meta pages (magic, version, checksum, page size, bounds), the file's size against the
// high-water mark, and every page reachable from the root (its id, its type, its bounds,
// referenced once). That walk reads what bbolt's own freelist rebuild reads at every open,
// so it costs an open about as much again, and nothing after (BenchmarkCheck).

// bbolt's on-disk layout (go.etcd.io/bbolt/internal/common), in the machine's byte order.
const (
	boltMagic    = 0xED0CDAED
	boltVersion  = 2
	pageHeader   = 16 // id uint64, flags uint16, count uint16, overflow uint32
	metaSize     = 64 // magic, version, page size, flags, root bucket (16), freelist, pgid, txid, checksum
	metaSummed   = 56 // the bytes the checksum covers: the meta up to the checksum
	elementSize  = 16 // a leaf element (flags, pos, ksize, vsize) and a branch one (pos, ksize, pgid)
	bucketHeader = 16 // a bucket's value: root pgid, sequence; an inline bucket's page follows

	flagBranch   = 0x01
	flagLeaf     = 0x02
	flagMeta     = 0x04
	flagFreelist = 0x10
	leafBucket   = 0x01
	noFreelist   = ^uint64(0)

	maxDepth = 64 // a B+tree of a real store is a few levels deep; more is a loop
)

// sqliteMagic starts every SQLite database: named in the refusal, the likeliest other file.
var sqliteMagic = []byte("SQLite format 3\x00")

// RefusedError is a store file Open will not open and has not changed: damage found before
// bbolt read it, a file that is no xmsg store, or a format newer than this release's. Its
// message is one line: the file, what is wrong, what to do.
type RefusedError struct {
	Path    string
	Problem string
	Remedy  string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("store: %s: %s; the file was not changed: %s", e.Path, e.Problem, e.Remedy)
}

// restoreHint is the remedy of a damaged or foreign file.
const restoreHint = "move the file aside and restore a backup (xmsg backup; docs/operations.md, Upgrades, backups and restores)"

func damaged(path, format string, args ...any) *RefusedError {
	return &RefusedError{Path: path, Problem: fmt.Sprintf(format, args...), Remedy: restoreHint}
}

// boltMeta is one meta page's meta.
type boltMeta struct {
	magic, version, pageSize   uint32
	root, freelist, pgid, txid uint64
	checksum, sum              uint64
	pageID                     uint64
	pageFlags                  uint16
}

func parseMeta(page []byte) boltMeta {
	ne := binary.NativeEndian
	m := page[pageHeader : pageHeader+metaSize]
	h := fnv.New64a()
	h.Write(m[:metaSummed])
	return boltMeta{
		pageID: ne.Uint64(page[0:]), pageFlags: ne.Uint16(page[8:]),
		magic: ne.Uint32(m[0:]), version: ne.Uint32(m[4:]), pageSize: ne.Uint32(m[8:]),
		root: ne.Uint64(m[16:]), freelist: ne.Uint64(m[32:]), pgid: ne.Uint64(m[40:]),
		txid: ne.Uint64(m[48:]), checksum: ne.Uint64(m[56:]), sum: h.Sum64(),
	}
}

// problem says what is wrong with meta page n (at its place in the file), or "".
func (m boltMeta) problem(n uint64) string {
	switch {
	case m.magic != boltMagic:
		return fmt.Sprintf("meta page %d has no bbolt magic", n)
	case m.version != boltVersion:
		return fmt.Sprintf("meta page %d has bbolt version %d, not %d", n, m.version, boltVersion)
	case m.checksum != m.sum:
		return fmt.Sprintf("meta page %d fails its checksum", n)
	case m.pageFlags != flagMeta || m.pageID != n:
		return fmt.Sprintf("meta page %d has the header of another page", n)
	case m.pageSize < 512 || m.pageSize > 1<<20 || m.pageSize&(m.pageSize-1) != 0:
		return fmt.Sprintf("meta page %d names an impossible page size %d", n, m.pageSize)
	case m.pgid < 3 || m.root < 2 || m.root >= m.pgid:
		return fmt.Sprintf("meta page %d names a root page %d outside its %d pages", n, m.root, m.pgid)
	case m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.pgid):
		return fmt.Sprintf("meta page %d names a freelist page %d outside its %d pages", n, m.freelist, m.pgid)
	}
	return ""
}

// Check reads the store file at path and reports damage as a *RefusedError; it never
// writes. A missing file is no error (Open creates it). Other errors (a file that cannot be
// read) are returned as they are.
func Check(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: check %s: %w", path, err)
	}
	defer f.Close()
	return check(f, path)
}

func check(f *os.File, path string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("store: check %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return damaged(path, "not a regular file")
	}
	size := fi.Size()
	if size == 0 {
		// bbolt would make a new store of it. A store is never empty once created, so this
		// is one cut to nothing (or a creation that never got its first page written).
		return damaged(path, "the file is empty: a store is never empty (if this tier never ran, remove it)")
	}
	head := make([]byte, pageHeader+metaSize)
	if n, _ := f.ReadAt(head, 0); n < len(head) || size < 1024 {
		return damaged(path, "the file is %d bytes, too short for a store", size)
	}
	if bytes.HasPrefix(head, sqliteMagic) {
		return damaged(path, "this is a SQLite database, not an xmsg store")
	}
	m0 := parseMeta(head)
	ps := uint64(os.Getpagesize())
	if m0.problem(0) == "" {
		ps = uint64(m0.pageSize)
	}
	if n, _ := f.ReadAt(head, int64(ps)); n < len(head) {
		return damaged(path, "the file is %d bytes, too short for its two meta pages", size)
	}
	m1 := parseMeta(head)
	p0, p1 := m0.problem(0), m1.problem(1)
	switch {
	case m0.magic != boltMagic && m1.magic != boltMagic && allZero(head):
		return damaged(path, "both meta pages are zeroed")
	case m0.magic != boltMagic && m1.magic != boltMagic:
		return damaged(path, "no bbolt magic in either meta page: not an xmsg store (written by another program?)")
	case p0 != "":
		// bbolt would fall back to the other meta page, that is to the commit before: a
		// silent rollback of answers already given. Refused like any other damage.
		return damaged(path, "%s", p0)
	case p1 != "":
		return damaged(path, "%s", p1)
	case m0.pageSize != m1.pageSize:
		return damaged(path, "the meta pages name page sizes %d and %d", m0.pageSize, m1.pageSize)
	}
	hwm := max(m0.pgid, m1.pgid)
	if size%int64(ps) != 0 || uint64(size) < hwm*ps {
		return damaged(path, "the file is %d bytes but its meta page says %d pages of %d bytes (%d): it was cut short", size, hwm, ps, hwm*ps)
	}
	active := m0
	if m1.txid > m0.txid {
		active = m1
	}
	w := &walker{f: f, ps: ps, hwm: active.pgid, seen: make([]uint64, (active.pgid+63)/64)}
	if active.freelist != noFreelist {
		if _, err := w.page(active.freelist, flagFreelist); err != nil {
			return damaged(path, "%v", err)
		}
	}
	if _, err := w.tree(active.root, nil, nil, 0); err != nil {
		return damaged(path, "%v", err)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// walker reads the pages reachable from a root, checking each one.
type walker struct {
	f    *os.File
	ps   uint64
	hwm  uint64
	seen []uint64 // one bit per page
}

// page reads page id (with its overflow pages) and checks its header; want is the flag its
// type must be (0: branch or leaf).
func (w *walker) page(id uint64, want uint16) ([]byte, error) {
	if id < 2 || id >= w.hwm {
		return nil, fmt.Errorf("a reference to page %d, outside the %d pages of the file", id, w.hwm)
	}
	buf := make([]byte, w.ps)
	if _, err := w.f.ReadAt(buf, int64(id*w.ps)); err != nil {
		return nil, fmt.Errorf("page %d cannot be read: %v", id, err)
	}
	ne := binary.NativeEndian
	pid, flags, overflow := ne.Uint64(buf), ne.Uint16(buf[8:]), uint64(ne.Uint32(buf[12:]))
	switch {
	case pid != id:
		return nil, fmt.Errorf("page %d carries the id %d (overwritten or zeroed)", id, pid)
	case want != 0 && flags != want, want == 0 && flags != flagBranch && flags != flagLeaf:
		return nil, fmt.Errorf("page %d has the type %#x where the tree needs another", id, flags)
	case id+overflow >= w.hwm:
		return nil, fmt.Errorf("page %d runs past the %d pages of the file", id, w.hwm)
	}
	for p := id; p <= id+overflow; p++ {
		if w.seen[p/64]&(1<<(p%64)) != 0 {
			return nil, fmt.Errorf("page %d is referenced twice", p)
		}
		w.seen[p/64] |= 1 << (p % 64)
	}
	if overflow > 0 {
		buf = append(buf, make([]byte, overflow*w.ps)...)
		if _, err := w.f.ReadAt(buf[w.ps:], int64((id+1)*w.ps)); err != nil && err != io.EOF {
			return nil, fmt.Errorf("page %d cannot be read: %v", id, err)
		}
	}
	return buf, nil
}

// tree checks the B+tree rooted at page id, whose keys must lie in [lo, hi) (nil: no bound),
// and returns its greatest key. The order is checked as bbolt's freelist rebuild checks it at
// open (tx_check.go), where a key out of order is a panic: sorted within a page, and each
// child's keys between its own key in the branch and the next one.
func (w *walker) tree(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("the tree below page %d is deeper than %d levels (a loop)", id, maxDepth)
	}
	p, err := w.page(id, 0)
	if err != nil {
		return nil, err
	}
	return w.node(p, id, lo, hi, depth)
}

// inOrder checks key, element i of page id, against the key before it (prev; for the first
// element the lower bound, which it may equal) and the upper bound hi.
func inOrder(id uint64, i int, key, prev, hi []byte) error {
	c := 1
	if prev != nil {
		c = bytes.Compare(key, prev)
	}
	if c < 0 || (c == 0 && i > 0) || (hi != nil && bytes.Compare(key, hi) >= 0) {
		return fmt.Errorf("page %d: key %d is out of order", id, i)
	}
	return nil
}

// node checks the elements of one page (p holds its header), and the trees they lead to; it
// returns the page's greatest key.
func (w *walker) node(p []byte, id uint64, lo, hi []byte, depth int) ([]byte, error) {
	ne := binary.NativeEndian
	flags, count := ne.Uint16(p[8:]), int(ne.Uint16(p[10:]))
	if pageHeader+count*elementSize > len(p) {
		return nil, fmt.Errorf("page %d claims %d elements, more than it holds", id, count)
	}
	prev, greatest := lo, []byte(nil)
	for i := range count {
		e := pageHeader + i*elementSize
		if flags == flagBranch {
			pos, ksize, child := int(ne.Uint32(p[e:])), int(ne.Uint32(p[e+4:])), ne.Uint64(p[e+8:])
			if pos < 0 || ksize < 0 || e+pos < e || e+pos+ksize > len(p) {
				return nil, fmt.Errorf("page %d: element %d lies outside the page", id, i)
			}
			key := p[e+pos : e+pos+ksize]
			if err := inOrder(id, i, key, prev, hi); err != nil {
				return nil, err
			}
			next := hi
			if i+1 < count {
				n := pageHeader + (i+1)*elementSize
				npos, nksize := int(ne.Uint32(p[n:])), int(ne.Uint32(p[n+4:]))
				if npos < 0 || nksize < 0 || n+npos < n || n+npos+nksize > len(p) {
					return nil, fmt.Errorf("page %d: element %d lies outside the page", id, i+1)
				}
				next = p[n+npos : n+npos+nksize]
			}
			g, err := w.tree(child, key, next, depth+1)
			if err != nil {
				return nil, err
			}
			prev, greatest = g, g
			continue
		}
		eflags, pos, ksize, vsize := ne.Uint32(p[e:]), int(ne.Uint32(p[e+4:])), int(ne.Uint32(p[e+8:])), int(ne.Uint32(p[e+12:]))
		start := e + pos + ksize
		if pos < 0 || ksize < 0 || vsize < 0 || start < e || start+vsize > len(p) {
			return nil, fmt.Errorf("page %d: element %d lies outside the page", id, i)
		}
		key := p[e+pos : start]
		if err := inOrder(id, i, key, prev, hi); err != nil {
			return nil, err
		}
		prev, greatest = key, key
		if eflags&leafBucket == 0 {
			continue
		}
		v := p[start : start+vsize]
		if len(v) < bucketHeader {
			return nil, fmt.Errorf("page %d: element %d is a bucket without its header", id, i)
		}
		if root := ne.Uint64(v); root != 0 {
			if _, err := w.tree(root, nil, nil, depth+1); err != nil {
				return nil, err
			}
			continue
		}
		// An inline bucket: its one leaf page follows the header, inside this value.
		inline := v[bucketHeader:]
		if len(inline) < pageHeader || ne.Uint16(inline[8:]) != flagLeaf {
			return nil, fmt.Errorf("page %d: element %d holds an inline bucket that is no leaf", id, i)
		}
		if depth+1 > maxDepth {
			return nil, fmt.Errorf("the tree below page %d is deeper than %d levels (a loop)", id, maxDepth)
		}
		if _, err := w.node(inline, id, nil, nil, depth+1); err != nil {
			return nil, err
		}
	}
	return greatest, nil
}
