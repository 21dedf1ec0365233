package bench

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

// The leaf path (issue 22): hub → leaf → service. Two daemons of its own, each in its own
// process on temporary paths, joined by a pinned mTLS link on loopback: a hub, and a leaf
// (`serve --leaf`) whose service is a consumer in this process on the leaf's register
// socket. Senders post to svc:bench@leaf through the hub's http.sock while the service
// drains; the figures are the rate at which the service receives, and each message's time
// from its send to the service. The same run measures the same service on the hub itself
// (svc:bench local there), the baseline the leaf is held to.

// RunLeaf runs the leaf path o.Runs times: o.Count messages one at a time (the next sent once
// the service has the last), then o.Count*4 from min(o.Clients, 8) senders, each on the hub's
// own service and through the leaf, with the run's fsync and commit baselines and process
// round trip.
func RunLeaf(o Options) (*Result, error) {
	if o.Count <= 0 || o.Clients <= 0 || o.Runs <= 0 || o.Size <= 0 {
		return nil, errors.New("bench: counts must be positive")
	}
	dir, err := os.MkdirTemp("", "xmsg-bench-leaf")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	stores := dir
	if o.LeafState != "" {
		if stores, err = os.MkdirTemp(o.LeafState, "xmsg-bench-leaves"); err != nil {
			return nil, fmt.Errorf("bench: the leaves' stores: %w", err)
		}
		defer os.RemoveAll(stores)
	}
	// e holds the echo child, the baselines and the progress line, as for RunBench.
	e := &env{o: o, dir: dir, prog: newProgress(o.Progress), text: strings.Repeat("x", o.Size)}
	defer e.prog.done()
	defer e.stop()
	l := &leafEnv{o: o, dir: dir, stores: stores, e: e}
	defer l.stop()
	if o.Interrupt != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-o.Interrupt:
				l.interrupted.Store(true)
				e.interrupted.Store(true)
				l.stop()
				e.stop()
			case <-done:
			}
		}()
	}
	res, err := l.run()
	if l.interrupted.Load() {
		return nil, ErrInterrupted
	}
	return res, err
}

type leafEnv struct {
	o           Options
	e           *env
	dir         string
	stores      string // where the leaves' stores are: dir, or under Options.LeafState
	hub         *exec.Cmd
	leaves      []*exec.Cmd // leaves[0] is "leaf", the one the one-leaf paths use
	hubHTTP     string
	hubRegister string
	leafRegs    []string // each leaf's register socket, as leaves
	mu          sync.Mutex
	stopped     bool
	interrupted atomic.Bool
}

// stop ends the leaf, then the hub (SIGINT, a clean stop; killed after 10 s).
func (l *leafEnv) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.stopped = true
	for _, c := range append(append([]*exec.Cmd(nil), l.leaves...), l.hub) {
		if c == nil || c.Process == nil {
			continue
		}
		c.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.Process.Kill()
			<-done
		}
	}
}

// start starts a daemon, unless stop has run.
func (l *leafEnv) start(name string, args []string, rt string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(l.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(l.o.Self, args...)
	cmd.Env = append(append([]string(nil), l.o.Env...), "XDG_RUNTIME_DIR="+rt)
	cmd.Stderr = log
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return nil, ErrInterrupted
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", name, err)
	}
	return cmd, nil
}

// leafCert is a self-signed Ed25519 certificate for name, as PEM, and its pin.
func leafCert(name string) (certPEM, keyPEM []byte, pin string, err error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, "", err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, nil, "", err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, "", err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, "", err
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		"sha256:" + hex.EncodeToString(sum[:]), nil
}

// freePort is a loopback port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// leafName is the peer name of leaf i: "leaf", then "leaf1", "leaf2", ...
func leafName(i int) string {
	if i == 0 {
		return "leaf"
	}
	return "leaf" + strconv.Itoa(i)
}

