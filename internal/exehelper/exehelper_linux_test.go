//go:build linux

package exehelper

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		if err := Serve(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestExeThroughTheHelper(t *testing.T) {
	c, err := Start(os.Args[0], os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	got, err := c.Exe(sleep.Process.Pid)
	want, _ := filepath.EvalSymlinks(sleep.Path)
	if err != nil || got != want {
		t.Errorf("Exe(sleep) = %q, %v; want %q", got, err, want)
	}
	if _, err := c.Exe(1 << 30); err == nil {
		t.Error("Exe of a pid that does not exist succeeded")
	}
	// After the helper is gone, attestation fails closed.
	c.cmd.Process.Kill()
	c.cmd.Process.Wait()
	if _, err := c.Exe(sleep.Process.Pid); err == nil {
		t.Error("Exe after the helper died succeeded")
	}
}
