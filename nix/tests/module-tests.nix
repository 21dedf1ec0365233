# module-tests.nix -- tests of nix/module.nix that need nothing but nixpkgs' lib.
#
# Exposed by the flake as lib.moduleTests: the list of FAILED cases (lib.runTests), so `[]` means
# every case passed. Run offline with a nixpkgs.lib checkout:
#   nix eval --json path:.#lib.moduleTests --override-input nixpkgs path:$NIXPKGS_LIB
# or without flakes:
#   nix-instantiate --eval --strict --json -E \
#     'import ./nix/tests/module-tests.nix { lib = import "'$NIXPKGS_LIB'/lib"; }'
#
# Each security property has a positive control next to it (the permitted variant evaluates
# with no failed assertion), so a check that rejects everything fails a test too.
{ lib }:
let
  inherit (import ./eval.nix { inherit lib; }) eval failedAssertions imageArgs fakePackage;

  # An existing account (the agent user of the "trusted" tier), as the host would declare it.
  agentUser = {
    users.users.agent = {
      isNormalUser = true;
      group = "users";
      home = "/home/agent";
    };
  };

  twoTiers = eval {
    imports = [ agentUser ];
    services.xmsg.tiers = {
      public = { };
      trusted.user = "agent";
    };
  };

  # Evaluate one tier "public" with the given settings.
  withPublic = settings: eval { services.xmsg.tiers.public = settings; };
  failuresOf = settings: failedAssertions (withPublic settings);
  # True when some failed assertion's message contains `fragment`.
  failsWith =
    fragment: settings: lib.any (lib.hasInfix fragment) (failuresOf settings);

  fedOK = {
    listenAddress = "192.0.2.10:7788";
    peers.desktop = {
      address = "192.0.2.20:7788";
      pin = "sha256/AAAA";
      allow = [
        "send"
        "reply"
      ];
    };
    certFile = "/etc/xmsg/public/fed-cert";
    keyFile = "/etc/xmsg/public/fed-key";
  };
  fedTier = withPublic { federation = fedOK; };
  fedService = fedTier.systemd.services."xmsg@public".serviceConfig;

  svc = cfg: name: cfg.systemd.services."xmsg@${name}".serviceConfig;
  pub = svc twoTiers "public";
  # The command line that replaces the unit's (the drop-in resets ExecStart= first).
  execOf = s: lib.last s.ExecStart;

  pem = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
