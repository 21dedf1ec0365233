# activation.nix -- NixOS VM test: socket activation and durability of accepted messages.
#
# Properties, one block each, each with a positive control:
#   - at boot only the three sockets listen; the first connection starts xmsg@public;
#   - kill -9 of the daemon loses no accepted message: messages accepted (HTTP 202) while no
#     one polls are all delivered, with their text, after the crash; the sockets never
#     stopped listening, and the next connection is served again;
#   - the same across a sudden power loss of the VM (machine.crash(): nothing is flushed, so
#     only what was fsynced before the 202 survives);
#   - the same across a reboot of the VM: accepted messages survive, the sockets come back at
#     boot, and the service again waits for its first connection.
# vmtests/probe does the client side: `probe enqueue` registers as svc "probe", sends N
# messages over http.sock without polling them and records their ids; `probe drain`
# re-registers and polls until every recorded message has been delivered.
#
# Run: nix build .#checks.x86_64-linux.activation (needs KVM).
{
  pkgs,
  xmsg,
  probe,
  module,
}:
{
  name = "xmsg-activation";

  nodes.machine = {
    imports = [ module ];

    services.xmsg = {
      package = xmsg;
      tiers.public.svcExecutables.probe = "${probe}/bin/probe";
    };

    environment.systemPackages = [ probe ];
  };

  testScript = ''
    DIR = "/run/xmsg-public/xmsg"
    IDS = "/var/lib/xmsg-probe-ids"
    SOCKETS = ("http", "agent", "register")


    def as_tier(cmd):
        return f"runuser -u xmsg-public -- {cmd}"


    def sockets_listening():
        for s in SOCKETS:
            machine.succeed(f"systemctl is-active xmsg-{s}@public.socket")
            machine.succeed(f"test -S {DIR}/{s}.sock")


    def enqueue(count, ids):
        # the ids file lives where the tier user can write it and the test can read it
        machine.succeed(f"install -d -o xmsg-public -m 0700 {IDS}")
        out = machine.succeed(as_tier(f"probe enqueue --dir {DIR} --count {count} --ids {IDS}/{ids}"))
        machine.log(out)
        got = int(machine.succeed(f"wc -l < {IDS}/{ids}").strip())
        assert got == count, f"{got} ids recorded, want {count}"


    def drain(ids):
        out = machine.succeed(as_tier(f"probe drain --dir {DIR} --ids {IDS}/{ids}"))
        machine.log(out)


    machine.wait_for_unit("sockets.target")
    # The daemon runs with --require-landlock; without the LSM it could not start at all.
    machine.succeed("grep -qw landlock /sys/kernel/security/lsm")

    with subtest("only the sockets listen at boot; the first connection starts the service"):
        sockets_listening()
        machine.fail("systemctl is-active xmsg@public.service")
        machine.succeed(as_tier(f"probe own --dir {DIR}"))
        machine.wait_for_unit("xmsg@public.service")
        machine.succeed("journalctl -b -u xmsg@public.service | grep -q 'landlock: abi='")

    with subtest("positive control: enqueued messages are delivered without any crash"):
        enqueue(3, "control")
        drain("control")

    with subtest("kill -9 loses no accepted message"):
        enqueue(20, "crash")
        before = machine.succeed("systemctl show -p MainPID --value xmsg@public.service").strip()
        machine.succeed("systemctl kill -s KILL xmsg@public.service")
        # the sockets belong to systemd and never stop listening
        sockets_listening()
        # restarted (Restart=on-failure) or re-activated by the next connection: either way a
        # new process serves, and it delivers every accepted message with its text
        drain("crash")
        machine.wait_for_unit("xmsg@public.service")
        after = machine.succeed("systemctl show -p MainPID --value xmsg@public.service").strip()
        assert after not in ("", "0", before), f"MainPID {before} -> {after}: want a new process"
        machine.succeed(as_tier(f"probe own --dir {DIR}"))

    with subtest("a power loss loses no accepted message (answers come after fsync)"):
        enqueue(20, "powerloss")
        machine.crash()
        machine.start()
        machine.wait_for_unit("sockets.target")
        sockets_listening()
        drain("powerloss")
        machine.wait_for_unit("xmsg@public.service")

    with subtest("a reboot loses no accepted message"):
        enqueue(20, "reboot")
        machine.shutdown()
        machine.start()
        machine.wait_for_unit("sockets.target")
        sockets_listening()
        # positive control for activation after boot: nothing runs until the first connection
        machine.fail("systemctl is-active xmsg@public.service")
        drain("reboot")
        machine.wait_for_unit("xmsg@public.service")
        machine.succeed(as_tier(f"probe own --dir {DIR}"))
  '';
}
