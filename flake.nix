{
  description = "xmsg: a per-user local message bus, deployed as hardened socket-activated tiers";

  # nixos-unstable, pinned in flake.lock. go.mod says `go 1.26.0`; nix/package.nix builds with
  # this nixpkgs' buildGo126Module (any Go 1.26 patch release, no toolchain download).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      linuxSystems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      # The daemon also builds for macOS (a laptop bus without systemd); the NixOS module and
      # the VM tests are Linux only.
      allSystems = linuxSystems ++ [
        "x86_64-darwin"
        "aarch64-darwin"
      ];
      forSystems = systems: f: lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});
    in
    {
      packages = forSystems allSystems (
        system: pkgs:
        {
          xmsg = pkgs.callPackage ./nix/package.nix { };
          default = self.packages.${system}.xmsg;
        }
        // lib.optionalAttrs (lib.hasSuffix "-linux" system) {
          # The isolation probe shared by the nspawn test and the VM tests.
          probe = pkgs.callPackage ./nix/probe.nix { };
          # The OCI image (non-root, read-only root filesystem), e.g. for the leaf pod of
          # deploy/kubernetes: `nix build .#image && docker image load -i result`.
          image = pkgs.callPackage ./nix/image.nix { inherit (self.packages.${system}) xmsg; };
        }
      );

      # A module value, not a bare path: Nix 2.8's `flake check` rejects a path as a module.
      # nix/module.nix alone defaults the package to pkgs.callPackage ./nix/package.nix, built
      # with the host's nixpkgs; through the flake it defaults to this flake's build, whose
      # pinned nixpkgs has the Go that go.mod asks for.
      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ (import ./nix/module.nix) ];
          services.xmsg.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        };
      nixosModules.xmsg = self.nixosModules.default;

      overlays.default = final: _prev: { xmsg = final.callPackage ./nix/package.nix { }; };

      # NixOS VM tests (need KVM): `nix flake check` or `nix build .#checks.x86_64-linux.isolation`.
      checks = forSystems linuxSystems (
        system: pkgs:
        let
          args = {
            inherit pkgs;
            inherit (self.packages.${system}) xmsg probe;
            module = self.nixosModules.default;
          };
        in
        {
          # Builds the daemon and runs `go test ./...` inside the build sandbox.
          package = self.packages.${system}.xmsg;
          isolation = pkgs.testers.runNixOSTest (import ./vmtests/isolation.nix args);
          activation = pkgs.testers.runNixOSTest (import ./vmtests/activation.nix args);
          federation = pkgs.testers.runNixOSTest (import ./vmtests/federation.nix args);
        }
      );

      devShells = forSystems allSystems (_system: pkgs: {
        default = pkgs.mkShell {
          packages = [
            pkgs.go_1_26
            pkgs.gopls
            pkgs.nixfmt
          ];
        };
      });

      # Module tests that need nothing but nixpkgs' lib: the list of failed cases, [] when all
      # pass. CI evaluates them offline against github:nix-community/nixpkgs.lib:
      #   nix eval --json .#lib.moduleTests --override-input nixpkgs path:<nixpkgs.lib checkout>
      lib.moduleTests = import ./nix/tests/module-tests.nix { inherit lib; };
    };
}
