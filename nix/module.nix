# module.nix -- NixOS module: one hardened, socket-activated xmsg bus per tier.
#
#   services.xmsg.tiers.<name> = { settings = { ... }; federation = { ... }; ... };
#
# A tier is an OS user. Its bus runs as that user and only that user can reach it: the socket
# directory /run/xmsg-<name>/xmsg is 0700, every socket is 0600, and the daemon closes any
# connection whose SO_PEERCRED uid is not its own -- three independent layers. No tier has a
# TCP listener except an explicitly configured federation port on a specific address.
#
# Typed options exist only where the module itself has to act (users, units, credentials,
# session directories, the federation's network allow lists). Every other daemon flag is a
# key of the freeform `settings`, rendered to `--key=value` (RFC 42 style), so a new daemon
# flag needs no new option here.
#
# Per tier the module generates exactly what systemd/ ships for non-Nix hosts (keep the two in
# sync; vmtests/nix_test.go compares them key for key, with and without federation):
#   xmsg-http@<name>.socket, xmsg-agent@<name>.socket, xmsg-register@<name>.socket
#     ListenStream=/run/xmsg-<name>/xmsg/{http,agent,register}.sock, FileDescriptorName= the
#     socket's name, 0600 owned by the tier user, Service=xmsg@<name>.service
#   xmsg@<name>.service
#     the daemon (`xmsg serve`), started on the first connection, with systemd/'s hardening;
#     federating: systemd/examples/xmsg@public.service.d/{credentials,federation}.conf on top
#   tmpfiles: /run/xmsg-<name> and /run/xmsg-<name>/xmsg, 0700, owned by the tier user
#   state:    /var/lib/xmsg-<name> (StateDirectory=, 0700)
#   user:     xmsg-<name> (static system user and group) unless an existing user is chosen
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib)
    mkOption
    mkEnableOption
    mkIf
    types
    literalExpression
    ;

  topConfig = config;
  cfg = config.services.xmsg;
  enabledTiers = lib.filterAttrs (_: tier: tier.enable) cfg.tiers;

  socketNames = [
    "http"
    "agent"
    "register"
  ];
  runtimeDir = name: "/run/xmsg-${name}";
  socketDir = name: "${runtimeDir name}/xmsg";
  serviceUnit = name: "xmsg@${name}.service";
  socketUnit = name: sock: "xmsg-${sock}@${name}";

  # ---- credentials: declared once ---------------------------------------------------------
  # The daemon's credentials (docs/protocol.md §10.1): the federation option naming the source
  # file, and the name the daemon looks up in $CREDENTIALS_DIRECTORY. Everything below (the
  # options, LoadCredential=, the checks) is generated from this list.
  credentialList = [
    {
      option = "certFile";
      name = "fed-cert";
      what = "federation certificate (PEM)";
      secret = false;
    }
    {
      option = "keyFile";
      name = "fed-key";
      what = "federation private key (PEM)";
      secret = true;
    }
    {
      option = "caFile";
      name = "fed-ca";
      what = "CA bundle (PEM) for the certificates of CA-trusted peers";
      secret = false;
    }
    {
      option = "peersFile";
      name = "peers";
      what = "peers file (JSON, docs/protocol.md §8.2), instead of {option}`peers`";
      secret = false;
    }
  ];

  # The peers JSON holds addresses, pins and policy, no secrets, so it may live in the Nix
  # store; it still travels as the credential "peers" like the rest.
  peersJSON =
    name: tier:
    pkgs.writeText "xmsg-${name}-peers.json" (
      builtins.toJSON (lib.mapAttrs (_: peer: lib.filterAttrs (_: v: v != null) peer) tier.federation.peers)
    );
  credentialSource =
    name: tier: c:
    if c.name == "peers" && tier.federation.peers != { } then
      peersJSON name tier
    else
      tier.federation.${c.option};
  # The configured credentials of a tier: [ { name, source, ... } ].
  credentials =
    name: tier:
    lib.filter (c: c.source != null) (map (c: c // { source = credentialSource name tier c; }) credentialList);

  fedEnabled =
    tier:
    tier.federation.listenAddress != null
    || tier.federation.peers != { }
    || tier.federation.peersFile != null;

  # toString never copies a path into the store (interpolation would: a key must never go there).
  pathString = p: if builtins.isPath p then toString p else "${p}";

  # "IP:PORT" with an IPv4 literal or a bracketed IPv6 literal: [ host port ] or null.
  splitListen =
    addr:
    let
      v4 = builtins.match "([0-9]{1,3}([.][0-9]{1,3}){3}):([0-9]{1,5})" addr;
      v6 = builtins.match "\\[([0-9A-Fa-f:.]+)]:([0-9]{1,5})" addr;
    in
    if v4 != null then
      {
        family = "ipv4";
        host = builtins.elemAt v4 0;
        port = lib.toInt (builtins.elemAt v4 2);
      }
    else if v6 != null then
      {
        family = "ipv6";
        host = builtins.elemAt v6 0;
        port = lib.toInt (builtins.elemAt v6 1);
      }
    else
      null;
  # 0.0.0.0, ::, 0::0, ...: nothing but zeros and separators (every interface).
  isUnspecified = host: builtins.match "[0.:]*" host != null;
  validListen =
    addr:
    let
      l = splitListen addr;
    in
    l != null && !(isUnspecified l.host) && l.port >= 1 && l.port <= 65535;

  # IP literals among the peers' addresses and source ranges: the default IPAddressAllow=.
  peerIPs =
    tier:
    lib.unique (
      lib.concatLists (
        lib.mapAttrsToList (
          _: peer:
          let
            l = if peer.address == null then null else splitListen peer.address;
          in
          lib.optional (l != null) l.host ++ (if peer.from == null then [ ] else peer.from)
        ) tier.federation.peers
      )
    );

  # ---- the daemon's command line -------------------------------------------------------------

  # Flags the module sets itself from typed options or the unit, refused in `settings`.
  ownedFlags = {
    listen = "--listen opens a TCP HTTP listener without the peer check; a tier's only TCP port is federation.listenAddress";
    fed-listen = "use federation.listenAddress (its port also becomes SocketBindAllow= and the firewall rule)";
    fed-cert = "use federation.certFile (credentials travel through LoadCredential=)";
    fed-key = "use federation.keyFile (credentials travel through LoadCredential=)";
    fed-ca = "use federation.caFile (credentials travel through LoadCredential=)";
    peers-file = "use federation.peers or federation.peersFile (credentials travel through LoadCredential=)";
    sessions-dir = "use sessionDirs (the unit creates them and binds them read-only)";
    svc-exe = "use svcExecutables";
    http-sock = "the sockets are the socket units' (socket activation)";
    agent-sock = "the sockets are the socket units' (socket activation)";
    register-sock = "the sockets are the socket units' (socket activation)";
    db-path = "the store is $STATE_DIRECTORY/xmsg.db, private to the tier";
    leaf = "leaf mode is for containers (deploy/), not for a tier";
    leaf-principal = "leaf mode is for containers (deploy/), not for a tier";
    leaf-register-sock = "leaf mode is for containers (deploy/), not for a tier";
  };

  # systemd's own quoting for ExecStart= (not a shell): a JSON string is a valid C-style quoted
  # word; % and $ would otherwise be expanded by systemd.
  escapeExecArg =
    arg:
    lib.replaceStrings
      [
        "%"
        "$"
      ]
      [
        "%%"
        "$$"
      ]
      (builtins.toJSON arg);

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
      }
    );

  # Session dirs under a hidden tree are bind-mounted back read-only (see ProtectHome= below).
  homeTrees = [
    "/home/"
    "/root/"
    "/run/user/"
  ];
  underHome = dir: lib.any (prefix: lib.hasPrefix prefix (dir + "/")) homeTrees;

  # What harness attestation reads (settings: codex-home, a string or a list, and
  # agy-presence-dir): the daemon only reads there, so under a hidden home tree these are
  # bound back read-only like the session directories; without that the daemon would find
  # them missing and attest no Codex or Antigravity session.
  attestationDirs =
    tier:
    lib.toList (tier.settings.codex-home or [ ])
    ++ lib.optional ((tier.settings.agy-presence-dir or null) != null) tier.settings.agy-presence-dir;

  # ---- units -------------------------------------------------------------------------------

  # The same keys and values as systemd/xmsg@.service. Every value is the strictest one unless
  # a comment says why not.
  hardening = {
    # identity and privileges
    NoNewPrivileges = true;
    CapabilityBoundingSet = "";
    AmbientCapabilities = "";
    # RELAXED: no private user namespace. In one, the daemon could not read /proc/<pid>/exe of
    # its clients, which run in the host's user namespace (the kernel's ptrace-read check wants
    # both in the same user namespace, or CAP_SYS_PTRACE over the client's), and svc
    # attestation compares exactly that link. Without any capability (CapabilityBoundingSet=
    # is empty) the host user namespace gives the daemon nothing more.
    PrivateUsers = false;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    RemoveIPC = true;

    # filesystem: everything read-only except the state directory
    ProtectSystem = "strict";
    PrivateMounts = true;
    # Seen with systemd 252: ProtectProc=/ProcSubset= left /run read-write despite
    # ProtectSystem=strict, and with it the socket directory. The daemon never writes there
    # (systemd binds the sockets), so say it again.
    ReadOnlyPaths = [ "/run" ];
    ProtectHome = true;
    PrivateTmp = true;
    PrivateDevices = true;
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectClock = true;
    ProtectHostname = true;
    # Attestation reads /proc/<pid>/{stat,exe} of clients that run OUTSIDE this unit.
    # RELAXED: ProtectProc= stays at its default. "invisible" hides every process the daemon
    # may not ptrace-read, and once the daemon has applied Landlock that is every process
    # outside its own Landlock domain, i.e. all of its clients. Other uids' /proc/<pid> entries
    # stay visible but their contents are ptrace-guarded as usual. ProcSubset=pid still drops
    # everything in /proc that is not a process directory.
    ProcSubset = "pid";

    # network: Unix sockets only, no IP at all
    PrivateNetwork = true;
    RestrictAddressFamilies = [ "AF_UNIX" ];
    IPAddressDeny = "any";
    DevicePolicy = "closed";

    # kernel interfaces
    RestrictNamespaces = true;
    RestrictRealtime = true;
    MemoryDenyWriteExecute = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service"
      # Not in @system-service on every systemd. The daemon restricts itself after start:
      # Landlock, plus a seccomp filter of its own (AF_INET/AF_INET6 only as plain TCP); without
      # these --require-landlock refuses to start. Both can only take privileges away.
      "landlock_create_ruleset landlock_add_rule landlock_restrict_self seccomp"
      "~@privileged @resources"
    ];
    SystemCallErrorNumber = "EPERM";
  };

  docLinks = tier: [
    "file://${tier.package}/share/doc/xmsg/operations.md"
    "file://${tier.package}/share/doc/xmsg/security.md"
  ];

  tierService =
    name: tier:
    let
      sockets = map (sock: "${socketUnit name sock}.socket") socketNames;
      creds = credentials name tier;
      listen = if tier.federation.listenAddress == null then null else splitListen tier.federation.listenAddress;
      homeDirs = lib.filter underHome (tier.sessionDirs ++ attestationDirs tier);
    in
    {
      description = "xmsg message bus, tier ${name}";
      # The operator's guide and the security model, installed by the package (nix/package.nix).
      documentation = docLinks tier;
      # Socket activated: no wantedBy, the first connection to any of the three sockets starts it.
      requires = sockets;
      after = sockets;
      # The daemon derives its default socket paths from this and checks the socket directory.
      environment.XDG_RUNTIME_DIR = runtimeDir name;

      serviceConfig =
        hardening
        // {
          # READY=1 is sent once every socket accepts; only the main process may notify.
          Type = "notify";
          NotifyAccess = "main";
          ExecStart = lib.concatMapStringsSep " " escapeExecArg ([ (lib.getExe tier.package) ] ++ serveArgs tier);
          User = tier.user;
          Group = tier.group;
          # /var/lib/xmsg-<name>: the bbolt store ($STATE_DIRECTORY/xmsg.db), private to the tier.
          StateDirectory = "xmsg-${name}";
          StateDirectoryMode = "0700";
          UMask = "0077";
          # A crash restarts the daemon; queued messages are on disk (fsynced before any
          # answer) and the sockets stay open in systemd meanwhile, so no connection is refused.
          Restart = "on-failure";
          RestartSec = "1s";
          KillSignal = "SIGTERM";
          TimeoutStopSec = "15s";
          # Sized to the daemon's connection caps; the reasons are in systemd/xmsg@.service.
          # Override per tier in systemd.services."xmsg@<name>".serviceConfig.
          LimitNOFILE = 4096;
          MemoryMax = lib.mkDefault "512M";
          TasksMax = lib.mkDefault 1024;
        }
        // lib.optionalAttrs (creds != [ ]) {
          # Source files stay root-owned 0400; systemd copies them into $CREDENTIALS_DIRECTORY,
          # readable by this service alone, and the daemon reads them there by name (no flag).
          LoadCredential = map (c: "${c.name}:${pathString c.source}") creds;
        }
        // lib.optionalAttrs (tier.sessionDirs != [ ]) {
          # The daemon's Landlock rules need each session directory to exist when it starts (a
          # session started later in a missing one would stay invisible), and inside the
          # unit's read-only filesystem the daemon cannot create it. So create missing ones
          # first, as the tier user, in the host's mount namespace ("+": no sandboxing for this
          # one command; runuser drops to the tier user, so permissions of the home apply):
          # mode 0700, like Claude itself. "-": a failure only leaves that directory missing,
          # which the daemon logs and reports as sessions_dir_missing.
          ExecStartPre =
            "-+"
            + lib.concatMapStringsSep " " escapeExecArg (
              [
                "${pkgs.util-linux}/bin/runuser"
                "-u"
                tier.user
                "--"
                "${pkgs.coreutils}/bin/mkdir"
                "-p"
                "-m"
                "0700"
                "--"
              ]
              ++ tier.sessionDirs
            );
        }
        // lib.optionalAttrs (homeDirs != [ ]) {
          # Relaxed for sessionDirs (and the Codex homes / agy presence dir of `settings`): the
          # home trees become empty read-only tmpfs instead of inaccessible, and only those
          # directories are bound back, read-only ("-": a missing one is skipped; the daemon
          # reports it: sessions_dir_missing, or "codex home or agy presence dir missing").
          ProtectHome = "tmpfs";
          BindReadOnlyPaths = map (dir: "-${dir}") homeDirs;
        }
        // lib.optionalAttrs (fedEnabled tier) (
          {
            # Relaxed for federation (systemd/examples/xmsg@public.service.d/federation.conf):
            # the daemon dials its peers itself, so it needs the host's network namespace and
            # IP sockets. What that namespace offers is narrowed instead: IPAddressDeny=any
            # stays and only the peers' addresses are allowed; no port can be bound but the
            # listener's. The daemon's Landlock rules (ABI >= 4) narrow TCP further to that
            # port and the peers' ports.
            PrivateNetwork = false;
            RestrictAddressFamilies = [
              "AF_UNIX"
              "AF_INET"
              "AF_INET6"
            ];
            IPAddressAllow = tier.federation.ipAddressAllow;
            SocketBindDeny = "any";
          }
          // lib.optionalAttrs (listen != null) {
            SocketBindAllow = "${listen.family}:tcp:${toString listen.port}";
          }
        );
    };

  tierSocket = name: tier: sock: {
    description = "xmsg tier ${name}: ${sock} socket";
    documentation = docLinks tier;
    # No partOf = the service, on purpose: then every restart of the service (also
    # Restart=on-failure after a crash) would restart the socket, closing it and resetting every
    # connection waiting in its backlog. The socket outlives the daemon, and a client that
    # connects while the daemon is down is served by the next one.
    wantedBy = [ "sockets.target" ];
    listenStreams = [ "${socketDir name}/${sock}.sock" ];
    socketConfig = {
      # One unit per socket: FileDescriptorName= names every fd of its unit, and the daemon
      # looks its fds up by name, never by position.
      FileDescriptorName = sock;
      Service = serviceUnit name;
      # The tier user alone may connect (plus the directory mode and the daemon's peer check).
      SocketUser = tier.user;
      SocketGroup = tier.group;
      SocketMode = "0600";
      DirectoryMode = "0700";
      # A stopped tier leaves no dead socket file behind.
      RemoveOnStop = true;
    };
  };

  # ---- options -----------------------------------------------------------------------------

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
        path as a string: the contents never belong in the Nix configuration${lib.optionalString c.secret ", and a Nix path literal would copy the key into the world-readable Nix store"}.
      '';
    };

  peerOptions = {
    # The peers file's fields (docs/protocol.md §8.2: pin, ca, identities, allow, leaf, principals,
    # targets) pass through as they are; the daemon checks them and names any error at start.
    # Typed here: the two the module reads to build IPAddressAllow=.
    freeformType = types.attrsOf types.anything;
    options = {
      address = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "192.0.2.20:7788";
        description = "Where to connect to the peer (`host:port`); required unless the peer is a leaf.";
      };
      from = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [ "192.0.2.0/24" ];
        description = "Source addresses (IPs or CIDRs) the peer may connect from.";
      };
    };
  };

  tierModule =
    { name, config, ... }:
    {
      options = {
        enable = mkEnableOption "the xmsg bus of this tier" // {
          default = true;
        };

        package = mkOption {
          type = types.package;
          default = cfg.package;
          defaultText = literalExpression "config.services.xmsg.package";
          description = "The xmsg package this tier runs.";
        };

        user = mkOption {
          type = types.str;
          default = "xmsg-${name}";
          defaultText = literalExpression ''"xmsg-''${name}"'';
          example = "agent";
          description = ''
            The OS user of this tier. The daemon runs as this user, its sockets belong to it,
            and only processes of this user can use the bus: the agent sessions and service
            daemons of the tier must run as this same user. Every tier needs its own user.

            The default is a static system user created by this module. Give the name of an
            existing user (for example the account that runs the tier's agent sessions) and
            leave {option}`createUser` false to use that one instead.
          '';
        };

        group = mkOption {
          type = types.str;
          default =
            if config.createUser then
              config.user
            else
              let
                g = topConfig.users.users.${config.user}.group or "";
              in
              if g != "" then g else config.user;
          defaultText = literalExpression ''
            if createUser then user else config.users.users.''${user}.group
          '';
          description = "The group of the tier's sockets and daemon (the sockets are 0600 regardless).";
        };

        createUser = mkOption {
          type = types.bool;
          default = config.user == "xmsg-${name}";
          defaultText = literalExpression ''user == "xmsg-''${name}"'';
          description = ''
            Whether to create {option}`user` (and {option}`group`) as a static system user with
            home /var/lib/xmsg-<name>. Static rather than `DynamicUser=`: the socket files must
            belong to the tier user before the daemon first runs, and the tier's clients run as
            that user.
          '';
        };

        svcExecutables = mkOption {
          type = types.attrsOf types.path;
          default = { };
          example = literalExpression ''
            { matrix-xmsg = "''${pkgs.matrix-xmsg}/bin/matrix-xmsg"; }
          '';
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
            tier user, mode 0700) before the daemon starts, because its Landlock sandbox can
            only cover directories that exist. Directories under /home, /root or /run/user are
            bound read-only into the otherwise empty home trees of the service; everything
            else is visible read-only anyway.
          '';
        };

        settings = mkOption {
          default = { };
          example = {
            host-label = "laptop";
            max-body = 131072;
            log-level = "debug";
            fed-reload-interval-secs = 60;
          };
          description = ''
            Flags of `xmsg serve` (see `xmsg serve --help`), without the leading dashes:
            `{ max-body = 1024; }` becomes `--max-body=1024`, `true` the bare flag, `false` and
            `null` no flag, a list the flag once per element. The flags that the typed options
            of this module set (sockets, store, session directories, services, federation
            listener and credentials) and `--listen` are refused here. systemd's own resource
            limits go into `systemd.services."xmsg@<name>".serviceConfig` (e.g. `MemoryMax`).
          '';
          type = types.submodule {
            freeformType = types.attrsOf (
              types.nullOr (
                types.oneOf [
                  types.bool
                  types.int
                  types.str
                  (types.listOf types.str)
                ]
              )
            );
            options = {
              require-landlock = mkOption {
                type = types.bool;
                default = true;
                description = ''
                  Refuse to start unless the kernel enforces the daemon's Landlock sandbox. The
                  kernel must have Landlock enabled (see {option}`security.lsm`); the journal's
                  `landlock:` line says what is enforced.
                '';
              };
              host-label = mkOption {
                type = types.nullOr types.str;
                default = null;
                example = "laptop";
                description = ''
                  The host label in sender badges and `id@host` addressing, and this tier's own
                  name in federation. `null`: the machine's hostname.
                '';
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
              Address of this tier's mTLS federation listener, `IP:PORT` (`--fed-listen`),
              IPv6 as `[addr]:port`. It must be a specific address: `0.0.0.0` and `::` are
              refused. This is the only TCP port a tier may bind (`SocketBindAllow=`). `null`:
              none (a tier with peers only dials out).
            '';
          };

          openFirewall = mkOption {
            type = types.bool;
            default = false;
            description = "Whether to open the port of {option}`listenAddress` in the firewall.";
          };

          peers = mkOption {
            type = types.attrsOf (types.submodule peerOptions);
            default = { };
            example = literalExpression ''
              {
                desktop = {
                  address = "192.0.2.20:7788";
                  pin = "sha256:…";
                  allow = [ "send" "reply" ];
                };
              }
            '';
            description = ''
              Federation peers (the daemon's peers file, docs/protocol.md §8.2), written to a JSON
              file in the Nix store (it holds addresses, pins and policy, no secrets) and
              delivered as the credential `peers`. Mutually exclusive with {option}`peersFile`.
            '';
          };

          ipAddressAllow = mkOption {
            type = types.listOf types.str;
            default = peerIPs config;
            defaultText = literalExpression "the IP literals among the peers' address and from fields";
            example = [ "192.0.2.0/24" ];
            description = ''
              The service's `IPAddressAllow=` (`IPAddressDeny=any` stays): every address the
              tier may exchange packets with, i.e. its peers (and the DNS server if peers are
              named by hostname).
            '';
          };
        }
        // lib.listToAttrs (map (c: lib.nameValuePair c.option (credentialOption c)) credentialList);
      };
    };

  # ---- checks ------------------------------------------------------------------------------

  tierAssertions =
    name: tier:
    let
      opt = "services.xmsg.tiers.${name}";
      f = tier.federation;
      credentialChecks = lib.concatMap (
        c:
        let
          v = f.${c.option};
          s = if v == null then "" else toString v;
        in
        lib.optionals (v != null) [
          {
            assertion = lib.hasPrefix "/" s && builtins.match ".*[\n\r].*" s == null;
            message = "${opt}.federation.${c.option} must be the absolute path of a file, never the credential itself.";
          }
          {
            assertion = !(c.secret && builtins.isPath v);
            message = "${opt}.federation.${c.option} is a Nix path literal: the key would be copied into the world-readable Nix store. Give its location as a string, e.g. \"/etc/xmsg/${name}/${c.name}\".";
          }
          {
            assertion = !(c.secret && lib.hasPrefix "${builtins.storeDir}/" s);
            message = "${opt}.federation.${c.option} points into the Nix store, which every user can read. Keep the key in a root-owned 0400 file outside the store, e.g. /etc/xmsg/${name}/${c.name}.";
          }
        ]
      ) credentialList;
      ownedChecks = map (flag: {
        assertion = false;
        message = "${opt}.settings.${flag}: ${ownedFlags.${flag}}.";
      }) (lib.intersectLists (lib.attrNames tier.settings) (lib.attrNames ownedFlags));
    in
    [
      {
        # Tier names become user names (xmsg-<name>, at most 32 characters), unit instance
        # names and paths under /run and /var/lib.
        assertion = builtins.match "[a-z0-9][a-z0-9_-]{0,26}" name != null;
        message = "services.xmsg.tiers: the tier name \"${name}\" must match [a-z0-9][a-z0-9_-]* and have at most 27 characters.";
      }
      {
        assertion = tier.user != "root" && tier.group != "root";
        message = "${opt}: a tier must not run as root (user and group): root can reach every tier, so the tier would isolate nothing.";
      }
      {
        assertion = lib.all (k: builtins.match "[a-z][a-z0-9-]*" k != null) (lib.attrNames tier.settings);
        message = "${opt}.settings: keys are flag names without dashes (e.g. max-body), got ${
          lib.concatStringsSep ", " (lib.attrNames tier.settings)
        }.";
      }
      {
        assertion = f.listenAddress == null || validListen f.listenAddress;
        message = "${opt}.federation.listenAddress = \"${toString f.listenAddress}\": give a specific IP literal and port, \"IP:PORT\" or \"[IPv6]:PORT\"; the unspecified addresses 0.0.0.0 and :: (every interface) are refused.";
      }
      {
        assertion = f.listenAddress == null || f.peers != { } || f.peersFile != null;
        message = "${opt}.federation.listenAddress needs peers (federation.peers or federation.peersFile): the listener admits only configured peers.";
      }
      {
        assertion = !(f.peers != { } && f.peersFile != null);
        message = "${opt}.federation: set either peers or peersFile, not both.";
      }
      {
        assertion = !(fedEnabled tier) || (f.certFile != null && f.keyFile != null);
        message = "${opt}.federation needs certFile and keyFile (mTLS) when a listener or peers are configured.";
      }
      {
        assertion = !(fedEnabled tier) || f.ipAddressAllow != [ ];
        message = "${opt}.federation.ipAddressAllow is empty, so IPAddressDeny=any would block every peer. List the peers' addresses (and the DNS server's, for peers named by hostname).";
      }
      {
        assertion = lib.all (svc: builtins.match "(svc:)?[A-Za-z0-9._-]{1,32}" svc != null) (
          lib.attrNames tier.svcExecutables
        );
        message = "${opt}.svcExecutables: service names must match [A-Za-z0-9._-]{1,32}.";
      }
      {
        assertion = lib.all (
          exe:
          let
            s = pathString exe;
          in
          lib.hasPrefix "/" s && !(lib.hasInfix "," s)
        ) (lib.attrValues tier.svcExecutables);
        message = "${opt}.svcExecutables: every executable must be an absolute path without commas.";
      }
      {
        assertion = lib.all (
          dir: lib.hasPrefix "/" dir && builtins.match ".*[:[:space:]].*" dir == null
        ) tier.sessionDirs;
        message = "${opt}.sessionDirs: every directory must be an absolute path without ':' or whitespace.";
      }
    ]
    ++ ownedChecks
    ++ credentialChecks;

  # Every OS user serves at most one tier: the uid is the isolation boundary.
  tiersByUser = lib.groupBy (t: t.user) (
    lib.mapAttrsToList (name: tier: {
      inherit name;
      inherit (tier) user;
    }) enabledTiers
  );
  sharedUserAssertions = lib.mapAttrsToList (user: tiers: {
    assertion = lib.length tiers == 1;
    message = "services.xmsg: tiers ${lib.concatMapStringsSep ", " (t: t.name) tiers} all run as user ${user}. The OS user is the isolation boundary between tiers: give every tier its own user.";
  }) tiersByUser;
in
{
  options.services.xmsg = {
    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./package.nix { };
      defaultText = literalExpression "pkgs.callPackage <xmsg>/nix/package.nix { }";
      description = "The xmsg package used by every tier unless the tier sets its own.";
    };

    tiers = mkOption {
      type = types.attrsOf (types.submodule tierModule);
      default = { };
      example = literalExpression ''
        {
          public = { };                    # runs as the static user xmsg-public
          trusted = {
            user = "agent";                # an existing user: the one running the agent sessions
            sessionDirs = [ "/home/agent/.claude/sessions" ];
            svcExecutables.matrix-xmsg = "''${pkgs.matrix-xmsg}/bin/matrix-xmsg";
            settings.reply-ttl = 86400;
          };
        }
      '';
      description = ''
        The xmsg tiers of this machine. Each tier `<name>` is one bus, run by its own OS user,
        with its sockets in /run/xmsg-<name>/xmsg/ (clients: `XDG_RUNTIME_DIR=/run/xmsg-<name>`),
        its store in /var/lib/xmsg-<name>/ and its units xmsg@<name>.service and
        xmsg-{http,agent,register}@<name>.socket. The service starts on the first connection.
        No tier can reach another tier's bus, state or credentials.
      '';
    };
  };

  config = lib.mkMerge [
    (mkIf (enabledTiers != { }) {
      assertions = sharedUserAssertions ++ lib.concatLists (lib.mapAttrsToList tierAssertions enabledTiers);

      users.users = lib.mapAttrs' (
        name: tier:
        lib.nameValuePair tier.user {
          isSystemUser = true;
          group = tier.group;
          description = lib.mkDefault "xmsg bus, tier ${name}";
          home = lib.mkDefault "/var/lib/xmsg-${name}";
        }
      ) (lib.filterAttrs (_: tier: tier.createUser) enabledTiers);

      users.groups = lib.mapAttrs' (_: tier: lib.nameValuePair tier.group { }) (
        lib.filterAttrs (_: tier: tier.createUser) enabledTiers
      );

      systemd.sockets = lib.listToAttrs (
        lib.concatLists (
          lib.mapAttrsToList (
            name: tier: map (sock: lib.nameValuePair (socketUnit name sock) (tierSocket name tier sock)) socketNames
          ) enabledTiers
        )
      );

      systemd.services = lib.mapAttrs' (name: tier: lib.nameValuePair "xmsg@${name}" (tierService name tier)) enabledTiers;
    })

    # Defined unconditionally (empty lists without tiers): whether these definitions exist
    # must not depend on the configuration, or an evaluator with a freeform root (the offline
    # nixpkgs shim of CI) recurses through the mkIf condition above.
    {
      # The runtime directory and the socket directory must exist, 0700 and owned by the tier
      # user, BEFORE the socket units start: DirectoryMode= would create them owned by root, and
      # the daemon refuses a socket directory it does not own. RuntimeDirectory= cannot do this:
      # it exists only while the service runs, and the sockets come first.
      systemd.tmpfiles.rules = lib.concatLists (
        lib.mapAttrsToList (name: tier: [
          "d ${runtimeDir name} 0700 ${tier.user} ${tier.group} -"
          "d ${socketDir name} 0700 ${tier.user} ${tier.group} -"
        ]) enabledTiers
      );

      networking.firewall.allowedTCPPorts = lib.concatLists (
        lib.mapAttrsToList (
          _: tier:
          let
            l = tier.federation.listenAddress;
          in
          lib.optional (tier.federation.openFirewall && l != null && validListen l) (splitListen l).port
        ) enabledTiers
      );
    }
  ];
}
