# module.nix -- NixOS module: one hardened, socket-activated xmsg bus per tier.
#
#   services.xmsg.tiers.<name> = { settings = { ... }; federation = { ... }; ... };
#
# A tier is an OS user. Its bus runs as that user and only that user can reach it: the socket
# directory /run/xmsg-<name>/xmsg is 0700, every socket is 0600, and the daemon closes any
# connection whose SO_PEERCRED uid is not its own -- three independent layers.
#
# The units are the package's (nix/package.nix installs systemd/'s xmsg@.service and
# xmsg-{http,agent,register}@.socket), the same hardened units a Debian host runs; the reasons
# for every key are written there. `systemd.packages` enables them, and per tier this module
# adds only what differs, as drop-ins:
#   xmsg@<name>.service.d: ExecStart= with `settings` as flags; where configured the tier's
#     user and group, LoadCredential= lines, the session directories (created before the
#     start, bound read-only from the home trees) and federation's network relaxations
#   xmsg-{http,agent,register}@<name>.socket.d: wanted by sockets.target; the socket owner
#     when the tier runs as an existing user
# plus the tier user and its runtime directories (tmpfiles). The unit's restart policy comes
# with it unchanged: Restart=on-failure, and RestartPreventExitStatus=65, so a tier whose store
# the daemon refused (damaged, or of a newer format) stays failed instead of restarting every
# second. Addresses are not checked here:
# the daemon parses them and refuses a bad one at start, in the journal.
{ config, lib, pkgs, ... }:
let
  inherit (lib) mkOption mkEnableOption types literalExpression;

  topConfig = config;
  cfg = config.services.xmsg;
  enabledTiers = lib.filterAttrs (_: tier: tier.enable) cfg.tiers;
  defaultUser = name: "xmsg-${name}";

  # The daemon's federation credentials (docs/protocol.md §10.1): the option naming the source
  # file and the name the daemon looks up in $CREDENTIALS_DIRECTORY.
  credentialList = [
    { option = "certFile"; name = "fed-cert"; what = "federation certificate (PEM)"; }
    { option = "keyFile"; name = "fed-key"; what = "federation private key (PEM)"; }
    { option = "caFile"; name = "fed-ca"; what = "CA bundle (PEM) for the certificates of CA-trusted peers"; }
    { option = "peersFile"; name = "peers"; what = "peers file (JSON, docs/protocol.md §8.2), instead of {option}`peers`"; }
  ];

  # The peers JSON holds addresses, pins and policy, no secrets, so it may live in the store.
  peersJSON = name: tier: pkgs.writeText "xmsg-${name}-peers.json" (builtins.toJSON tier.federation.peers);

  # Every credential of a tier: [ { name, source, secret, opt } ], federation's and custody's.
  credentials =
    name: tier:
    let
      f = tier.federation;
      fed = map (c: {
        inherit (c) name;
        secret = c.name == "fed-key";
        opt = "federation.${c.option}";
        source = if c.name == "peers" && f.peers != { } then peersJSON name tier else f.${c.option};
      }) credentialList;
      custody = lib.mapAttrsToList (n: c: { name = "custody-${n}"; secret = true; opt = "custody.${n}.file"; source = c.file; }) tier.custody;
    in
    lib.filter (c: c.source != null) (fed ++ custody);

  fedEnabled = f: f.listenAddress != null || f.peers != { } || f.peersFile != null;

  # toString never copies a path into the store (interpolation would: a key must never go there).
  pathString = p: if builtins.isPath p then toString p else "${p}";

  # "IP:PORT" or "[IPv6]:PORT" -> { family, host, port } as strings, without judging them.
  hostPort =
    addr:
    let
      v6 = lib.hasPrefix "[" addr;
      parts = if v6 then lib.splitString "]:" (lib.removePrefix "[" addr) else lib.splitString ":" addr;
    in
    {
      family = if v6 then "ipv6" else "ipv4";
      host = lib.head parts;
      port = lib.last parts;
    };
  # IPAddressAllow= takes addresses only; a peer named by hostname needs an explicit entry.
  isIPLiteral = a: a.family == "ipv6" || lib.all (c: lib.elem c (lib.stringToCharacters "0123456789.")) (lib.stringToCharacters a.host);

  # IP literals among the peers' addresses and source ranges: the default IPAddressAllow=.
  peerIPs =
    tier:
    let
      host = peer: lib.optional (peer ? address && isIPLiteral (hostPort peer.address)) (hostPort peer.address).host;
    in
    lib.unique (lib.concatLists (lib.mapAttrsToList (_: peer: host peer ++ peer.from or [ ]) tier.federation.peers));

  # Flags the module sets itself from typed options or the units, refused in `settings`.
  viaCredential = opt: "use ${opt} (credentials travel through LoadCredential=)";
  socketFlag = "the sockets are the socket units' (socket activation)";
  leafFlag = "leaf mode is for containers (deploy/), not for a tier";
  ownedFlags = {
    listen = "--listen opens a TCP HTTP listener without the peer check; a tier's only TCP port is federation.listenAddress";
    fed-listen = "use federation.listenAddress (its port also becomes SocketBindAllow= and the firewall rule)";
    fed-cert = viaCredential "federation.certFile";
    fed-key = viaCredential "federation.keyFile";
    fed-ca = viaCredential "federation.caFile";
    peers-file = viaCredential "federation.peers or federation.peersFile";
    custody = viaCredential "custody.<name>";
    sessions-dir = "use sessionDirs (the unit creates them and binds them read-only)";
    svc-exe = "use svcExecutables";
    http-sock = socketFlag;
    agent-sock = socketFlag;
    register-sock = socketFlag;
    db-path = "the store is $STATE_DIRECTORY/xmsg.db, private to the tier";
    leaf = leafFlag;
    leaf-principal = leafFlag;
    leaf-register-sock = leafFlag;
  };

  # systemd's own quoting for Exec*= lines (not a shell): a JSON string is a valid C-style
  # quoted word; % and $ would otherwise be expanded by systemd.
  execLine = lib.concatMapStringsSep " " (
    arg: lib.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (builtins.toJSON arg)
  );

  # `settings` plus what the typed options mean to the daemon, as `--key=value` words
  # (null and false: no flag; true: the bare flag; a list: the flag once per element).
  serveArgs =
    tier:
    [ "serve" ]
    ++ lib.cli.toCommandLineGNU { } (
      tier.settings
      // {
        sessions-dir = tier.sessionDirs;
        svc-exe = lib.mapAttrsToList (svc: exe: "${svc}=${pathString exe}") tier.svcExecutables;
        fed-listen = tier.federation.listenAddress;
        # The secret itself is the credential custody-<name>; the flag carries the policy only.
        custody = lib.mapAttrsToList (n: c: "${n}=${lib.concatStringsSep "," c.allow}") tier.custody;
      }
    );

  # The unit hides these trees (ProtectHome=yes): what the daemon reads below them is bound back.
  underHome = dir: lib.any (prefix: lib.hasPrefix prefix (dir + "/")) [ "/home/" "/root/" "/run/user/" ];
  # What harness attestation reads (settings codex-home, one or a list, and agy-presence-dir).
  attestationDirs =
    tier:
    lib.toList (tier.settings.codex-home or [ ])
    ++ lib.optional ((tier.settings.agy-presence-dir or null) != null) tier.settings.agy-presence-dir;

  # The drop-in on the package's xmsg@.service for one tier.
  tierService =
    name: tier:
    let
      creds = credentials name tier;
      homeDirs = lib.filter underHome (tier.sessionDirs ++ attestationDirs tier);
      f = tier.federation;
      listen = hostPort f.listenAddress;
    in
    {
      overrideStrategy = "asDropin";
      serviceConfig =
        {
          # Replaces the unit's `xmsg serve --require-landlock` (require-landlock is a setting).
          ExecStart = [ "" (execLine ([ (lib.getExe cfg.package) ] ++ serveArgs tier)) ];
        }
        // lib.optionalAttrs (tier.user != defaultUser name) { User = tier.user; }
        // lib.optionalAttrs (tier.group != defaultUser name) { Group = tier.group; }
        // lib.optionalAttrs (creds != [ ]) {
          # Source files stay root-owned 0400; systemd copies them into $CREDENTIALS_DIRECTORY,
          # readable by this service alone, and the daemon reads them there by name.
          LoadCredential = map (c: "${c.name}:${pathString c.source}") creds;
        }
        // lib.optionalAttrs (tier.sessionDirs != [ ]) {
          # Landlock can only cover directories that exist when the daemon starts, and inside
          # the read-only unit it cannot create them. So create missing ones first, as the tier
          # user, outside the sandbox ("+"; runuser drops to the user, so the home's
          # permissions apply), 0700 like Claude itself. "-": a failure leaves a directory
          # missing, which the daemon reports as sessions_dir_missing.
          ExecStartPre =
            "-+"
            + execLine (
              [ "${pkgs.util-linux}/bin/runuser" "-u" tier.user "--" ]
              ++ [ "${pkgs.coreutils}/bin/mkdir" "-p" "-m" "0700" "--" ]
              ++ tier.sessionDirs
            );
        }
        // lib.optionalAttrs (homeDirs != [ ]) {
          # RELAXED for sessionDirs (and codex-home / agy-presence-dir): the home trees become
          # empty read-only tmpfs instead of inaccessible, and only these directories are bound
          # back, read-only ("-": a missing one is skipped and the daemon reports it).
          ProtectHome = "tmpfs";
          BindReadOnlyPaths = map (dir: "-${dir}") homeDirs;
        }
        // lib.optionalAttrs (fedEnabled f) (
          {
            # RELAXED for federation, as systemd/examples/xmsg@public.service.d/federation.conf:
            # the daemon dials its peers itself, so it needs the host's network namespace and
            # IP sockets (added to the unit's AF_UNIX). IPAddressDeny=any stays: only the peers
            # are allowed, and no port can be bound but the listener's.
            PrivateNetwork = false;
            RestrictAddressFamilies = [ "AF_INET AF_INET6" ];
            IPAddressAllow = f.ipAddressAllow;
            SocketBindDeny = "any";
          }
          // lib.optionalAttrs (f.listenAddress != null) {
            SocketBindAllow = "${listen.family}:tcp:${listen.port}";
          }
        );
    };

  # The drop-in on one of the package's socket templates for one tier.
  tierSocket = name: tier: {
    overrideStrategy = "asDropin";
    # The units are socket activated: the sockets are enabled, the service is not.
    wantedBy = [ "sockets.target" ];
    socketConfig =
      lib.optionalAttrs (tier.user != defaultUser name) { SocketUser = tier.user; }
      // lib.optionalAttrs (tier.group != defaultUser name) { SocketGroup = tier.group; };
  };

  # A credential is a file's location, never its contents.
  credentialOption =
    c:
    mkOption {
      type = types.nullOr (types.either types.path types.str);
      default = null;
      example = "/etc/xmsg/public/${c.name}";
      description = ''
        Path of the ${c.what}, a file owned by root with mode 0400 (for example under
        /etc/xmsg/<tier>/). systemd hands a copy to the service as the credential `${c.name}`
        (`LoadCredential=`), so the file itself stays unreadable to every tier user. Give the
        path as a string: the contents never belong in the Nix configuration${lib.optionalString (c.name == "fed-key") ", and a Nix path literal would copy the key into the world-readable Nix store"}.
      '';
    };

  custodyOptions = {
    options = {
      file = mkOption {
        # A string, never a Nix path: a path literal would copy the secret into the store.
        type = types.str;
        example = "/etc/xmsg/trusted/matrix-token";
        description = ''
          Path of the secret, a file owned by root with mode 0400. systemd hands a copy to the
          service as the credential `custody-<name>`; the daemon keeps it in memory only.
        '';
      };
      allow = mkOption {
        type = types.nonEmptyListOf types.str;
        example = [ "svc:matrix-xmsg" ];
        description = "The attested principals that may receive the secret (`svc:<name>`).";
      };
    };
  };

  tierModule =
    { name, config, ... }:
    {
      options = {
        enable = mkEnableOption "the xmsg bus of this tier" // { default = true; };

        user = mkOption {
          type = types.str;
          default = defaultUser name;
          defaultText = literalExpression ''"xmsg-''${name}"'';
          example = "agent";
          description = ''
            The OS user of this tier: the daemon runs as this user, its sockets belong to it, and
            only its processes (the tier's agent sessions and services) can use the bus. Every
            tier needs its own user. Name an existing account to use it instead of a new one.
          '';
        };

        group = mkOption {
          type = types.str;
          default = let g = topConfig.users.users.${config.user}.group or ""; in if config.createUser || g == "" then config.user else g;
          defaultText = literalExpression "if createUser then user else config.users.users.\${user}.group";
          description = "The group of the tier's sockets and daemon (the sockets are 0600 regardless).";
        };

        createUser = mkOption {
          type = types.bool;
          default = config.user == defaultUser name;
          defaultText = literalExpression ''user == "xmsg-''${name}"'';
          # Static rather than DynamicUser=: the socket files must belong to the tier user
          # before the daemon first runs, and the tier's clients run as that user.
          description = "Whether to create {option}`user` and {option}`group` as a static system user.";
        };

        svcExecutables = mkOption {
          type = types.attrsOf types.path;
          default = { };
          example = literalExpression ''{ matrix-xmsg = "''${pkgs.matrix-xmsg}/bin/matrix-xmsg"; }'';
          description = ''
            Trusted service daemons of this tier (`--svc-exe NAME=PATH`). A process registering
            as service `NAME` is admitted only if it runs as the tier user and its executable is
            exactly `PATH` (symlinks resolved). Use Nix store paths so that the pin cannot be
            swapped underneath.
          '';
        };

        sessionDirs = mkOption {
          type = types.listOf types.str;
          default = [ ];
          example = [ "/home/agent/.claude/sessions" ];
          description = ''
            Claude Code session directories this tier's bus discovers sessions in
            (`--sessions-dir`). The daemon reads them only. Missing ones are created (as the
            tier user, mode 0700) before the daemon starts. Those under /home, /root or
            /run/user are bound read-only into the otherwise empty home trees of the service.
          '';
        };

        custody = mkOption {
          type = types.attrsOf (types.submodule custodyOptions);
          default = { };
          example = literalExpression ''{ token = { file = "/etc/xmsg/trusted/token"; allow = [ "svc:matrix-xmsg" ]; }; }'';
          description = ''
            Secrets the tier's daemon holds and hands, as a sealed file descriptor, only to the
            principals in `allow` (`--custody NAME=svc:a,svc:b`). Each `file` reaches the daemon
            as the credential `custody-<name>` through `LoadCredential=`.
          '';
        };

        settings = mkOption {
          default = { };
          example = literalExpression ''{ host-label = "laptop"; max-body = 131072; log-level = "debug"; }'';
          description = ''
            Flags of `xmsg serve` (see `xmsg serve --help`), without the leading dashes:
            `{ max-body = 1024; }` becomes `--max-body=1024`, `true` the bare flag, `false` and
            `null` no flag, a list the flag once per element. The flags that the typed options
            of this module set and `--listen` are refused here. systemd's own resource limits
            go into `systemd.services."xmsg@<name>".serviceConfig` (e.g. `MemoryMax`).
          '';
          type = types.submodule {
            freeformType = types.attrsOf (types.nullOr (types.oneOf [ types.bool types.int types.str (types.listOf types.str) ]));
            options = {
              require-landlock = mkOption {
                type = types.bool;
                default = true;
                description = "Refuse to start unless the kernel enforces the daemon's Landlock sandbox (see {option}`security.lsm`).";
              };
            };
          };
        };

        federation = {
          listenAddress = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "192.0.2.10:7788";
            description = ''
              Address of this tier's mTLS federation listener, `IP:PORT` or `[IPv6]:PORT`
              (`--fed-listen`; the daemon refuses `0.0.0.0` and `::`). Its port is the only TCP
              port the tier may bind (`SocketBindAllow=`). `null`: none (peers are dialled only).
            '';
          };

          openFirewall = mkOption {
            type = types.bool;
            default = false;
            description = "Whether to open the port of {option}`listenAddress` in the firewall.";
          };

          peers = mkOption {
            # The fields of the peers file pass through; the daemon checks them at start.
            type = types.attrsOf (types.attrsOf types.anything);
            default = { };
            example = literalExpression ''{ desktop = { address = "192.0.2.20:7788"; pin = "sha256:…"; allow = [ "send" ]; }; }'';
            description = ''
              Federation peers (the daemon's peers file, docs/protocol.md §8.2), written to a
              JSON file in the Nix store (addresses, pins and policy, no secrets) and delivered
              as the credential `peers`. Mutually exclusive with {option}`peersFile`.
            '';
          };

          ipAddressAllow = mkOption {
            type = types.listOf types.str;
            default = peerIPs config;
            defaultText = literalExpression "the IP literals among the peers' address and from fields";
            example = [ "192.0.2.0/24" ];
            description = ''
              The service's `IPAddressAllow=` (the unit's `IPAddressDeny=any` stays): the peers'
              addresses, and the DNS server's if peers are named by hostname.
            '';
          };
        }
        // lib.listToAttrs (map (c: lib.nameValuePair c.option (credentialOption c)) credentialList);
      };
    };

  check = assertion: message: { inherit assertion message; };
  tierAssertions =
    name: tier:
    let
      opt = "services.xmsg.tiers.${name}";
      f = tier.federation;
      credentialChecks = lib.concatMap (c:
        let s = pathString c.source; in [
          (check (lib.hasPrefix "/" s && !(lib.hasInfix "\n" s))
            "${opt}.${c.opt} must be the absolute path of a file, never the credential itself.")
          (check (!(c.secret && builtins.isPath c.source))
            "${opt}.${c.opt} is a Nix path literal: the secret would be copied into the world-readable Nix store. Give its location as a string, e.g. \"/etc/xmsg/${name}/${c.name}\".")
          (check (!(c.secret && lib.hasPrefix "${builtins.storeDir}/" s))
            "${opt}.${c.opt} points into the Nix store, which every user can read. Keep the secret in a root-owned 0400 file outside the store, e.g. /etc/xmsg/${name}/${c.name}.")
        ]) (credentials name tier);
      ownedChecks = map (flag: check false "${opt}.settings.${flag}: ${ownedFlags.${flag}}.") (
        lib.intersectLists (lib.attrNames tier.settings) (lib.attrNames ownedFlags)
      );
    in
    [
      # Tier names become user names (xmsg-<name>, at most 32 characters), unit instance
      # names and paths under /run and /var/lib.
      (check (builtins.match "[a-z0-9][a-z0-9_-]{0,26}" name != null)
        "services.xmsg.tiers: the tier name \"${name}\" must match [a-z0-9][a-z0-9_-]* and have at most 27 characters.")
      (check (tier.user != "root" && tier.group != "root")
        "${opt}: a tier must not run as root (user and group): root can reach every tier, so the tier would isolate nothing.")
      (check (lib.all (k: builtins.match "[a-z][a-z0-9-]*" k != null) (lib.attrNames tier.settings))
        "${opt}.settings: keys are flag names without dashes (e.g. max-body), got ${lib.concatStringsSep ", " (lib.attrNames tier.settings)}.")
      (check (f.listenAddress == null || f.peers != { } || f.peersFile != null)
        "${opt}.federation.listenAddress needs peers (federation.peers or federation.peersFile): the listener admits only configured peers.")
      (check (!(f.peers != { } && f.peersFile != null))
        "${opt}.federation: set either peers or peersFile, not both.")
      (check (!(fedEnabled f) || (f.certFile != null && f.keyFile != null))
        "${opt}.federation needs certFile and keyFile (mTLS) when a listener or peers are configured.")
      # What Nix can know of the addresses: an empty allow list blocks every peer.
      (check (!(fedEnabled f) || f.ipAddressAllow != [ ])
        "${opt}.federation.ipAddressAllow is empty, so IPAddressDeny=any would block every peer. List the peers' addresses (and the DNS server's, for peers named by hostname).")
      (check (lib.all (svc: builtins.match "(svc:)?[A-Za-z0-9._-]{1,32}" svc != null) (lib.attrNames tier.svcExecutables))
        "${opt}.svcExecutables: service names must match [A-Za-z0-9._-]{1,32}.")
      (check (lib.all (exe: lib.hasPrefix "/" (pathString exe) && !(lib.hasInfix "," (pathString exe))) (lib.attrValues tier.svcExecutables))
        "${opt}.svcExecutables: every executable must be an absolute path without commas.")
      (check (lib.all (dir: lib.hasPrefix "/" dir && builtins.match ".*[:[:space:]].*" dir == null) tier.sessionDirs)
        "${opt}.sessionDirs: every directory must be an absolute path without ':' or whitespace.")
      # custody-<name> is a credential name and NAME=... a flag value.
      (check (lib.all (n: builtins.match "[A-Za-z0-9._-]+" n != null) (lib.attrNames tier.custody))
        "${opt}.custody: secret names must match [A-Za-z0-9._-]+.")
      (check (lib.all (c: lib.all (p: p != "" && !(lib.hasInfix "," p)) c.allow) (lib.attrValues tier.custody))
        "${opt}.custody: every principal in allow must be non-empty and without commas (e.g. \"svc:matrix-xmsg\").")
    ]
    ++ ownedChecks
    ++ credentialChecks;

  # Every OS user serves at most one tier: the uid is the isolation boundary.
  tiersByUser = lib.groupBy (t: t.user) (lib.mapAttrsToList (name: tier: { inherit name; inherit (tier) user; }) enabledTiers);

  forTiers = f: lib.concatLists (lib.mapAttrsToList f enabledTiers);
  createdTiers = lib.filterAttrs (_: tier: tier.createUser) enabledTiers;
