# federation.nix -- NixOS VM test: two hosts federate tier "public" over pinned mTLS.
#
# PENDING: the daemon does not implement federation yet (`xmsg serve` refuses --fed-listen
# "in this build"), so flake.nix does not run this test. It evaluates and parses (CI checks
# both); wire it into `checks` once federation lands:
#   federation = pkgs.testers.runNixOSTest (import ./vmtests/federation.nix args);
#
# Hosts a (192.168.1.1) and b (192.168.1.2) each run tier "public" with a federation listener
# on their own address (never 0.0.0.0) and the other host as a pinned peer. Certificates, keys,
# pins and peers files are made inside the VMs at test time, so no key ever enters the Nix
# store; the module delivers them with LoadCredential= from root-only files.
#
# Properties, one block each, each with a positive control:
#   - the listener is on the configured address only, and nothing listens on 0.0.0.0/::;
#   - a message sent on a to svc:probe@b is delivered to svc:probe on b, with the same
#     message id on both hosts (b records it as coming from host a);
#   - a host that is not a configured peer (wrong pin) is refused at the TLS layer;
#   - the credential sources stay unreadable to the tier user, and the key never appears in
#     the daemon's command line or environment.
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
          hostLabel = self;
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

    def as_tier(cmd):
        return f"runuser -u xmsg-public -- {cmd}"

    def pin(machine):
        return "sha256:" + machine.succeed(
            f"openssl x509 -in {CRED}/fed-cert -pubkey -noout"
            " | openssl pkey -pubin -outform DER | sha256sum | cut -d' ' -f1"
        ).strip()

    def http(machine, method, path, body=None):
        data = f"-d '{json.dumps(body)}' -H 'Content-Type: application/json'" if body else ""
        return machine.succeed(
            as_tier(f"curl -sS -X {method} {data} --unix-socket {SOCK}/http.sock http://localhost{path}")
        )

    start_all()
    for m in HOSTS.values():
        m.wait_for_unit("sockets.target")
        # The daemons run with --require-landlock; without the LSM they could not start at all.
        m.succeed("grep -qw landlock /sys/kernel/security/lsm")

    with subtest("keys and certificates are made in the VMs, root-only"):
        for name, m in HOSTS.items():
            m.succeed(
                f"install -d -m 0700 {CRED}"
                f" && openssl req -x509 -newkey ed25519 -nodes -days 2 -subj /CN={name}"
                f" -addext subjectAltName=DNS:{name},IP:{IPS[name]}"
                f" -keyout {CRED}/fed-key -out {CRED}/fed-cert"
                f" && chmod 0400 {CRED}/fed-key {CRED}/fed-cert"
            )
        pins = {name: pin(m) for name, m in HOSTS.items()}
        for name, m in HOSTS.items():
            peer = PEER[name]
            peers = {peer: {"address": f"{IPS[peer]}:7788", "pin": pins[peer], "allow": ["send", "reply", "list"]}}
            m.succeed(f"echo '{json.dumps(peers)}' > {CRED}/peers && chmod 0400 {CRED}/peers")
            # positive control: root reads the key; the tier user does not
            m.succeed(f"test -s {CRED}/fed-key")
            m.fail(as_tier(f"cat {CRED}/fed-key"))

    with subtest("the first connection starts each host's service with its credentials"):
        for name, m in HOSTS.items():
            m.succeed(as_tier(f"probe own --dir {SOCK}"))
            m.wait_for_unit("xmsg@public.service")
            m.succeed("journalctl -b -u xmsg@public.service | grep -q 'credential loaded'")
            m.fail("journalctl -b -u xmsg@public.service | grep -q 'PRIVATE KEY'")
            pid = m.succeed("systemctl show -p MainPID --value xmsg@public.service").strip()
            m.fail(f"grep -qa 'fed-key' /proc/{pid}/environ")
            m.fail(f"tr '\\0' ' ' < /proc/{pid}/cmdline | grep -q '{CRED}'")

    with subtest("the federation listener is on the configured address only"):
        for name, m in HOSTS.items():
            m.wait_until_succeeds(f"ss -ltnH | grep -q '{IPS[name]}:7788'")
            m.fail("ss -ltnH | grep -qE '(0\\.0\\.0\\.0|\\[::\\]|\\*):7788'")

    with subtest("a message to svc:probe@b is delivered on b with the same id"):
        # b holds a registration of svc:probe; whatever reaches it is acked and logged
        b.succeed("install -d -o xmsg-public -m 0700 /var/lib/xmsg-probe-ids")
        b.succeed(
            "echo '00000000-0000-0000-0000-000000000000 never' > /var/lib/xmsg-probe-ids/none"
            " && chown xmsg-public /var/lib/xmsg-probe-ids/none"
        )
        b.succeed(
            "systemd-run --unit=holder --uid=xmsg-public"
            f" probe drain --dir {SOCK} --ids /var/lib/xmsg-probe-ids/none --timeout 300s"
        )
        b.wait_until_succeeds(as_tier(f"curl -sf --unix-socket {SOCK}/http.sock http://localhost/v1/sessions/svc:probe"))
        sent = json.loads(http(a, "POST", "/v1/sessions/svc:probe@b/messages", {"from": "alice", "text": "over the wire"}))
        mid = sent["messageId"]
        assert sent["outcome"] == "delivered", sent
        b.wait_until_succeeds(f"journalctl -u holder | grep -q 'acking an unrelated queued message {mid}'")
        row = json.loads(http(b, "GET", f"/v1/messages/{mid}"))
        assert "xmsg@a" in row["fromName"], row
        # positive control: an unknown id is not found on b
        b.fail(as_tier(f"curl -sf --unix-socket {SOCK}/http.sock http://localhost/v1/messages/00000000-0000-0000-0000-000000000001"))

    with subtest("a host with a pin that is not configured is refused at the TLS layer"):
        a.succeed(
            "openssl req -x509 -newkey ed25519 -nodes -days 2 -subj /CN=mallory"
            " -keyout /tmp/m.key -out /tmp/m.crt"
        )
        # positive control: with the real client certificate the handshake completes
        a.succeed(
            f"curl -sk --cert {CRED}/fed-cert --key {CRED}/fed-key -o /dev/null"
            f" https://{IPS['b']}:7788/fed/v2/sessions"
        )
        a.fail(f"curl -sk --cert /tmp/m.crt --key /tmp/m.key -o /dev/null https://{IPS['b']}:7788/fed/v2/sessions")
  '';
}