in
lib.runTests {
  # ---- users --------------------------------------------------------------------------------

  testStaticUserByDefault = {
    expr = {
      inherit (twoTiers.users.users.xmsg-public) isSystemUser group home;
      groups = lib.attrNames twoTiers.users.groups;
    };
    expected = {
      isSystemUser = true;
      group = "xmsg-public";
      home = "/var/lib/xmsg-public";
      groups = [ "xmsg-public" ];
    };
  };

  testExistingUserIsNotRedeclared = {
    expr = {
      systemUser = twoTiers.users.users.agent ? isSystemUser;
      inherit (twoTiers.services.xmsg.tiers.trusted) createUser group;
      user = (svc twoTiers "trusted").User;
    };
    expected = {
      systemUser = false;
      createUser = false;
      group = "users";
      user = "agent";
    };
  };

  testNoFailedAssertionsForTwoTiers = {
    expr = failedAssertions twoTiers ++ twoTiers.warnings;
    expected = [ ];
  };

  testTwoTiersSharingAUserAreRefused = {
    expr = failedAssertions (eval {
      imports = [ agentUser ];
      services.xmsg.tiers = {
        public.user = "agent";
        trusted.user = "agent";
      };
    });
    expected = [
      "services.xmsg: tiers public, trusted all run as user agent. The OS user is the isolation boundary between tiers: give every tier its own user."
    ];
  };

  testRootTierIsRefused = {
    expr = failsWith "must not run as root" {
      user = "root";
      createUser = false;
    };
    expected = true;
  };

  testBadTierNameIsRefused = {
    expr = lib.any (lib.hasInfix "tier name \"Bad.Name\"") (
      failedAssertions (eval { services.xmsg.tiers."Bad.Name" = { }; })
    );
    expected = true;
  };

  # ---- sockets, runtime and state directories -----------------------------------------------

  testThreeSocketUnitsPerTier = {
    expr = lib.attrNames twoTiers.systemd.sockets;
    expected = [
      "xmsg-agent@public"
      "xmsg-agent@trusted"
      "xmsg-http@public"
      "xmsg-http@trusted"
      "xmsg-register@public"
      "xmsg-register@trusted"
    ];
  };

  # The socket units are the package's: a tier's drop-in only enables them.
  testSocketDropInOnlyEnables = {
    expr = twoTiers.systemd.sockets."xmsg-agent@public";
    expected = {
      overrideStrategy = "asDropin";
      wantedBy = [ "sockets.target" ];
      socketConfig = { };
    };
  };

  testSocketsOfExistingUserTier = {
    expr = {
      inherit (twoTiers.systemd.sockets."xmsg-register@trusted".socketConfig) SocketUser SocketGroup;
    };
    expected = {
      SocketUser = "agent";
      SocketGroup = "users";
    };
  };

  testRuntimeDirsOwnedByTierUser = {
    expr = twoTiers.systemd.tmpfiles.rules;
    expected = [
      "d /run/xmsg-public 0700 xmsg-public xmsg-public -"
      "d /run/xmsg-public/xmsg 0700 xmsg-public xmsg-public -"
      "d /run/xmsg-trusted 0700 agent users -"
      "d /run/xmsg-trusted/xmsg 0700 agent users -"
    ];
  };

  # A default tier's service drop-in holds the command line and nothing else: every other key
  # is the package's unit (systemd/xmsg@.service), hardening included.
  testDefaultTierDropInIsTheCommandLineOnly = {
    expr = {
      inherit (twoTiers.systemd) packages;
      wanted = twoTiers.systemd.services."xmsg@public" ? wantedBy;
      inherit (twoTiers.systemd.services."xmsg@public") overrideStrategy;
      keys = lib.attrNames pub;
      exec = pub.ExecStart;
    };
    expected = {
      packages = [ fakePackage ];
      wanted = false;
      overrideStrategy = "asDropin";
      keys = [ "ExecStart" ];
      exec = [
        ""
        ''"${builtins.storeDir}/00000000000000000000000000000000-xmsg-0.0.0/bin/xmsg" "serve" "--require-landlock"''
      ];
    };
  };

  testDisabledTierGeneratesNothing = {
    expr =
      let
        c = eval {
          services.xmsg.tiers.public.enable = false;
        };
      in
      [
        c.systemd.services
        c.systemd.sockets
        c.users.users
        c.systemd.tmpfiles.rules
        c.systemd.packages
      ];
    expected = [
      { }
      { }
      { }
      [ ]
      [ ]
    ];
  };

  # ---- the command line and what the drop-in adds ----------------------------------------

  testExecStart = {
    expr = execOf (
      svc (withPublic {
        sessionDirs = [ "/srv/claude/sessions" ];
        svcExecutables.probe = "/nix/store/00000000000000000000000000000000-probe/bin/probe";
        settings = {
          host-label = "laptop";
          max-body = 1024;
          log-level = "debug";
        };
      }) "public"
    );
    # Flags in the order of their names (lib.cli renders attribute sets sorted).
    expected = lib.concatStringsSep " " [
      ''"${builtins.storeDir}/00000000000000000000000000000000-xmsg-0.0.0/bin/xmsg"''
      ''"serve" "--host-label=laptop" "--log-level=debug" "--max-body=1024" "--require-landlock"''
      ''"--sessions-dir=/srv/claude/sessions"''
      ''"--svc-exe=probe=/nix/store/00000000000000000000000000000000-probe/bin/probe"''
    ];
  };

  testExecStartEscapesSystemdSpecifiers = {
    expr = lib.hasInfix ''"--host-label=100%%$$HOME"'' (execOf (svc (withPublic { settings.host-label = "100%$HOME"; }) "public"));
    expected = true;
  };

  testLandlockCanBeMadeOptional = {
    expr = lib.hasInfix "--require-landlock" (execOf (svc (withPublic { settings.require-landlock = false; }) "public"));
    expected = false;
  };

  testSessionDirsUnderHomeAreBoundReadOnly = {
    expr =
      let
        s = svc (withPublic {
          sessionDirs = [
            "/home/agent/.claude/sessions"
            "/srv/sessions"
          ];
        }) "public";
      in
      {
        inherit (s) ProtectHome BindReadOnlyPaths;
      };
    expected = {
      ProtectHome = "tmpfs";
      BindReadOnlyPaths = [ "-/home/agent/.claude/sessions" ];
    };
  };

  testAttestationDirsUnderHomeAreBoundReadOnly = {
    expr =
      (svc (withPublic {
        settings.codex-home = [ "/home/agent/.codex" "/srv/codex" ];
        settings.agy-presence-dir = "/run/user/1000/agy";
      }) "public").BindReadOnlyPaths;
    expected = [ "-/home/agent/.codex" "-/run/user/1000/agy" ];
  };

  testMissingSessionDirsAreCreatedAsTheTierUser = {
    expr = {
      pre =
        (svc (withPublic {
          sessionDirs = [
            "/home/agent/.claude/sessions"
            "/srv/sessions"
          ];
        }) "public").ExecStartPre;
      none = pub ? ExecStartPre;
    };
    expected = {
      pre = lib.concatStringsSep " " [
        ''-+"${builtins.storeDir}/00000000000000000000000000000000-util-linux/bin/runuser" "-u" "xmsg-public" "--"''
        ''"${builtins.storeDir}/00000000000000000000000000000000-coreutils/bin/mkdir" "-p" "-m" "0700" "--"''
        ''"/home/agent/.claude/sessions" "/srv/sessions"''
      ];
      none = false;
    };
  };

  testSessionDirMustBeAbsoluteWithoutColon = {
    expr = [
      (failsWith "sessionDirs" { sessionDirs = [ "relative/sessions" ]; })
      (failsWith "sessionDirs" { sessionDirs = [ "/a:/b" ]; })
      (failsWith "sessionDirs" { sessionDirs = [ "/home/agent/.claude/sessions" ]; })
    ];
    expected = [
      true
      true
      false
    ];
  };

  testSvcExecutableNamesAndPaths = {
    expr = [
      (failsWith "svcExecutables" { svcExecutables."bad,name" = "/bin/true"; })
      (failsWith "svcExecutables" { svcExecutables.ok = "/opt/a,b/daemon"; })
      (failsWith "svcExecutables" { svcExecutables.matrix-xmsg = "/opt/matrix/bin/matrix-xmsg"; })
    ];
    expected = [
      true
      true
      false
    ];
  };

  testSettingsAreRenderedAsFlags = {
    expr =
      lib.drop 2 (
        lib.splitString " " (execOf (
          svc (withPublic {
            settings = {
              agent-max-conns = 8;
              agent-idle-timeout = "30s";
              fed-reload-interval-secs = 0;
              log-level = null;
              require-landlock = false;
              some-future-flag = [
                "a"
                "b"
              ];
            };
          }) "public"
        ))
      );
    # 0 is a value, null and false are no flag, a list repeats the flag
    expected = [
      ''"--agent-idle-timeout=30s"''
      ''"--agent-max-conns=8"''
      ''"--fed-reload-interval-secs=0"''
      ''"--some-future-flag=a"''
      ''"--some-future-flag=b"''
    ];
  };

  testSettingsKeysAreFlagNames = {
    expr = [
      (failsWith "keys are flag names" { settings."--max-body" = 1; })
      (failsWith "keys are flag names" { settings.max-body = 1; })
    ];
    expected = [
      true
      false
    ];
  };

  # ---- no TCP listener except federation on a specific address -------------------------------

  testFlagsOwnedByTheModuleAreRefusedInSettings = {
    expr = [
      (failsWith "settings.listen: --listen opens a TCP HTTP listener" { settings.listen = "127.0.0.1:7787"; })
      (failsWith "settings.fed-listen: use federation.listenAddress" { settings.fed-listen = "192.0.2.1:1"; })
      (failsWith "settings.fed-key: use federation.keyFile" { settings.fed-key = "/etc/k"; })
      (failsWith "settings.peers-file: use federation.peers" { settings.peers-file = "/etc/p"; })
      (failsWith "settings.sessions-dir: use sessionDirs" { settings.sessions-dir = [ "/srv/s" ]; })
      (failsWith "settings.db-path" { settings.db-path = "/tmp/x.db"; })
      (failsWith "settings.leaf" { settings.leaf = true; })
      # positive control: a flag the module does not own
      (failuresOf { settings.log-level = "debug"; } == [ ])
    ];
    expected = [
      true
      true
      true
      true
      true
      true
      true
      true
    ];
  };

  # Nix does not judge addresses: the daemon parses --fed-listen and refuses a wildcard or a
  # malformed one at start (its journal line is the error the operator sees).
  testListenAddressIsPassedToTheDaemon = {
    expr = map (addr: lib.hasInfix ''"--fed-listen=${addr}"'' (execOf (svc (withPublic { federation = fedOK // { listenAddress = addr; }; }) "public"))) [
      "0.0.0.0:7788"
      "[2001:db8::1]:7788"
    ];
    expected = [
      true
      true
    ];
  };

  testFederationConfigured = {
    expr = {
      failed = failedAssertions fedTier;
      inherit (fedService)
        PrivateNetwork
        RestrictAddressFamilies
        IPAddressAllow
        SocketBindAllow
        SocketBindDeny
        ;
      # The unit's IPAddressDeny=any stays: the drop-in does not touch it.
      deny = fedService ? IPAddressDeny;
      listen = lib.hasInfix ''"--fed-listen=192.0.2.10:7788"'' (execOf fedService);
      credentialNames = map (c: builtins.head (lib.splitString ":" c)) fedService.LoadCredential;
      credentialSources = lib.take 2 (map (c: lib.last (lib.splitString ":" c)) fedService.LoadCredential);
      # builtins.toFile is content-addressed: the same path means the same JSON text.
      peers = lib.last (lib.splitString ":" (lib.last fedService.LoadCredential));
      # Paths only: no credential ever appears on the command line.
      noPathsInArgs = !(lib.hasInfix "/etc/xmsg" (execOf fedService));
      firewall = fedTier.networking.firewall.allowedTCPPorts;
    };
    expected = {
      failed = [ ];
      PrivateNetwork = false;
      # added to the unit's AF_UNIX (systemd accumulates the allow list)
      RestrictAddressFamilies = [ "AF_INET AF_INET6" ];
      deny = false;
      IPAddressAllow = [ "192.0.2.20" ];
      SocketBindAllow = "ipv4:tcp:7788";
      SocketBindDeny = "any";
      listen = true;
      credentialNames = [
        "fed-cert"
        "fed-key"
        "peers"
      ];
      credentialSources = [
        "/etc/xmsg/public/fed-cert"
        "/etc/xmsg/public/fed-key"
      ];
      peers = builtins.toFile "xmsg-public-peers.json" (
        builtins.toJSON {
          desktop = {
            address = "192.0.2.20:7788";
            pin = "sha256/AAAA";
            allow = [
              "send"
              "reply"
            ];
          };
        }
      );
      noPathsInArgs = true;
      firewall = [ ];
    };
  };

  testFederationOpenFirewall = {
    expr = (withPublic { federation = fedOK // { openFirewall = true; }; }).networking.firewall.allowedTCPPorts;
    expected = [ 7788 ];
  };

  testFederationNeedsCertKeyPeersAndAllowList = {
    expr = [
      (failsWith "needs certFile and keyFile" { federation = removeAttrs fedOK [ "keyFile" ]; })
      (failsWith "listenAddress needs peers" { federation = removeAttrs fedOK [ "peers" ]; })
      (failsWith "either peers or peersFile" { federation = fedOK // { peersFile = "/etc/xmsg/public/peers"; }; })
      (failsWith "ipAddressAllow is empty" {
        federation = fedOK // {
          peers.desktop = {
            address = "desktop.example:7788";
            pin = "sha256/AAAA";
          };
        };
      })
      (failsWith "ipAddressAllow is empty" {
        federation = fedOK // {
          peers.desktop = {
            address = "desktop.example:7788";
            pin = "sha256/AAAA";
          };
          ipAddressAllow = [ "192.0.2.53" ];
        };
      })
    ];
    expected = [
      true
      true
      true
      true
      false
    ];
  };

  # ---- credentials are paths, never contents, and a key never goes into the store ----------

  testInlineCredentialIsRefused = {
    expr = [
      (failsWith "never the credential itself" { federation = fedOK // { keyFile = pem; }; })
      (failsWith "never the credential itself" { federation = fedOK // { certFile = "fed-cert"; }; })
      (failsWith "never the credential itself" { federation = fedOK; })
    ];
    expected = [
      true
      true
      false
    ];
  };

  testKeyAsNixPathLiteralIsRefused = {
    expr = [
      (failsWith "Nix path literal" { federation = fedOK // { keyFile = ./module-tests.nix; }; })
      # a certificate is public: a path literal is acceptable there
      (failsWith "Nix path literal" { federation = fedOK // { certFile = ./module-tests.nix; }; })
    ];
    expected = [
      true
      false
    ];
  };

  testKeyInStoreIsRefused = {
    expr = failsWith "points into the Nix store" {
      federation = fedOK // {
        keyFile = "${builtins.storeDir}/00000000000000000000000000000000-fed-key";
      };
    };
    expected = true;
  };

  testEveryCredentialTravelsByName = {
    expr =
      let
        s = svc (withPublic {
          federation = fedOK // {
            caFile = "/etc/xmsg/public/fed-ca";
            peers = { };
            peersFile = "/etc/xmsg/public/peers";
          };
        }) "public";
      in
      {
        inherit (s) LoadCredential;
        noFlags = !(lib.hasInfix "--fed-cert" (execOf s) || lib.hasInfix "--peers-file" (execOf s));
      };
    expected = {
      LoadCredential = [
        "fed-cert:/etc/xmsg/public/fed-cert"
        "fed-key:/etc/xmsg/public/fed-key"
        "fed-ca:/etc/xmsg/public/fed-ca"
        "peers:/etc/xmsg/public/peers"
      ];
      noFlags = true;
    };
  };

  testOutboundOnlyTierBindsNothing = {
    expr =
      let
        s = svc (withPublic { federation = removeAttrs fedOK [ "listenAddress" ]; }) "public";
      in
      {
        allow = s ? SocketBindAllow;
        inherit (s) SocketBindDeny PrivateNetwork;
        listen = lib.hasInfix "--fed-listen" (execOf s);
      };
    expected = {
      allow = false;
      SocketBindDeny = "any";
      PrivateNetwork = false;
      listen = false;
    };
  };

  # ---- credential custody ------------------------------------------------------------------

  testCustodyTravelsAsCredentialWithItsPolicyAsFlag = {
    expr =
      let
        s = svc (withPublic {
          custody.matrix-token = {
            file = "/etc/xmsg/public/matrix-token";
            allow = [
              "svc:matrix-xmsg"
              "svc:probe"
            ];
          };
        }) "public";
      in
      {
        inherit (s) LoadCredential;
        flag = lib.hasInfix ''"--custody=matrix-token=svc:matrix-xmsg,svc:probe"'' (execOf s);
        noPath = !(lib.hasInfix "/etc/xmsg" (execOf s));
      };
    expected = {
      LoadCredential = [ "custody-matrix-token:/etc/xmsg/public/matrix-token" ];
      flag = true;
      noPath = true;
    };
  };

  testCustodySecretStaysOutOfTheStore = {
    expr = [
      (failsWith "custody.t.file points into the Nix store" {
        custody.t = { file = "${builtins.storeDir}/00000000000000000000000000000000-token"; allow = [ "svc:a" ]; };
      })
      (failsWith "custody.t.file must be the absolute path" { custody.t = { file = "token"; allow = [ "svc:a" ]; }; })
      (failsWith "custody: every principal" { custody.t = { file = "/etc/xmsg/public/t"; allow = [ "svc:a,svc:b" ]; }; })
      (failsWith "settings.custody: use custody" { settings.custody = "t=svc:a"; })
      # positive control
      (failuresOf { custody.t = { file = "/etc/xmsg/public/t"; allow = [ "svc:a" ]; }; } == [ ])
    ];
    expected = [
      true
      true
      true
      true
      true
    ];
  };

  # ---- the OCI image ------------------------------------------------------------------------

  testImageRunsAsNonRootWithTwoWritableVolumes = {
    expr = {
      inherit (imageArgs) name tag;
      inherit (imageArgs.config) User Entrypoint Env;
      volumes = lib.attrNames imageArgs.config.Volumes;
      # nothing but the binary's closure: no shell, no base image, no root-run script
      contents = imageArgs.contents or [ ];
      from = imageArgs ? fromImage || imageArgs ? runAsRoot;
      mountPointsOwned = lib.hasInfix "chown 65532:65532 ./run/xmsg ./var/lib/xmsg" imageArgs.fakeRootCommands;
      mountPointsPrivate = lib.hasInfix "chmod 0700 ./run/xmsg ./var/lib/xmsg" imageArgs.fakeRootCommands;
    };
    expected = {
      name = "xmsg";
      tag = "0.0.0";
      User = "65532:65532";
      Entrypoint = [ "${builtins.storeDir}/00000000000000000000000000000000-xmsg-0.0.0/bin/xmsg" ];
      Env = [
        "XDG_RUNTIME_DIR=/run/xmsg"
        "XDG_STATE_HOME=/var/lib/xmsg"
      ];
      volumes = [
        "/run/xmsg"
        "/var/lib/xmsg"
      ];
      contents = [ ];
      from = false;
      mountPointsOwned = true;
      mountPointsPrivate = true;
    };
  };

  testIPv6ListenerBindsOnlyIPv6 = {
    expr = (svc (withPublic { federation = fedOK // { listenAddress = "[2001:db8::1]:7788"; }; }) "public").SocketBindAllow;
    expected = "ipv6:tcp:7788";
  };
}
