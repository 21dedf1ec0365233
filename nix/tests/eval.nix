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
      systemd.packages = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
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

  # The drop-ins NixOS writes for the module's units, as { "<unit>.d/overrides.conf" = text; },
  # for the nspawn stage, which boots them on top of systemd/'s units under a real systemd.
  # The text is what nixos/lib/systemd-lib.nix makes of an overrideStrategy = "asDropin"
  # unit: attrsToSection of serviceConfig/socketConfig (true/false, one line per list
  # element). NixOS also adds Environment= lines (PATH, LOCALE_ARCHIVE, TZDIR) to every
  # service, which no hardening key depends on; they are left out. A unit option this
  # rendering does not know is an error, so that it cannot silently drop what the module sets.
  dropIns =
    cfg:
    let
      toOption =
        x:
        if x == true then
          "true"
        else if x == false then
          "false"
        else
          toString x;
      attrsToSection = as: lib.concatStrings (lib.concatLists (lib.mapAttrsToList (k: v: map (x: "${k}=${toOption x}\n") (lib.toList v)) as));
      render =
        suffix: section: body: name: def:
        let
          unknown = lib.subtractLists [ "overrideStrategy" "wantedBy" body ] (lib.attrNames def);
        in
        if unknown != [ ] then
          throw "dropIns: ${name}: unit options ${toString unknown} are not rendered"
        else if def.overrideStrategy or null != "asDropin" then
          throw "dropIns: ${name}: not a drop-in"
        else
          lib.nameValuePair "${name}.${suffix}.d/overrides.conf" "[${section}]\n${attrsToSection (def.${body} or { })}";
    in
    lib.mapAttrs' (render "service" "Service" "serviceConfig") cfg.systemd.services
    // lib.mapAttrs' (render "socket" "Socket" "socketConfig") cfg.systemd.sockets;
}
