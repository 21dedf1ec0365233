# source.nix -- what every Go build of this repository shares: version, filtered source and the
# hash of the vendored modules.
#
# vendorHash is the NAR hash of `go mod vendor` for this source tree (what buildGoModule's
# fixed-output goModules derivation checks). Recompute it offline with nix/vendor-hash.sh
# whenever go.mod/go.sum or the set of imported packages changes; vmtests/nix_test.go
# (TestVendorHash) compares it whenever go and nix are both installed.
{ lib }:
{
  version = "0.1.0";

  vendorHash = "sha256-V4iqUL36Ec2WmFBeROR20jMZn+368nhpPgBsNW5p4C0=";

  # The Go module and whatever its tests read (testdata, systemd/ units). The Nix files, the
  # lock file and VM tests are left out so that editing them does not rebuild and re-test the
  # daemon; a vendor/ directory never exists in the tree (buildGoModule would refuse it).
  src = lib.cleanSourceWith {
    name = "xmsg-source";
    src = lib.cleanSource ../.;
    filter =
      path: type:
      let
        base = baseNameOf path;
        rel = lib.removePrefix (toString ../. + "/") (toString path);
      in
      !(
        lib.hasSuffix ".nix" base
        || base == "flake.lock"
        || base == "result"
        || lib.hasPrefix "result-" base
        || (type == "directory" && rel == "vendor")
      );
  };
}
