# federation.nix -- NixOS VM test: two hosts federate tier "public" over a pinned mTLS link.
#
# Hosts a (192.168.1.1) and b (192.168.1.2) each run tier "public" with a federation listener
# on their own address (never 0.0.0.0) and the other host as a pinned peer, configured with the
# module's federation options only. Certificates, keys, pins and peers files are made inside
# the VMs at test time, so no key ever enters the Nix store; the module delivers them with
# LoadCredential= from root-only files.
#
# Properties, one block each, each with a positive control:
#   - the credential sources stay unreadable to the tier user; the key never appears in the
#     daemon's command line or environment;
#   - the listener is on the configured address only (nothing on 0.0.0.0/::), the unit carries
#     the federation restrictions (SocketBindAllow=, IPAddressAllow=), and in its cgroup no
#     other port can be bound (NixOS's systemd has the BPF framework these need);
#   - a message sent on a to svc:probe@b is delivered to svc:probe on b with the same id, and
#     b's reply comes back to the sender on a;
#   - outside the policy: a target b does not allow for a is refused (403 op_denied), and a
#     client whose certificate is not pinned is refused at the TLS handshake.
{
  pkgs,
  xmsg,
  probe,
  module,
}:
let
  ips = {
    a = "192.168.1.1";
    b = "192.168.1.2";
  };
  peerOf = {
    a = "b";
    b = "a";
  };

  node =
    self:
    { pkgs, ... }:
    {
      imports = [ module ];

      services.xmsg = {
        package = xmsg;
        tiers.public = {
          settings.host-label = self;
          svcExecutables.probe = "${probe}/bin/probe";
          federation = {
            listenAddress = "${ips.${self}}:7788";
            openFirewall = true;
            # written by the test script: pins are only known once the VMs made their keys
            peersFile = "/etc/xmsg/public/peers";
            certFile = "/etc/xmsg/public/fed-cert";
            keyFile = "/etc/xmsg/public/fed-key";
            ipAddressAllow = [ ips.${peerOf.${self}} ];
          };
        };
      };

      environment.systemPackages = [
        probe
        pkgs.curl
        pkgs.openssl
        pkgs.iproute2
      ];
    };
