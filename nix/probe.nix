# probe.nix -- the isolation probe of vmtests/probe, the same program the nspawn test runs.
#
# The VM tests install it and configure the daemon with svcExecutables.probe pointing at it,
# so that a probe process can also attest as service "probe" on its own tier's bus.
{ lib, buildGo126Module }:
let
  source = import ./source.nix { inherit lib; };
in
buildGo126Module {
  pname = "xmsg-probe";
  inherit (source) version src vendorHash;
  subPackages = [ "vmtests/probe" ];
  # The probe is test tooling; xmsg's own build runs the test suite.
  doCheck = false;
  meta = {
    description = "Isolation probe for the xmsg tier tests";
    mainProgram = "probe";
    platforms = lib.platforms.linux;
  };
}
