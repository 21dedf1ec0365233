# isolation.nix -- NixOS VM test: two tiers on one machine cannot reach each other.
#
# Tier "public" runs as the module's static user xmsg-public; tier "trusted" runs as an
# existing account, trusted-agent (the user that would run that tier's agent sessions), with a
# Claude session dir in that account's home (ProtectHome=tmpfs plus a read-only bind). Both
# are driven by vmtests/probe, the same program the nspawn test runs, which must attest as
# service "probe" on its own bus (svcExecutables.probe).
#
# Properties, one block each, each with a positive control:
#   - the runtime/socket directories and sockets have the modes and owners of systemd/;
#   - the first connection starts a tier's service, and the daemon runs its Landlock sandbox;
#   - from each tier user, the own bus works (probe own) while every path to the other tier
#     fails with a permission error: its sockets, socket and state directories, and markers
#     planted in its state dir, runtime dir, credential source and home (probe other);
#   - with the other tier's directory and socket modes relaxed by root, the daemon's peer
#     check alone closes the connection without a byte (probe gate);
#   - credential sources under /etc/xmsg stay unreadable to both tier users, while the service
#     gets its copy through LoadCredential=;
#   - no xmsg TCP listener, in the host's network namespace or the daemons' (ss, probe notcp);
#   - systemd-analyze security: exposure <= 1.0 for both services.
#
# Run: nix build .#checks.x86_64-linux.isolation (needs KVM).
{
  pkgs,
  xmsg,
  probe,
  module,
}:
{
  name = "xmsg-isolation";

  nodes.machine =
    { pkgs, ... }:
    {
      imports = [ module ];

      services.xmsg = {
        package = xmsg;
        tiers = {
          public.svcExecutables.probe = "${probe}/bin/probe";
          trusted = {
            user = "trusted-agent";
            svcExecutables.probe = "${probe}/bin/probe";
            # Not there yet: the unit creates it as trusted-agent and binds it read-only.
            sessionDirs = [ "/home/trusted-agent/.claude/sessions" ];
          };
        };
      };

      users.users.trusted-agent = {
        isNormalUser = true;
        group = "trusted-agent";
        home = "/home/trusted-agent";
        createHome = true;
        homeMode = "700";
      };
      users.groups.trusted-agent = { };
      # A home of its own for the static tier user too, so that both tiers have one to plant
      # a marker in (the module's default home is the state directory).
      users.users.xmsg-public = {
        home = "/home/xmsg-public";
        createHome = true;
        homeMode = "700";
      };

      # A credential per tier, only to prove the source stays root-only while the service gets
      # its copy (federation is the module's only user of credentials, and it is not tested
      # here). The files are created by the test script before the first connection.
      systemd.services."xmsg@public".serviceConfig.LoadCredential = [ "marker:/etc/xmsg/public/marker" ];
      systemd.services."xmsg@trusted".serviceConfig.LoadCredential = [ "marker:/etc/xmsg/trusted/marker" ];

      environment.systemPackages = [
        probe
        pkgs.curl
        pkgs.iproute2
      ];
    };

  testScript = ''
    TIERS = {"public": "xmsg-public", "trusted": "trusted-agent"}
    HOMES = {"public": "/home/xmsg-public", "trusted": "/home/trusted-agent"}
    SOCKETS = ("http", "agent", "register")

    def other(tier):
        return "trusted" if tier == "public" else "public"

    def as_user(user, cmd):
        return f"runuser -u {user} -- {cmd}"

    def markers(tier):
        return [
            f"/var/lib/xmsg-{tier}/marker",
            f"/run/xmsg-{tier}/marker",
            f"{HOMES[tier]}/marker",
        ]

    machine.wait_for_unit("multi-user.target")
    # The daemons run with --require-landlock; without the LSM they could not start at all.
    machine.succeed("grep -qw landlock /sys/kernel/security/lsm")
    for t in TIERS:
        for s in SOCKETS:
            machine.wait_for_unit(f"xmsg-{s}@{t}.socket")

    with subtest("directories and sockets: owners and modes as in systemd/"):
        for t, u in TIERS.items():
            for d in (f"/run/xmsg-{t}", f"/run/xmsg-{t}/xmsg"):
                machine.succeed(f"test \"$(stat -c '%U %a %F' {d})\" = '{u} 700 directory'")
            for s in SOCKETS:
                machine.succeed(
                    f"test \"$(stat -c '%U %a %F' /run/xmsg-{t}/xmsg/{s}.sock)\" = '{u} 600 socket'"
                )
        # positive control: the same check does tell owners apart
        machine.fail("test \"$(stat -c '%U' /run/xmsg-public)\" = 'trusted-agent'")

    with subtest("credential sources: root-only files, created before the first start"):
        for t in TIERS:
            machine.succeed(
                f"install -d -m 0700 /etc/xmsg/{t}"
                f" && echo cred-{t}-$RANDOM > /etc/xmsg/{t}/marker"
                f" && chmod 0400 /etc/xmsg/{t}/marker"
            )

    with subtest("the first connection starts the tier's service, sandboxed by Landlock"):
        for t, u in TIERS.items():
            # positive control for "starts": nothing has connected yet
            machine.fail(f"systemctl is-active xmsg@{t}.service")
            machine.succeed(as_user(u, f"probe own --dir /run/xmsg-{t}/xmsg"))
            machine.wait_for_unit(f"xmsg@{t}.service")
            machine.succeed(f"journalctl -b -u xmsg@{t}.service | grep -q 'landlock: abi='")
            machine.succeed(f"test \"$(stat -c '%U %a' /var/lib/xmsg-{t})\" = '{u} 700'")
        # the trusted tier's Claude session dir was created for it, as its user, before the start
        machine.succeed(
            "test \"$(stat -c '%U %a' /home/trusted-agent/.claude/sessions)\" = 'trusted-agent 700'"
        )
        # ... and the daemon, inside its namespace, sees it
        healthz = "curl -sf --unix-socket /run/xmsg-{}/xmsg/http.sock http://localhost/healthz"
        machine.succeed(as_user("trusted-agent", healthz.format("trusted")) + " | grep -q '\"sessions_dir\":\"ok\"'")
        # positive control: public's default dir (~/.claude/sessions) is hidden by ProtectHome=yes
        machine.succeed(as_user("xmsg-public", healthz.format("public")) + " | grep -q sessions_dir_missing")

    with subtest("plant markers in each tier's state dir, runtime dir and home"):
        for t, u in TIERS.items():
            for m in markers(t):
                # world-readable on purpose: only the tier's directories stand in the way
                machine.succeed(f"echo secret-{t} > {m} && chown {u} {m} && chmod 0644 {m}")
                # positive control: the owning tier user reads it
                machine.succeed(as_user(u, f"cat {m}"))

    with subtest("own bus works, every path to the other tier fails"):
        for t, u in TIERS.items():
            o = other(t)
            machine.succeed(as_user(u, f"probe own --dir /run/xmsg-{t}/xmsg"))
            flags = " ".join(f"--marker {m}" for m in markers(o))
            out = machine.succeed(
                as_user(
                    u,
                    f"probe other --dir /run/xmsg-{o}/xmsg --state /var/lib/xmsg-{o}"
                    f" {flags} --cred /etc/xmsg/{o}/marker --cred /etc/xmsg/{t}/marker",
                )
            )
            machine.log(out)
            # positive control: the probe does report an access that succeeds
            machine.fail(as_user(u, f"probe other --marker /run/xmsg-{t}/marker"))

    with subtest("credentials: the service has its copy, the source stays root-only"):
        for t, u in TIERS.items():
            machine.succeed(f"test -s /run/credentials/xmsg@{t}.service/marker")
            machine.fail(as_user(u, f"cat /etc/xmsg/{t}/marker"))
            machine.fail(as_user(TIERS[other(t)], f"cat /etc/xmsg/{t}/marker"))
            # positive control: the file is there and readable to root
            machine.succeed(f"test -s /etc/xmsg/{t}/marker")

    with subtest("modes relaxed by root: the peer check alone refuses the other tier"):
        for t, u in TIERS.items():
            o = other(t)
            machine.succeed(
                f"chmod 0755 /run/xmsg-{o} /run/xmsg-{o}/xmsg && chmod 0666 /run/xmsg-{o}/xmsg/*.sock"
            )
            for s in SOCKETS:
                machine.succeed(as_user(u, f"probe gate --sock /run/xmsg-{o}/xmsg/{s}.sock"))
            # positive control: through the same relaxed sockets the owner is still answered
            machine.succeed(as_user(TIERS[o], f"probe own --dir /run/xmsg-{o}/xmsg"))
            machine.succeed(
                f"chmod 0600 /run/xmsg-{o}/xmsg/*.sock && chmod 0700 /run/xmsg-{o}/xmsg /run/xmsg-{o}"
            )
        machine.succeed("journalctl -b -u 'xmsg@*' >&2")

    with subtest("no TCP listener in the host's namespace or the daemons'"):
        # positive control: a listener on the legacy port 7787 is seen by both checks
        machine.succeed("systemd-run --unit=tcp-control systemd-socket-activate -l 127.0.0.1:7787 cat")
        machine.wait_until_succeeds("ss -ltnH | grep -q '127.0.0.1:7787'")
        machine.fail(as_user("xmsg-public", "probe notcp --port 7787"))
        machine.succeed("systemctl stop tcp-control")
        machine.fail("ss -ltnpH | grep -q xmsg")
        machine.fail("ss -ltnH | grep -q ':7787'")
        for t, u in TIERS.items():
            pid = machine.succeed(f"systemctl show -p MainPID --value xmsg@{t}.service").strip()
            assert pid not in ("", "0"), f"xmsg@{t} has no main process"
            machine.succeed(f"test -z \"$(nsenter -t {pid} -n ss -ltnH)\"")
            machine.succeed(as_user(u, f"probe notcp --pid {pid} --port 7787"))

    with subtest("systemd-analyze security: exposure at most 1.0"):
        for t in TIERS:
            machine.succeed(f"systemd-analyze security --threshold=10 xmsg@{t}.service >&2")
        # positive control: an unhardened unit does exceed the threshold
        machine.succeed("systemd-run --unit=unhardened sleep infinity")
        machine.fail("systemd-analyze security --threshold=10 unhardened.service")
        machine.succeed("systemctl stop unhardened")
  '';
}