in
{
  name = "xmsg-federation";

  nodes.a = node "a";
  nodes.b = node "b";

  testScript = ''
    import json

    HOSTS = {"a": a, "b": b}
    IPS = {"a": "192.168.1.1", "b": "192.168.1.2"}
    PEER = {"a": "b", "b": "a"}
    CRED = "/etc/xmsg/public"
    SOCK = "/run/xmsg-public/xmsg"
    UNIT = "xmsg@public.service"

    def as_tier(cmd):
        return f"runuser -u xmsg-public -- {cmd}"

    def pin(machine):
        return "sha256:" + machine.succeed(
            f"openssl x509 -in {CRED}/fed-cert -pubkey -noout"
            " | openssl pkey -pubin -outform DER | sha256sum | cut -d' ' -f1"
        ).strip()

    def http(machine, method, path, body=None, ok=True):
        data = f"-d '{json.dumps(body)}' -H 'Content-Type: application/json'" if body else ""
        cmd = as_tier(
            f"curl -sS -o /tmp/body -w '%{{http_code}}' -X {method} {data}"
            f" --unix-socket {SOCK}/http.sock http://localhost{path}"
        )
        status = int(machine.succeed(cmd).strip())
        body = machine.succeed("cat /tmp/body")
        return status, (json.loads(body) if body.strip() else None)

    start_all()
    for m in HOSTS.values():
        m.wait_for_unit("sockets.target")
        # The daemons run with --require-landlock; without the LSM they could not start at all.
        m.succeed("grep -qw landlock /sys/kernel/security/lsm")

    with subtest("keys and certificates are made in the VMs, root-only"):
        for name, m in HOSTS.items():
            m.succeed(
                f"install -d -m 0700 {CRED}"
                f" && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2"
                f" -subj /CN={name} -addext subjectAltName=URI:xmsg://{name}"
                f" -keyout {CRED}/fed-key -out {CRED}/fed-cert"
                f" && chmod 0400 {CRED}/fed-key {CRED}/fed-cert"
            )
        pins = {name: pin(m) for name, m in HOSTS.items()}
        for name, m in HOSTS.items():
            peer = PEER[name]
            entry = {"address": f"{IPS[peer]}:7788", "pin": pins[peer], "allow": ["send", "reply", "list"]}
            if name == "b":
                # policy: a may reach b's svc:probe and nothing else
                entry["targets"] = ["svc:probe"]
            m.succeed(f"echo '{json.dumps({peer: entry})}' > {CRED}/peers && chmod 0400 {CRED}/peers")
            # positive control: root reads the key; the tier user does not
            m.succeed(f"test -s {CRED}/fed-key")
            m.fail(as_tier(f"cat {CRED}/fed-key"))

    with subtest("the first connection starts each host's service with its credentials"):
        for name, m in HOSTS.items():
            m.succeed(as_tier(f"probe own --dir {SOCK}"))
            m.wait_for_unit(UNIT)
            m.succeed(f"journalctl -b -u {UNIT} | grep -q 'federation loaded.*source=credentials-directory'")
            m.fail(f"journalctl -b -u {UNIT} | grep -q 'PRIVATE KEY'")
            pid = m.succeed(f"systemctl show -p MainPID --value {UNIT}").strip()
            m.fail(f"grep -qa 'fed-key' /proc/{pid}/environ")
            m.fail(f"tr '\\0' ' ' < /proc/{pid}/cmdline | grep -q '{CRED}'")

    with subtest("the listener is on the configured address only; the unit is narrowed"):
        for name, m in HOSTS.items():
            m.wait_until_succeeds(f"ss -ltnH | grep -q '{IPS[name]}:7788'")
            m.fail("ss -ltnH | grep -qE '(0\\.0\\.0\\.0|\\[::\\]|\\*):7788'")
            m.succeed(f"systemctl show -p SocketBindAllow --value {UNIT} | grep -q 'tcp:7788'")
            m.succeed(f"systemctl show -p SocketBindDeny --value {UNIT} | grep -q any")
            m.succeed(f"systemctl show -p IPAddressAllow --value {UNIT} | grep -q '{IPS[PEER[name]]}'")

    with subtest("in the unit's cgroup, only the listener's port can be bound (SocketBindAllow=)"):
        # The unit's BPF filters hold for every process in its cgroup: a probe moved there
        # may bind port 7788 (on another address: the daemon holds its own) but not 7790.
        check = "probe netcheck --bind-ok 127.0.0.1:7788 --bind-denied 127.0.0.1:7790"
        for name, m in HOSTS.items():
            cg = m.succeed(f"systemctl show -p ControlGroup --value {UNIT}").strip()
            assert cg.endswith(UNIT), cg
            # positive control: outside that cgroup, 7790 binds, so the check fails
            m.fail(check)
            m.succeed(f"sh -c 'echo $$ > /sys/fs/cgroup{cg}/cgroup.procs && exec {check}'")

    with subtest("a message to svc:probe@b crosses the link and b's reply comes back"):
        b.succeed(
            "systemd-run --unit=answerer --uid=xmsg-public"
            f" probe answer --dir {SOCK} --text 'pong from b' --timeout 300s"
        )
        b.wait_until_succeeds(as_tier(f"curl -sf --unix-socket {SOCK}/http.sock http://localhost/v1/sessions/svc:probe"))
        status, sent = http(a, "POST", "/v1/sessions/svc:probe@b/messages", {"from": "alice", "text": "over the wire"})
        assert status == 202, (status, sent)
        mid = sent["messageId"]
        b.wait_until_succeeds(f"journalctl -u answerer | grep -q 'delivered {mid} '")
        status, row = http(b, "GET", f"/v1/messages/{mid}")
        assert status == 200 and "xmsg@a" in row["fromName"], (status, row)
        # the reply, read on a through a's own bus
        status, replies = http(a, "GET", f"/v1/messages/{mid}/replies?wait=30")
        assert status == 200 and [r["text"] for r in replies] == ["pong from b"], (status, replies)
        # positive control: an unknown id is not found on b
        status, _ = http(b, "GET", "/v1/messages/00000000-0000-7000-8000-000000000001")
        assert status == 404, status

    with subtest("outside the policy: a target b does not allow for a is refused"):
        status, body = http(a, "POST", "/v1/sessions/svc:other@b/messages", {"from": "alice", "text": "not allowed"})
        assert status == 403 and body["error"] == "op_denied", (status, body)

    with subtest("a client whose certificate is not pinned is refused at the TLS layer"):
        a.succeed(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2"
            " -subj /CN=mallory -keyout /tmp/m.key -out /tmp/m.crt"
        )
        # positive control: with a's real certificate the handshake completes
        a.succeed(
            f"curl -sk --cert {CRED}/fed-cert --key {CRED}/fed-key -o /dev/null"
            f" https://{IPS['b']}:7788/fed/v2/sessions"
        )
        a.fail(f"curl -sk --cert /tmp/m.crt --key /tmp/m.key -o /dev/null https://{IPS['b']}:7788/fed/v2/sessions")
  '';
}