// setup writes the nodes' credentials and peers files and starts the hub and the leaves
// (o.Leaves, at least one), each its own process with its own certificate.
func (l *leafEnv) setup() error {
	type node struct{ dir, rt, cert, key, pin string }
	mk := func(name string) (*node, error) {
		n := &node{dir: filepath.Join(l.dir, name)}
		n.rt = filepath.Join(n.dir, "rt")
		for _, d := range []string{n.dir, n.rt, filepath.Join(n.dir, "sessions")} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, err
			}
		}
		c, k, pin, err := leafCert(name)
		if err != nil {
			return nil, err
		}
		n.cert, n.key, n.pin = filepath.Join(n.dir, "cert.pem"), filepath.Join(n.dir, "key.pem"), pin
		if err := os.WriteFile(n.cert, c, 0o600); err != nil {
			return nil, err
		}
		return n, os.WriteFile(n.key, k, 0o600)
	}
	hub, err := mk("hub")
	if err != nil {
		return err
	}
	leaves := make([]*node, max(l.o.Leaves, 1))
	hubPeerSet := map[string]any{}
	for i := range leaves {
		if leaves[i], err = mk(leafName(i)); err != nil {
			return err
		}
		hubPeerSet[leafName(i)] = map[string]any{"pin": leaves[i].pin, "leaf": true, "allow": []string{"send", "reply"}}
	}
	fedPort, err := freePort()
	if err != nil {
		return err
	}
	peers := func(n *node, v any) (string, error) {
		raw, _ := json.Marshal(v)
		p := filepath.Join(n.dir, "peers.json")
		return p, os.WriteFile(p, raw, 0o600)
	}
	hubPeers, err := peers(hub, hubPeerSet)
	if err != nil {
		return err
	}
	self, err := filepath.EvalSymlinks(l.o.Self)
	if err != nil {
		return err
	}
	l.hubHTTP, l.hubRegister = filepath.Join(hub.rt, "http.sock"), filepath.Join(hub.rt, "register.sock")
	conns := strconv.Itoa(4*l.senders() + 64)
	// Default limits otherwise: the fed rate, the queue share, the mailbox bounds.
	if l.hub, err = l.start("hub", []string{"serve", "--db-path", filepath.Join(hub.dir, "xmsg.db"), "--sessions-dir", filepath.Join(hub.dir, "sessions"),
		"--http-sock", l.hubHTTP, "--agent-sock", filepath.Join(hub.rt, "agent.sock"), "--register-sock", l.hubRegister, "--host-label", "hub",
		"--svc-exe", "bench=" + self, "--fed-listen", "127.0.0.1:" + strconv.Itoa(fedPort), "--peers-file", hubPeers,
		"--fed-cert", hub.cert, "--fed-key", hub.key, "--fed-reload-interval-secs", "0", "--http-max-conns", conns, "--http-max-per-pid", conns}, hub.rt); err != nil {
		return err
	}
	if err := waitFor(func() bool {
		c, err := dialHTTP(l.hubHTTP)
		if err != nil {
			return false
		}
		defer c.close()
		st, _, err := c.do("GET", "/healthz", nil)
		return err == nil && st == 200
	}); err != nil {
		return l.startErr("hub", err)
	}
	for i, leaf := range leaves {
		name := leafName(i)
		leafPeers, err := peers(leaf, map[string]any{"hub": map[string]any{"address": "127.0.0.1:" + strconv.Itoa(fedPort), "pin": hub.pin}})
		if err != nil {
			return err
		}
		reg := filepath.Join(leaf.rt, "register.sock")
		// Port 0: the kernel's choice, so that fifty leaves starting at once cannot race for
		// a port found free a moment before.
		c, err := l.start(name, []string{"serve", "--leaf", "--leaf-principal", "svc:bench", "--listen", "127.0.0.1:0",
			"--db-path", filepath.Join(l.stores, name+".db"), "--leaf-register-sock", reg, "--peers-file", leafPeers,
			"--fed-cert", leaf.cert, "--fed-key", leaf.key, "--fed-reload-interval-secs", "0", "--host-label", name}, leaf.rt)
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.leaves, l.leafRegs = append(l.leaves, c), append(l.leafRegs, reg)
		l.mu.Unlock()
	}
	for i, reg := range l.leafRegs {
		if err := waitFor(func() bool {
			c, err := net.Dial("unix", reg)
			if err == nil {
				c.Close()
			}
			return err == nil
		}); err != nil {
			return l.startErr(leafName(i), err)
		}
	}
	return nil
}

