//go:build !linux

package main

import (
	"errors"
	"os"
)

var errExecLinux = errors.New("xmsg exec: credential custody needs Linux")

func reserveFDs([]credentialWant) error       { return errExecLinux }
func placeFD(*os.File, int) error             { return errExecLinux }
func execve(string, []string, []string) error { return errExecLinux }
