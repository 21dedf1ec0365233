// Package vmtests holds the system-level tests of xmsg: the NixOS VM tests (*.nix, run by
// `nix flake check` on a host with KVM), the nspawn harness that runs the same scenarios
// under a real systemd as PID 1 in CI, with the units of systemd/ in their Debian shape and
// with the drop-ins of nix/module.nix in their NixOS shape (nspawn/, nspawn_test.go), the
// offline checks of the Nix files (nix_test.go), and the isolation probe both use (probe/).
package vmtests