// senders is the number of concurrent senders of the draining paths.
func (l *leafEnv) senders() int {
	if l.o.Leaves > 1 {
		return min(l.o.Clients, 16)
	}
	return min(l.o.Clients, 8)
}

func waitFor(ok func() bool) error {
	for range 1000 {
		if ok() {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("not ready after 10 s")
}

func (l *leafEnv) startErr(name string, err error) error {
	raw, _ := os.ReadFile(filepath.Join(l.dir, name+".log"))
	return fmt.Errorf("bench: %s: %w:\n%s", name, err, raw)
}

func (l *leafEnv) run() (*Result, error) {
	if err := l.setup(); err != nil {
		return nil, err
	}
	e := l.e
	e.echo = filepath.Join(l.dir, "echo.sock")
	if _, err := e.spawn("echo", e.echo); err != nil {
		return nil, err
	}
	base, err := e.openBaseline()
	if err != nil {
		return nil, err
	}
	defer base.close()
	e.base = base
	res := &Result{Size: l.o.Size, CPUs: runtime.NumCPU(), DaemonPID: l.hub.Process.Pid,
		Daemon: fmt.Sprintf("a hub and %d leaf daemon(s), own processes on temporary paths%s (daemon CPU: the hub's; leaf CPU: the leaves' together)", len(l.leaves), l.storesNote())}
	senders := l.senders()
	type path struct {
		kind        PathKind
		name        string
		socks, refs []string
		senders, n  int
	}
	paths := []path{
		{HubSvcOne, "1 client -> svc on the hub (http), one at a time", []string{l.hubRegister}, []string{"svc:bench"}, 0, l.o.Count},
		{LeafOne, "1 client -> hub -> leaf -> svc, one at a time", l.leafRegs[:1], []string{"svc:bench@leaf"}, 0, l.o.Count},
		{HubDrain, fmt.Sprintf("1 consumer drains on the hub, %d senders", senders), []string{l.hubRegister}, []string{"svc:bench"}, senders, 4 * l.o.Count},
		{LeafDrain, fmt.Sprintf("hub -> leaf -> svc, 1 consumer drains, %d senders", senders), l.leafRegs[:1], []string{"svc:bench@leaf"}, senders, 4 * l.o.Count},
	}
	if n := len(l.leaves); n > 1 {
		refs := make([]string, n)
		for i := range refs {
			refs[i] = "svc:bench@" + leafName(i)
		}
		paths = append(paths, path{LeavesDrain, fmt.Sprintf("hub -> %d leaves -> svc on each, %d senders", n, senders), l.leafRegs, refs, senders, 4 * l.o.Count})
	}
	for i := range l.o.Runs {
		e.prog.run = fmt.Sprintf("run %d/%d", i+1, l.o.Runs)
		var r Run
		fsync, commit, err := e.baselines(200)
		if err != nil {
			return nil, err
		}
		rtt, err := e.rtt(200)
		if err != nil {
			return nil, err
		}
		r.FsyncP50us, r.CommitP50us, r.RTTP50us = percentile(fsync, 50), percentile(commit, 50), percentile(rtt, 50)
		for _, p := range paths {
			if l.o.Only != "" && !strings.Contains(p.name, l.o.Only) {
				continue
			}
			e.prog.set(p.name, p.n)
			f, err := l.drain(p.name, p.socks, p.refs, p.senders, p.n)
			if err != nil {
				return nil, err
			}
			f.Kind = p.kind
			if f.CommitP50us = r.CommitP50us; f.CommitP50us > 0 && p.senders == 0 {
				f.XCommit, f.FsyncP50us, f.XFsync = f.P50us/f.CommitP50us, r.FsyncP50us, f.P50us/r.FsyncP50us
			}
			r.Figures = append(r.Figures, f)
		}
		res.Runs = append(res.Runs, r)
	}
	res.Goals = goals(res.Runs)
	return res, nil
}

// storesNote says where the leaves' stores are when not beside the hub's (for the header).
func (l *leafEnv) storesNote() string {
	if l.stores == l.dir {
		return ""
	}
	return ", the leaves' stores in " + l.o.LeafState
}

// cpu is the user+system CPU time of the hub and of the leaves together, in µs (-1: unknown).
func (l *leafEnv) cpu() (hub, leaves float64) {
	get := func(c *exec.Cmd) float64 {
		d, err := peercred.Proc{}.CPUTime(c.Process.Pid)
		if err != nil {
			return -1
		}
		return us(d)
	}
	hub = get(l.hub)
	for _, c := range l.leaves {
		v := get(c)
		if v < 0 {
			return hub, -1
		}
		leaves += v
	}
	return hub, leaves
}

// drain: senders post n messages to refs on the hub's http.sock (message i to refs[i mod
// len(refs)]; a 503 is retried after 1 ms) while one consumer on each of socks drains
// svc:bench there; each text carries its send time. With no senders (and one sock), one
// client sends one message at a time, the next once the consumer has it: the latency of the
// path itself, with no backlog in it.
func (l *leafEnv) drain(name string, socks, refs []string, senders, n int) (Figure, error) {
	lockstep := senders == 0
	senders = max(senders, 1)
	received := make(chan struct{}, 1)
	type consumer struct {
		c net.Conn
		r *bufio.Reader
		// waiting (under mu) is set once a poll is written, until its answer is read: the
		// consumer writes nothing meanwhile, so its write side may be shut (see below).
		waiting bool
	}
	send := func(c *consumer, v any) error {
		raw, _ := json.Marshal(v)
		_, err := c.c.Write(append(raw, '\n'))
		return err
	}
	recv := func(c *consumer) (map[string]any, error) {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var out map[string]any
		return out, json.Unmarshal(line, &out)
	}
	call := func(c *consumer, v any) (map[string]any, error) {
		if err := send(c, v); err != nil {
			return nil, err
		}
		return recv(c)
	}
	var cons []*consumer
	defer func() {
		for _, c := range cons {
			c.c.Close()
		}
	}()
	for _, sock := range socks {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return Figure{}, err
		}
		cn := &consumer{c: c, r: bufio.NewReaderSize(c, 1<<20)}
		cons = append(cons, cn)
		if got, err := call(cn, map[string]any{"harness": "svc", "name": "bench", "cwd": "/"}); err != nil || got["status"] != "ok" {
			return Figure{}, fmt.Errorf("bench: register svc:bench on %s: %v %v", sock, got, err)
		}
	}
	var (
		mu   sync.Mutex
		lat  []float64
		dups int
		seen = map[string]bool{}
		last time.Time
		all  = make(chan struct{})
		// running counts the consumers still serving: the connections are closed only once
		// none is, each having had its last ack answered, or the next path's consumer would
		// be handed the row whose ack was cut off, and count it as one of its own.
		running = len(cons)
		// tag marks this path's messages: a row of an earlier path (delivered again) is not
		// counted as one of them, but as delivered twice.
		tag = fmt.Sprintf("p=%d", time.Now().UnixNano())
	)
	defer func() {
		// A consumer whose poll (carrying its last ack) waits for a message that will not come
		// is ended by shutting its write side: the daemon reads the frame (and takes the
		// ack) before it sees the end, then ends the poll and closes the connection.
		shut := make([]bool, len(cons))
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			k := running
			for i, cn := range cons {
				if cn.waiting && !shut[i] {
					shut[i] = true
					cn.c.(*net.UnixConn).CloseWrite()
				}
			}
			mu.Unlock()
			if k == 0 {
				return
			}
		}
	}()
	got := make(chan error, len(cons))
	hub0, leaves0 := l.cpu()
	cpu0 := machineCPU()
	t0 := time.Now()
	for _, cn := range cons {
		go func() {
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
			}()
			var ack string // the row received last, acked by the next poll
			for {
				poll := map[string]any{"action": "poll", "waitSecs": 30}
				if ack != "" {
					poll["ack"] = ack
				}
				if err := send(cn, poll); err != nil {
					got <- err
					return
				}
				mu.Lock()
				cn.waiting = true
				mu.Unlock()
				m, err := recv(cn)
				mu.Lock()
				cn.waiting = false
				mu.Unlock()
				if err != nil {
					got <- err
					return
				}
				if m["status"] == "error" {
					got <- fmt.Errorf("bench: %s: poll: %v", name, m)
					return
				}
				if ack != "" && m["messageId"] == ack {
					got <- fmt.Errorf("bench: %s: the daemon ignored the ack carried by the poll", name)
					return
				}
				ack = ""
				if m["action"] == "timeout" {
					mu.Lock()
					k := len(seen)
					mu.Unlock()
					if k >= n {
						got <- nil
						return
					}
					got <- fmt.Errorf("bench: %s: nothing for 30 s after %d messages", name, k)
					return
				}
				id, _ := m["messageId"].(string)
				text, _ := m["text"].(string)
				ack = id
				mu.Lock()
				fresh := !seen[id] && strings.Contains(text, " "+tag+" ")
				if !fresh {
					dups++
				} else {
					seen[id] = true
					l.e.prog.tick(1)
					if ts, ok := strings.CutPrefix(text, "t="); ok {
						ts, _, _ = strings.Cut(ts, " ")
						if sent, err := strconv.ParseInt(ts, 10, 64); err == nil {
							lat = append(lat, us(time.Duration(time.Now().UnixNano()-sent)))
						}
					}
					if len(seen) == n {
						last = time.Now()
						close(all)
					}
				}
				mu.Unlock()
				if lockstep && fresh {
					select {
					case received <- struct{}{}:
					default:
					}
				}
				select {
				case <-all:
					// Nothing more comes: the last row's ack goes on its own.
					if m, err := call(cn, map[string]any{"action": "ack", "messageId": id}); err != nil || m["status"] != "ok" {
						got <- fmt.Errorf("bench: %s: ack: %v %v", name, m, err)
						return
					}
					got <- nil
					return
				default:
				}
			}
		}()
	}
	var refused atomic.Int64
	var next atomic.Int64
	errs := make(chan error, senders)
	pad := ""
	if n := l.o.Size - 40 - len(tag) - 1; n > 0 {
		pad = strings.Repeat("x", n)
	}
	for range senders {
		go func() {
			h, err := dialHTTP(l.hubHTTP)
			if err != nil {
				errs <- err
				return
			}
			defer h.close()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				ref := refs[int(i)%len(refs)]
				for {
					body, _ := json.Marshal(map[string]string{"from": "bench", "text": fmt.Sprintf("t=%d i=%d %s %s", time.Now().UnixNano(), i, tag, pad)})
					st, raw, err := h.do("POST", "/v1/sessions/"+ref+"/messages", body)
					if err != nil {
						errs <- err
						return
					}
					if st == 202 {
						if lockstep {
							select {
							case <-received:
							case <-time.After(30 * time.Second):
								errs <- fmt.Errorf("bench: %s: message %d never reached the consumer", name, i)
								return
							}
						}
						break
					}
					if st != 503 {
						errs <- fmt.Errorf("bench: send to %s: %d %s", ref, st, raw)
						return
					}
					refused.Add(1)
					time.Sleep(time.Millisecond)
				}
			}
			errs <- nil
		}()
	}
	for range senders {
		if err := <-errs; err != nil {
			return Figure{}, err
		}
	}
	select {
	case <-all:
	case err := <-got:
		if err != nil {
			return Figure{}, err
		}
		<-all
	}
	mu.Lock()
	wall, k, twice := last.Sub(t0), len(seen), dups
	mu.Unlock()
	f := Figure{Path: name, N: k, PerSec: float64(k) / wall.Seconds(), P50us: percentile(lat, 50), P99us: percentile(lat, 99),
		Refused: int(refused.Load()), Duplicates: twice, Note: "received by the consumers per second; p50/p99 from the send to the consumer"}
	if cpu0 >= 0 {
		f.MachineCPUus = (machineCPU() - cpu0) / float64(k)
	}
	if hub1, leaves1 := l.cpu(); hub0 >= 0 && hub1 >= 0 {
		f.CPUus = (hub1 - hub0) / float64(k)
		if leaves0 >= 0 && leaves1 >= 0 && !strings.Contains(name, "on the hub") {
			f.LeafCPUus = (leaves1 - leaves0) / float64(k)
		}
	}
	return f, nil
}
