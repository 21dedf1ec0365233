#!/bin/sh
# vendor-hash.sh -- recompute buildGoModule's vendorHash for nix/source.nix, offline, without nixpkgs.
#
# nixpkgs' buildGoModule runs `go mod vendor` in a fixed-output derivation and takes the NAR
# hash (sha256, SRI form) of the resulting vendor/ directory. This script does the same in a
# temporary copy of the module, so the repository itself never gets a vendor/ directory.
#
# Usage:  nix/vendor-hash.sh          print the hash
#         nix/vendor-hash.sh --check  also compare it with nix/source.nix (exit 1 on mismatch)
# Needs: go (the version in go.mod or newer; GOTOOLCHAIN=local as in nixpkgs) with the module
# cache or network, and Nix >= 2.4 for `nix hash path` (Debian: apt-get install nix-bin).
#
# Run it whenever go.mod, go.sum or the set of imported packages changes: `go mod vendor` only
# copies packages that the module's code (including tests) imports, so a new import of an
# already-required module changes the hash too.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# The Go files of the module as the next commit will have them: tracked plus untracked but not
# ignored (a flake only sees tracked files, so commit new files before building with Nix).
# Outside git, every .go file of the tree.
mkdir "$tmp/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$root" && git ls-files -z --cached --others --exclude-standard -- go.mod go.sum '*.go' |
		xargs -0 -r sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' sh |
		xargs -0 -r cp --parents -t "$tmp/src")
else
	(cd "$root" && find . -name .git -prune -o -name vendor -prune -o \
		\( -name '*.go' -o -name go.mod -o -name go.sum \) -type f -print0 |
		xargs -0 -r cp --parents -t "$tmp/src")
fi
[ -d "$tmp/src/vendor" ] && { echo "vendor-hash.sh: the tree has a vendor/ directory; buildGoModule would refuse it" >&2; exit 1; }

# The same environment as nixpkgs' goModules derivation: module mode, no toolchain download.
(cd "$tmp/src" && GO111MODULE=on GOTOOLCHAIN=local GOWORK=off GOFLAGS= go mod vendor)
# buildGoModule refuses an empty vendor dir ("please set vendorHash = null").
[ -n "$(ls -A "$tmp/src/vendor" 2>/dev/null)" ] || { echo "vendor-hash.sh: go mod vendor produced nothing; vendorHash would be null" >&2; exit 1; }

hash=$(nix --extra-experimental-features nix-command hash path --type sha256 --sri "$tmp/src/vendor")
echo "$hash"

if [ "${1:-}" = --check ]; then
	want=$(sed -n 's/^[[:space:]]*vendorHash[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$root/nix/source.nix")
	if [ "$hash" != "$want" ]; then
		echo "vendor-hash.sh: nix/source.nix has vendorHash = \"$want\"; go mod vendor gives \"$hash\"" >&2
		exit 1
	fi
fi
