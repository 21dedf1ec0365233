# eval.nix -- evaluate nix/module.nix with nothing but nixpkgs' lib.
#
# The NixOS options that the module writes to are declared here as loose stand-ins (the real
# ones come from nixpkgs/nixos), and pkgs is a stub: enough to check what the module generates
# and which assertions fire, in CI, without nixpkgs. Used by module-tests.nix and
# vmtests/nix_test.go.
{ lib }:
let
  inherit (lib) mkOption types;
  loose = mkOption {
    type = types.attrsOf types.anything;
    default = { };
  };

  stubs = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      warnings = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      users.users = loose;
      users.groups = loose;
      systemd.services = loose;
      systemd.sockets = loose;
      systemd.tmpfiles.rules = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
    };
  };

  # Stands in for the built package: a derivation-shaped attrset (no build happens).
  fakePackage = rec {
    type = "derivation";
    name = "xmsg-0.0.0";
    pname = "xmsg";
    version = "0.0.0";
    outPath = "${builtins.storeDir}/00000000000000000000000000000000-xmsg-0.0.0";
    outputs = [ "out" ];
    out = fakePackage;
    outputName = "out";
    meta.mainProgram = "xmsg";
    meta.description = "xmsg (stand-in)";
  };

  # Stands in for a tool package the module names by path.
  fakeTool = name: {
    type = "derivation";
    inherit name;
    outPath = "${builtins.storeDir}/00000000000000000000000000000000-${name}";
  };

  pkgs = {
    util-linux = fakeTool "util-linux";
    coreutils = fakeTool "coreutils";
    # builtins.toFile needs no build and is content-addressed, so a test can compare the
    # generated file with the expected text by path.
    writeText = name: text: builtins.toFile name text;
    callPackage = _: _: fakePackage;
  };
in
{
  inherit fakePackage;

  # nix/image.nix with a dockerTools stand-in that returns the arguments it was given: what
  # the image would be built from (no build happens, and none is possible without nixpkgs).
  imageArgs = import ../image.nix {
    inherit lib;
    xmsg = fakePackage;
    dockerTools.buildLayeredImage =
      args:
      let
        known = [ "name" "tag" "contents" "config" "fakeRootCommands" "enableFakechroot" "extraCommands" "maxLayers" "passthru" "created" "mtime" "architecture" "includeStorePaths" ];
        unknown = lib.subtractLists known (lib.attrNames args);
      in
      if unknown != [ ] then throw "buildLayeredImage: unknown arguments ${toString unknown}" else args;
  };

  # config: a NixOS-style module (attrset or function) with the settings under test.
  eval =
    config:
    (lib.evalModules {
      modules = [
        stubs
        ../module.nix
        { services.xmsg.package = lib.mkDefault fakePackage; }
        config
      ];
      specialArgs = {
        inherit pkgs;
      };
    }).config;

  failedAssertions = cfg: map (a: a.message) (lib.filter (a: !a.assertion) cfg.assertions);
}
