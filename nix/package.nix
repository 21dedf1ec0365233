# package.nix -- the xmsg binary, built and tested by buildGoModule.
#
# Only ./cmd/xmsg is installed, but the check phase runs the whole module's test suite
# (`go test ./...`). Inside the Nix build sandbox the tests run as an unprivileged build user
# without systemd, nspawn or nix, so the tests that need root, real users, systemd-nspawn or
# nix-instantiate skip themselves there (they t.Fatal only when CI=true, which the sandbox does
# not set); unit, fuzz-seed, socket and Landlock tests run.
# go.mod says `go 1.26.0`: buildGo126Module (nixpkgs' buildGoModule with Go 1.26) builds it with
# any 1.26 patch release and never downloads a toolchain (GOTOOLCHAIN=local).
{ lib, buildGo126Module }:
let
  source = import ./source.nix { inherit lib; };
in
buildGo126Module {
  pname = "xmsg";
  inherit (source) version src vendorHash;

  subPackages = [ "cmd/xmsg" ];

  ldflags = [
    "-s"
    "-w"
    "-X github.com/xmsg/xmsg/internal/version.stamped=${source.version}"
  ];

  # buildGoModule limits `go test` to subPackages; the whole module is tested instead.
  checkPhase = ''
    runHook preCheck
    # The tests must not depend on the builder's (nonexistent) home directory.
    export HOME="$TMPDIR/home"
    mkdir -p "$HOME"
    # Tests may reference their source files; -trimpath is for the installed binary only.
    export GOFLAGS="''${GOFLAGS//-trimpath/}"
    go test -p "$NIX_BUILD_CORES" -vet=off ./...
    runHook postCheck
  '';

  # The documents, and the units of systemd/ for systemd.packages (nix/module.nix enables them
  # and adds per-tier drop-ins). The units stay as systemd/ ships them; only where the binary
  # and the documents live changes. The sysusers.d/tmpfiles.d snippets name example tiers, so
  # they are not installed: the module declares the users and directories of its own tiers.
  postInstall = ''
    install -Dm0644 -t "$out/share/doc/xmsg" README.md docs/*.md
    install -Dm0644 -t "$out/lib/systemd/system" systemd/xmsg@.service systemd/xmsg-*@.socket
    for unit in "$out"/lib/systemd/system/*; do
      substituteInPlace "$unit" --replace-fail file:///usr/local/share/doc/xmsg/ "file://$out/share/doc/xmsg/"
    done
    substituteInPlace "$out/lib/systemd/system/xmsg@.service" --replace-fail /usr/local/bin/xmsg "$out/bin/xmsg"
  '';

  meta = {
    description = "Per-user local message bus for AI agent sessions and services, one instance per tier user";
    mainProgram = "xmsg";
    platforms = lib.platforms.linux ++ lib.platforms.darwin;
  };
}