in
{
  options.services.xmsg = {
    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./package.nix { };
      defaultText = literalExpression "pkgs.callPackage <xmsg>/nix/package.nix { }";
      description = "The xmsg package: the daemon and its systemd units (lib/systemd/system).";
    };

    tiers = mkOption {
      type = types.attrsOf (types.submodule tierModule);
      default = { };
      example = literalExpression ''{ public = { }; trusted = { user = "agent"; sessionDirs = [ "/home/agent/.claude/sessions" ]; }; }'';
      description = ''
        The xmsg tiers of this machine. Each tier `<name>` is one bus, run by its own OS user,
        with its sockets in /run/xmsg-<name>/xmsg/ (clients: `XDG_RUNTIME_DIR=/run/xmsg-<name>`),
        its store in /var/lib/xmsg-<name>/ and the package's units xmsg@<name>.service and
        xmsg-{http,agent,register}@<name>.socket, started on the first connection. The
        operator's guide is `<package>/share/doc/xmsg/operations.md`.
      '';
    };
  };

  # No mkIf around the whole: every value below is empty without tiers anyway.
  config = {
    assertions =
      lib.mapAttrsToList (user: tiers: check (lib.length tiers == 1)
        "services.xmsg: tiers ${lib.concatMapStringsSep ", " (t: t.name) tiers} all run as user ${user}. The OS user is the isolation boundary between tiers: give every tier its own user."
      ) tiersByUser
      ++ forTiers tierAssertions;

    users.users = lib.mapAttrs' (
      name: tier:
      lib.nameValuePair tier.user {
        isSystemUser = true;
        group = tier.group;
        description = lib.mkDefault "xmsg bus, tier ${name}";
        home = lib.mkDefault "/var/lib/xmsg-${name}";
      }
    ) createdTiers;
    users.groups = lib.mapAttrs' (_: tier: lib.nameValuePair tier.group { }) createdTiers;

    systemd.packages = lib.optional (enabledTiers != { }) cfg.package;
    systemd.services = lib.mapAttrs' (name: tier: lib.nameValuePair "xmsg@${name}" (tierService name tier)) enabledTiers;
    systemd.sockets = lib.listToAttrs (
      forTiers (name: tier: map (s: lib.nameValuePair "xmsg-${s}@${name}" (tierSocket name tier)) [ "http" "agent" "register" ])
    );

    # Both directories must exist, 0700 and owned by the tier user, BEFORE the sockets start:
    # DirectoryMode= would create them owned by root, and the daemon refuses a socket directory
    # it does not own. RuntimeDirectory= exists only while the service runs, after the sockets.
    systemd.tmpfiles.rules = forTiers (
      name: tier: [
        "d /run/xmsg-${name} 0700 ${tier.user} ${tier.group} -"
        "d /run/xmsg-${name}/xmsg 0700 ${tier.user} ${tier.group} -"
      ]
    );

    networking.firewall.allowedTCPPorts = forTiers (
      _: { federation, ... }:
      lib.optional (federation.openFirewall && federation.listenAddress != null) (lib.toInt (hostPort federation.listenAddress).port)
    );
  };
}
