//go:build linux

package realharness

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/ostest"
)

// NetnsRole is the role of the test binary that runs one harness in a network namespace of
// its own: it brings up loopback, refuses to go on unless loopback is the namespace's only
// interface, serves the fake model on 127.0.0.1, and runs the harness (its arguments after
// the role) under a pseudo-terminal, copying what it shows to $XMSG_RH_SCREEN. Each line on
// its stdin is a JSON string typed into the terminal; EOF ends the harness.
const NetnsRole = "realharness-netns"

// Environment of NetnsRole.
const (
	ScriptEnv   = "XMSG_RH_SCRIPT"   // the name of the model's script (Scripts)
	EvidenceEnv = "XMSG_RH_EVIDENCE" // directory for model request bodies
	ScreenEnv   = "XMSG_RH_SCREEN"   // file the terminal's output is copied to
	// ModelURLEnv is set for the harness: http://127.0.0.1:PORT of the fake model. Arguments
	// and environment values holding "{{MODEL}}" get that URL in its place.
	ModelURLEnv = "XMSG_RH_MODEL_URL"
)

// ModelPort is the fake model's port on the namespace's loopback; ModelURL its base URL.
const (
	ModelPort = "18080"
	ModelURL  = "http://127.0.0.1:" + ModelPort
)

// NetnsCommand returns the command running argv in a new network namespace (and, when not
// root, a user namespace of its own, as `unshare --net --map-current-user`).
func NetnsCommand(script, evidence, screen string, env []string, argv ...string) *exec.Cmd {
	cmd := ostest.Command("", NetnsRole, argv...)
	cmd.Env = append(append(cmd.Env, env...), ScriptEnv+"="+script, EvidenceEnv+"="+evidence, ScreenEnv+"="+screen)
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() != 0 {
		// The user keeps its own uid in the namespace (a harness that finds itself root, or its
		// files owned by an unmapped uid, behaves otherwise than for a user); bringing up
		// loopback takes CAP_NET_ADMIN, which the namespace's creator holds in it and keeps
		// across exec only as an ambient capability.
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Geteuid(), HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getegid(), HostID: os.Getegid(), Size: 1}}
		attr.AmbientCaps = []uintptr{unix.CAP_NET_ADMIN}
	}
	cmd.SysProcAttr = attr
	return cmd
}

// OnlyLoopback brings loopback up and reports an error unless it is the only interface of
// this process's network namespace (read through netlink, which answers for the caller's
// namespace; /sys/class/net shows the namespace that mounted sysfs).
func OnlyLoopback() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("realharness: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("realharness: get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("realharness: set lo up: %w", err)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("realharness: interfaces: %w", err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	if len(names) != 1 || names[0] != "lo" {
		return fmt.Errorf("realharness: the namespace has interfaces %v, not loopback alone: refusing to run a harness", names)
	}
	return nil
}

// Scripts are the model scripts a NetnsRole child can run, by name; a test binary fills it
// before ostest.Main.
var Scripts = map[string]Script{}

// Netns is NetnsRole's body.
func Netns() int {
	if err := netns(); err != nil {
		fmt.Fprintln(os.Stderr, "realharness:", err)
		return 1
	}
	return 0
}

func netns() error {
	if err := OnlyLoopback(); err != nil {
		return err
	}
	script, ok := Scripts[os.Getenv(ScriptEnv)]
	if !ok {
		return fmt.Errorf("no script %q", os.Getenv(ScriptEnv))
	}
	// The namespace is new: nothing else listens in it, so a fixed port is free, and a
	// harness whose configuration must be written before it starts can name it (ModelURL).
	l, err := net.Listen("tcp", "127.0.0.1:"+ModelPort)
	if err != nil {
		return err
	}
	model := &Model{Dir: os.Getenv(EvidenceEnv), Script: script}
	go http.Serve(l, model)
	url := "http://" + l.Addr().String()
	args := os.Args[1:]
	if len(args) == 0 {
		return errors.New("no harness command")
	}
	for i := range args {
		args[i] = strings.ReplaceAll(args[i], "{{MODEL}}", url)
	}
	cmd := exec.Command(args[0], args[1:]...)
	for _, e := range os.Environ() {
		if strings.HasPrefix(e, ostest.RoleEnv+"=") {
			continue
		}
		cmd.Env = append(cmd.Env, strings.ReplaceAll(e, "{{MODEL}}", url))
	}
	cmd.Env = append(cmd.Env, ModelURLEnv+"="+url)
	screen, err := os.OpenFile(os.Getenv(ScreenEnv), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer screen.Close()
	pty, err := StartPTY(cmd)
	if err != nil {
		return err
	}
	defer pty.Close()
	go io.Copy(screen, pty)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			var s string
			if json.Unmarshal(in.Bytes(), &s) == nil {
				pty.Write([]byte(s))
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
	}()
	err = <-done
	fmt.Fprintf(screen, "\n[realharness] harness exited: %v\n", err)
	return nil
}
