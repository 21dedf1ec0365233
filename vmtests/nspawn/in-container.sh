#!/bin/bash
# in-container.sh -- runs INSIDE the nspawn container (as root, in PID 1's namespaces) and
# exercises xmsg's own units under a real systemd. vmtests/nspawn_test.go calls it once with
# `setup`, then once per scenario. Each scenario tests one property, with a positive control,
# prints PASS/FAIL/INFO lines and exits non-zero when anything failed.
#
#   in-container.sh setup        install binaries, units, users, dirs, credentials, drop-ins
#   in-container.sh activation   (1) socket activation: nothing runs before the first connect
#   in-container.sh credentials  (2) LoadCredential= reaches the daemon, the source stays sealed
#   in-container.sh hardening    (3) the unit's sandbox and Landlock are in force
#   in-container.sh isolation    (4) planted markers: no path from one tier to the other
#   in-container.sh crash        (5) kill -9 loses no acknowledged message
#   in-container.sh watchdog     (6) a daemon whose loop is stopped is restarted (WatchdogSec=)
#   in-container.sh nixos        (7) a tier with nix/module.nix's drop-ins runs
#   in-container.sh units        (8) the merged units, Debian and NixOS shape: same hardening
#   in-container.sh fedunit      (9) a federating tier's unit: one bind port, the peers only
#   in-container.sh federation  (10) two tiers federate under the real units and Landlock
#   in-container.sh custody     (11) a LoadCredential= secret handed to a tier's service by fd
#   in-container.sh relaunch    (12) a session dir that appears: exit 75, restarted, now served
#   in-container.sh refused     (13) xmsg backup; a damaged store: exit 65, no restart, unchanged
#
# Payload layout (read-only at /xmsg-payload): bin/{xmsg,xmsg-probe}, systemd/ (the repo's
# unit directory), creds/<tier>/{fed-cert,fed-key,pin}, this script, and when
# vmtests/nspawn_test.go could evaluate nix/module.nix (NIXPKGS_LIB): nixos/units/ (the
# drop-ins NixOS writes for tier nix and, analysed only, the federating tier nixfed) and
# nixos/tmpfiles.conf (tier nix's rules).
set -u
PL=${PAYLOAD:-/xmsg-payload}
TIERS="public trusted"
PROBE=/usr/local/bin/xmsg-probe
export SYSTEMD_PAGER='' SYSTEMD_COLORS=0 LC_ALL=C
fail=0
ok()   { echo "PASS $*"; }
bad()  { echo "FAIL $*"; fail=1; }
info() { echo "INFO $*"; }
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
# as USER CMD...: run CMD as a tier user (no PAM, so no /etc/pam.d needed in the container).
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --init-groups -- "$@"; }
# probe_as USER NAME ARGS...: run the probe as USER, prefix its lines with NAME, keep failures.
probe_as() {
  local u=$1 name=$2; shift 2
  local out rc
  out=$(as "$u" "$PROBE" "$@" 2>&1); rc=$?
  sed "s|^\(PASS\|FAIL\|INFO\) |\1 $name: |" <<<"$out"
  [ "$rc" -eq 0 ] || { fail=1; echo "FAIL $name: probe exited $rc"; }
  return "$rc"
}
mainpid() { systemctl show -P MainPID "xmsg@$1.service"; }
journal() { journalctl -q --no-pager -o cat -u "xmsg@$1.service"; }
other_tier() { [ "$1" = public ] && echo trusted || echo public; }
# wait_for DESC CMD...: poll a condition (state changes in systemd are asynchronous).
wait_for() {
  local d=$1; shift
  for _ in $(seq 100); do "$@" && return 0; sleep 0.1; done
  echo "INFO timed out waiting for: $d"; return 1
}
# wait_secs N DESC CMD...: wait_for with a deadline of N seconds (for systemd's own timers).
wait_secs() {
  local n=$1 d=$2; shift 2
  for _ in $(seq $((n * 2))); do "$@" && return 0; sleep 0.5; done
  echo "INFO timed out after ${n}s waiting for: $d"; return 1
}
finish() {
  [ "$fail" -eq 0 ] || { echo "--- journal of the xmsg units (tail)"; journalctl -q --no-pager -o short-monotonic -u 'xmsg*' | tail -40; }
  exit "$fail"
}

setup() {
  # /usr is the host's, read-only: a tmpfs on /usr/local in PID 1's mount namespace, which
  # every unit started later inherits.
  mountpoint -q /usr/local || mount -t tmpfs -o mode=0755 xmsg-usr-local /usr/local || return 1
  mkdir -p /usr/local/bin
  install -m0755 "$PL/bin/xmsg" /usr/local/bin/xmsg || return 1
  install -m0755 "$PL/bin/xmsg-probe" "$PROBE" || return 1
  mkdir -p /etc/systemd/system /etc/sysusers.d /etc/tmpfiles.d
  cp "$PL"/systemd/xmsg@.service "$PL"/systemd/xmsg-*@.socket /etc/systemd/system/ || return 1
  cp "$PL/systemd/sysusers.d/xmsg.conf" /etc/sysusers.d/ && systemd-sysusers || return 1
  cp "$PL/systemd/tmpfiles.d/xmsg.conf" /etc/tmpfiles.d/ && systemd-tmpfiles --create /etc/tmpfiles.d/xmsg.conf || return 1
  local t
  for t in $TIERS; do
    # Credential sources: root-owned 0400 in a traversable directory, so that it is the
    # file's own mode that keeps the tier user out.
    install -d -m0755 "/etc/xmsg/$t"
    install -m0400 -o root -g root "$PL/creds/$t/fed-cert" "$PL/creds/$t/fed-key" "/etc/xmsg/$t/" || return 1
    mkdir -p "/etc/systemd/system/xmsg@$t.service.d"
    # The shipped example drop-in, adapted to this tier and to the credentials that exist.
    sed -e "s|/etc/xmsg/public/|/etc/xmsg/$t/|" -e '/^LoadCredential=\(fed-ca\|peers\):/d' \
      "$PL/systemd/examples/xmsg@public.service.d/credentials.conf" > "/etc/systemd/system/xmsg@$t.service.d/credentials.conf"
    printf '[Service]\nEnvironment=XMSG_SVC_EXE=probe=%s\n' "$PROBE" > "/etc/systemd/system/xmsg@$t.service.d/probe.conf"
  done
  [ -d "$PL/nixos" ] && { setup_nixos || return 1; }
  systemctl daemon-reload
  for t in $TIERS; do systemctl enable --now "xmsg-http@$t.socket" "xmsg-agent@$t.socket" "xmsg-register@$t.socket" 2>&1 || return 1; done
  if [ -d "$PL/nixos" ]; then
    # As on a NixOS boot: the sockets are wanted by sockets.target (the links above), started.
    systemctl start xmsg-http@nix.socket xmsg-agent@nix.socket xmsg-register@nix.socket || return 1
  fi
  id xmsg-public; id xmsg-trusted
  ls -la /run/xmsg-public /run/xmsg-public/xmsg
}

# The NixOS shape of a tier, as NixOS lays it out: the package's units (here the same files,
# systemd/, already in /etc/systemd/system) plus the drop-ins nix/module.nix writes, rendered
# by vmtests/nspawn_test.go; the instance's sockets linked into sockets.target.wants by name
# (NixOS links ../NAME, which exists only as the template); the user the module declares; its
# tmpfiles rules; and the daemon at the store path the drop-in's ExecStart= names.
setup_nixos() {
  cp -r "$PL/nixos/units/." /etc/systemd/system/ || return 1
  mkdir -p /etc/systemd/system/sockets.target.wants
  local s exe
  for s in http agent register; do ln -sfn "../xmsg-$s@nix.socket" /etc/systemd/system/sockets.target.wants/ || return 1; done
  echo 'u xmsg-nix - "xmsg bus, tier nix" /var/lib/xmsg-nix' > /etc/sysusers.d/xmsg-nix.conf && systemd-sysusers || return 1
  cp "$PL/nixos/tmpfiles.conf" /etc/tmpfiles.d/xmsg-nix.conf && systemd-tmpfiles --create /etc/tmpfiles.d/xmsg-nix.conf || return 1
  exe=$(sed -n 's/^ExecStart="\([^"]*\)".*/\1/p' /etc/systemd/system/xmsg@nix.service.d/overrides.conf)
  case "$exe" in /nix/store/*/bin/xmsg) ;; *) echo "setup_nixos: ExecStart= names $exe"; return 1 ;; esac
  install -D -m0755 "$PL/bin/xmsg" "$exe"
}

# (1) Socket activation: the three sockets exist (0600 in a 0700 dir, tier-owned) while the
# service is not running; the first connection starts it and all three sockets are served;
# further connections reuse the same process.
activation() {
  local t=public s
  check "socket dir /run/xmsg-$t/xmsg is 0700 xmsg-$t" test "$(stat -c '%a %U %G' /run/xmsg-$t/xmsg)" = "700 xmsg-$t xmsg-$t"
  for s in http agent register; do
    check "$s.sock is a 0600 xmsg-$t socket" test "$(stat -c '%F %a %U %G' /run/xmsg-$t/xmsg/$s.sock)" = "socket 600 xmsg-$t xmsg-$t"
    check "xmsg-$s@$t.socket is listening" systemctl -q is-active "xmsg-$s@$t.socket"
  done
  check "xmsg@$t.service is not running before the first connection" test "$(systemctl is-active xmsg@$t.service)" != active
  probe_as "xmsg-$t" "first connect (probe own)" own --dir "/run/xmsg-$t/xmsg"
  check "xmsg@$t.service is active after the first connection" systemctl -q is-active "xmsg@$t.service"
  local pid1; pid1=$(mainpid $t); info "MainPID after first connect: $pid1"
  # /proc/<pid>/environ is the environment the daemon was started with (unsetenv does not
  # change it): systemd handed over exactly the three named sockets.
  local names; names=$(tr '\0' '\n' < "/proc/$pid1/environ" | sed -n 's/^LISTEN_FDNAMES=//p' | tr ':' '\n' | sort | tr '\n' ' ')
  info "LISTEN_FDNAMES (sorted): $names"
  check "systemd passed http, agent and register by name" test "$names" = "agent http register "
  probe_as "xmsg-$t" "second connect (probe own)" own --dir "/run/xmsg-$t/xmsg"
  check "second connection: same MainPID ($pid1)" test "$(mainpid $t)" = "$pid1"
  # One daemon (`xmsg serve`); its exe-attestation helper (`xmsg __exe-helper`, outside the
  # Landlock domain by design) is its child, not a second instance.
  check "exactly one xmsg serve runs as xmsg-$t" test "$(pgrep -u "xmsg-$t" -f '^/usr/local/bin/xmsg serve' | wc -l)" = 1
  check "the exe helper is the daemon's child" test "$(pgrep -u "xmsg-$t" -P "$pid1" -f "__exe-helper" | wc -l)" = 1
  check "the unit reached READY=1 (Type=notify: active, not activating)" test "$(systemctl show -P ActiveState xmsg@$t.service)/$(systemctl show -P SubState xmsg@$t.service)" = "active/running"
}

# (2) LoadCredential=: the daemon read the credential from $CREDENTIALS_DIRECTORY (the
# certificate pin it logs equals the one computed on the host), while the source file stays
# root-owned 0400 and unreadable to the tier user itself.
credentials() {
  local t=public
  systemctl -q is-active "xmsg@$t.service" || probe_as "xmsg-$t" "start (probe own)" own --dir "/run/xmsg-$t/xmsg" >/dev/null
  local pin; pin=$(cat "$PL/creds/$t/pin")
  J=$(journal $t)
  grep 'credential loaded' <<<"$J" | sed 's/^/INFO journal: /'
  check "daemon loaded fed-cert with pin $pin" grep -q "credential loaded.*name=fed-cert.*pin=$pin" <<<"$J"
  check "... from the credentials directory, not from a path flag" bash -c "grep 'credential loaded.*name=fed-cert' <<<\"\$1\" | grep -q 'source=credentials-directory'" _ "$J"
  check "/etc/xmsg/$t/fed-key stays 0400 root:root" test "$(stat -c '%a %U %G' /etc/xmsg/$t/fed-key)" = "400 root root"
  probe_as "xmsg-$t" "tier user cannot read its own credential sources" other --cred "/etc/xmsg/$t/fed-key" --cred "/etc/xmsg/$t/fed-cert"
  check "positive control: root reads the source" test -s "/etc/xmsg/$t/fed-key"
}

# (3) Hardening in force. The running daemon's /proc status shows NoNewPrivs and a seccomp
# filter, and its journal says Landlock is enforced. The mount/socket restrictions are checked
# from INSIDE the same unit: a copy of xmsg@.service whose ExecStart= is `probe sandbox`.
hardening() {
  local t=public pid
  systemctl -q is-active "xmsg@$t.service" || probe_as "xmsg-$t" "start (probe own)" own --dir "/run/xmsg-$t/xmsg" >/dev/null
  pid=$(mainpid $t)
  if [ -z "$pid" ] || [ "$pid" = 0 ]; then bad "xmsg@$t.service is not running"; return; fi
  local st; st=$(cat "/proc/$pid/status")
  grep -E '^(Uid|NoNewPrivs|Seccomp|Seccomp_filters|CapEff|CapBnd):' <<<"$st" | sed 's/^/INFO status: /'
  check "daemon runs as xmsg-$t" bash -c "grep -qE '^Uid:\s+$(id -u xmsg-$t)\s' <<<\"\$1\"" _ "$st"
  check "daemon NoNewPrivs: 1" bash -c "grep -qE '^NoNewPrivs:\s+1$' <<<\"\$1\"" _ "$st"
  check "daemon Seccomp: 2 (filter mode)" bash -c "grep -qE '^Seccomp:\s+2$' <<<\"\$1\"" _ "$st"
  # Every process in an nspawn container runs under nspawn's own filter, so Seccomp: 2 alone
  # proves nothing here: the unit's filters must come on top of what PID 1 has.
  local base mine
  base=$(sed -n 's/^Seccomp_filters:\s*//p' /proc/1/status); mine=$(sed -n 's/^Seccomp_filters:\s*//p' <<<"$st")
  check "daemon has seccomp filters of its own ($mine, PID 1 has $base)" test "${mine:-0}" -gt "${base:-0}"
  check "daemon has no capabilities (CapEff and CapBnd 0)" bash -c "grep -qE '^CapEff:\s+0+$' <<<\"\$1\" && grep -qE '^CapBnd:\s+0+$' <<<\"\$1\"" _ "$st"
  J=$(journal $t)
  grep -m1 'landlock: ' <<<"$J" | sed 's/^/INFO journal: /'
  check "journal: landlock fs=enforced" grep -qE 'landlock: abi=[0-9]+ fs=enforced' <<<"$J"

  # The same [Service] hardening with the probe as a oneshot ExecStart= (sockets not needed).
  local u=/etc/systemd/system/xmsg-sandbox-check@.service
  sed -e '/^\(Requires\|After\|Also\)=/d' -e 's/^Type=notify$/Type=oneshot/' -e '/^NotifyAccess=/d' \
      -e '/^Restart/d' -e '/^WatchdogSec=/d' \
      -e "s|^ExecStart=.*|ExecStart=$PROBE sandbox --readonly /usr --readonly /etc --readonly /var --readonly /run --writable /var/lib/xmsg-%i --writable /tmp|" \
      /etc/systemd/system/xmsg@.service > "$u"
  systemctl daemon-reload
  systemctl reset-failed "xmsg-sandbox-check@$t.service" 2>/dev/null
  systemctl start "xmsg-sandbox-check@$t.service"; local rc=$?
  local out; out=$(journalctl -q --no-pager -o cat -u "xmsg-sandbox-check@$t.service" | grep -E '^(PASS|FAIL|INFO) ')
  sed 's/^\(PASS\|FAIL\|INFO\) /\1 inside the unit: /' <<<"$out"
  grep -q '^FAIL ' <<<"$out" && fail=1
  check "inside the unit: the sandbox probe ran and passed (rc=$rc)" bash -c "[ $rc -eq 0 ] && grep -q '^PASS status-Seccomp' <<<\"\$1\"" _ "$out"
  rm -f "$u"; systemctl daemon-reload
}

# (4) Isolation with planted markers. Each tier's own bus works for its user (positive
# control), while every path to the other tier fails: sockets, socket and state directories,
# markers, credential sources and delivered credentials. Then root relaxes the other tier's
# directory and socket modes: connect() succeeds and the daemon's peer check alone sends
# nothing back. No TCP listener exists for either tier.
isolation() {
  local t o s
  # Positive control first: each tier's own bus works (this also starts both daemons, which
  # creates their state directories).
  for t in $TIERS; do
    probe_as "xmsg-$t" "xmsg-$t own bus" own --dir "/run/xmsg-$t/xmsg"
  done
  for t in $TIERS; do
    echo "marker-state-$t" > "/var/lib/xmsg-$t/marker"; chown "xmsg-$t:" "/var/lib/xmsg-$t/marker"; chmod 0600 "/var/lib/xmsg-$t/marker"
    echo "marker-run-$t" > "/run/xmsg-$t/marker"; chown "xmsg-$t:" "/run/xmsg-$t/marker"; chmod 0600 "/run/xmsg-$t/marker"
  done
  for t in $TIERS; do
    check "positive control: the markers of $t exist" test -s "/var/lib/xmsg-$t/marker" -a -s "/run/xmsg-$t/marker"
    check "positive control: xmsg-$t can read its own markers" as "xmsg-$t" test -r "/run/xmsg-$t/marker" -a -r "/var/lib/xmsg-$t/marker"
  done
  for t in $TIERS; do
    o=$(other_tier "$t")
    check "positive control: the delivered credential of $o exists" test -e "/run/credentials/xmsg@$o.service/fed-key"
    probe_as "xmsg-$t" "xmsg-$t -> $o" other --dir "/run/xmsg-$o/xmsg" --state "/var/lib/xmsg-$o" \
      --marker "/var/lib/xmsg-$o/marker" --marker "/run/xmsg-$o/marker" --marker "/var/lib/xmsg-$o/xmsg.db" \
      --cred "/etc/xmsg/$o/fed-key" --cred "/run/credentials/xmsg@$o.service/fed-key"
    probe_as "xmsg-$t" "xmsg-$t no TCP listener" notcp --pid "$(mainpid "$t")" --port 7787
  done

  # Peer gate alone: relax trusted's modes (root), connect as xmsg-public. The daemon must be
  # up before and be the same process after: a daemon that is down (or refuses to start with
  # relaxed modes, which it does) would also send nothing, and prove nothing.
  o=trusted
  local gpid; gpid=$(mainpid "$o")
  case "$gpid" in ''|0) bad "xmsg@$o.service is not running before the gate check"; return ;; esac
  chmod 0755 "/run/xmsg-$o" "/run/xmsg-$o/xmsg"
  for s in http agent register; do chmod 0666 "/run/xmsg-$o/xmsg/$s.sock"; done
  for s in http agent register; do
    probe_as xmsg-public "relaxed $o $s.sock, peer gate only" gate --sock "/run/xmsg-$o/xmsg/$s.sock" --timeout 10s
  done
  check "the same daemon answered the gate checks (MainPID $gpid)" test "$(mainpid "$o")" = "$gpid"
  probe_as "xmsg-$o" "positive control: $o's own bus still works" own --dir "/run/xmsg-$o/xmsg"
  local jo; jo=$(journal "$o")
  for s in http agent register; do
    check "the daemon logged the refusal on $s.sock (peer_uid $(id -u xmsg-public))" \
      grep -q "peer refused.* socket=$s .*uid mismatch.* peer_uid=$(id -u xmsg-public) " <<<"$jo"
  done
  chmod 0700 "/run/xmsg-$o" "/run/xmsg-$o/xmsg"
  for s in http agent register; do chmod 0600 "/run/xmsg-$o/xmsg/$s.sock"; done
}

# (5) kill -9 loses no acknowledged message: messages answered 202 are queued for svc:probe
# and never polled, the daemon is SIGKILLed, the next connection finds a (re)started daemon,
# and the re-registered probe receives every one of them.
crash() {
  local t=public n=20 ids pid1 pid2
  systemctl -q is-active "xmsg@$t.service" || probe_as "xmsg-$t" "start (probe own)" own --dir "/run/xmsg-$t/xmsg" >/dev/null
  ids=$(mktemp -d); chown "xmsg-$t:" "$ids"
  probe_as "xmsg-$t" "enqueue $n" enqueue --dir "/run/xmsg-$t/xmsg" --count "$n" --ids "$ids/ids"
  check "positive control: $n ids recorded" test "$(wc -l < "$ids/ids")" = "$n"
  pid1=$(mainpid $t)
  # Never `kill -9 0` (or 1): an empty or zero MainPID means there is no daemon to crash.
  case "$pid1" in ''|0|1|*[!0-9]*) bad "xmsg@$t.service has no MainPID ($pid1)"; return ;; esac
  local inodes; inodes=$(stat -c %i /run/xmsg-$t/xmsg/*.sock | tr '\n' ' ')
  check "kill -9 MainPID $pid1" kill -9 "$pid1"
  wait_for "MainPID $pid1 gone" bash -c "! kill -0 $pid1 2>/dev/null"
  info "after kill: $(systemctl show -P ActiveState xmsg@$t.service)/$(systemctl show -P SubState xmsg@$t.service) Result=$(systemctl show -P Result xmsg@$t.service)"
  # Straight away, without retries: while the daemon is down (Restart= waits RestartSec=), the
  # connection waits in the socket's backlog and the next daemon serves it.
  probe_as "xmsg-$t" "after kill -9 (probe drain)" drain --dir "/run/xmsg-$t/xmsg" --ids "$ids/ids"
  pid2=$(mainpid $t)
  check "a new daemon serves (MainPID $pid1 -> $pid2)" bash -c "[ -n '$pid2' ] && [ '$pid2' != 0 ] && [ '$pid2' != '$pid1' ]"
  check "the sockets outlived the daemon (same inodes: $inodes)" test "$(stat -c %i /run/xmsg-$t/xmsg/*.sock | tr '\n' ' ')" = "$inodes"
  rm -rf "$ids"
}

# (6) The watchdog. The unit sets WatchdogSec=; systemd hands the daemon WATCHDOG_USEC and the
# daemon pets it (positive control: systemd's timestamp of the last WATCHDOG=1 moves). Then the
# daemon is stopped with SIGSTOP: the process exists, its loop runs no more, nothing else
# would ever restart it. systemd must time it out, and Restart= must bring up a new daemon
# that serves.
watchdog() {
  local t=public pid1 pid2 w1
  systemctl -q is-active "xmsg@$t.service" || probe_as "xmsg-$t" "start (probe own)" own --dir "/run/xmsg-$t/xmsg" >/dev/null
  pid1=$(mainpid $t)
  case "$pid1" in ''|0|1|*[!0-9]*) bad "xmsg@$t.service has no MainPID ($pid1)"; return ;; esac
  local usec; usec=$(systemctl show -P WatchdogUSec "xmsg@$t.service")
  check "systemd runs the unit with a watchdog (WatchdogUSec=$usec)" test "$usec" = 20s
  check "the daemon was given WATCHDOG_USEC=20000000" bash -c "tr '\\0' '\\n' < /proc/$pid1/environ | grep -qx WATCHDOG_USEC=20000000"
  w1=$(systemctl show -P WatchdogTimestampMonotonic "xmsg@$t.service")
  wait_secs 15 "a WATCHDOG=1 from MainPID $pid1" bash -c "[ \"\$(systemctl show -P WatchdogTimestampMonotonic xmsg@$t.service)\" != '$w1' ]"
  check "positive control: the running daemon pets the watchdog (last ping moved from $w1)" \
    test "$(systemctl show -P WatchdogTimestampMonotonic "xmsg@$t.service")" != "$w1"
  check "SIGSTOP MainPID $pid1" kill -STOP "$pid1"
  # Within WatchdogSec (20 s) systemd sends SIGABRT (and SIGCONT, so a stopped process gets
  # it), then Restart= after RestartSec=; TimeoutAbortSec= bounds the first by SIGKILL.
  wait_secs 50 "a new MainPID after $pid1" bash -c "p=\$(systemctl show -P MainPID xmsg@$t.service); [ -n \"\$p\" ] && [ \"\$p\" != 0 ] && [ \"\$p\" != $pid1 ]"
  pid2=$(mainpid $t)
  check "systemd restarted the stopped daemon (MainPID $pid1 -> $pid2)" bash -c "[ -n '$pid2' ] && [ '$pid2' != 0 ] && [ '$pid2' != '$pid1' ]"
  check "the journal names the watchdog as the cause" bash -c "journalctl -q --no-pager -u xmsg@$t.service | grep -q 'Watchdog timeout'"
  check "the stopped process is gone" bash -c "! kill -0 $pid1 2>/dev/null"
  wait_for "xmsg@$t.service active" systemctl -q is-active "xmsg@$t.service"
  probe_as "xmsg-$t" "the new daemon serves (probe own)" own --dir "/run/xmsg-$t/xmsg"
  kill -CONT "$pid1" 2>/dev/null
}

# (8) One copy of the units: a Debian tier (public: the shipped files and the example
# drop-ins) and a NixOS tier (nix: the same files plus the drop-ins nix/module.nix writes) as
# systemd itself loaded and merged them. For each shape: `systemctl show` holds the hardening
# of UNIT_WANT (a fixed list, not read from the unit, so a key missing from the unit is
# missed here), both shapes show the same values for every property of UNIT_PROPS, and
# `systemd-analyze security` scores at most 0.5 with the same findings. A federating tier of
# each shape (debfed: template + systemd/examples' credentials.conf and federation.conf;
# nixfed: the module's drop-in for the same addresses) scores at most 1.3 with the same
# findings. Mutant: a hardening key removed from the shipped template must fail the check of
# both shapes.
UNIT_WANT="NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
PrivateUsers=no
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
ProtectSystem=strict
PrivateMounts=yes
ReadOnlyPaths=/run
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=default
ProcSubset=pid
PrivateNetwork=yes
RestrictAddressFamilies=AF_UNIX
DevicePolicy=closed
RestrictNamespaces=yes
RestrictRealtime=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
UMask=0077
Type=notify
NotifyAccess=main
Restart=on-failure
WatchdogUSec=20s
LimitNOFILE=4096
MemoryMax=536870912
TasksMax=1024
StateDirectoryMode=0700"
# Environment= is left out: the Debian tiers here pass XMSG_SVC_EXE, the NixOS one --svc-exe.
UNIT_PROPS="$(cut -d= -f1 <<<"$UNIT_WANT" | tr '\n' ,)IPAddressDeny,SystemCallFilter,SystemCallErrorNumber,StateDirectory,User,Group,KillSignal,TimeoutStopUSec,RestartUSec,Requires,After"
# unit_show TIER: UNIT_PROPS of xmsg@TIER.service, the tier's name (user, instances) replaced by TIER.
# List values are sorted word by word: systemd prints dependencies in hash order.
unit_show() {
  local k v
  systemctl show -p "$UNIT_PROPS" "xmsg@$1.service" | sed -e "s/xmsg-$1\b/xmsg-TIER/g" -e "s/@$1\b/@TIER/g" |
    while IFS='=' read -r k v; do printf '%s=%s\n' "$k" "$(tr ' ' '\n' <<<"$v" | sort | tr '\n' ' ' | sed 's/ $//')"; done | sort
}
# unit_security TIER: "EXPOSURE" then the findings of systemd-analyze security on the loaded unit.
unit_security() {
  local out; out=$(systemd-analyze security --no-pager "xmsg@$1.service" 2>&1)
  sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p' <<<"$out"
  grep -E '^(✗|- )' <<<"$out" | cut -d' ' -f2 | sort | tr '\n' ' '; echo
}
# le A B: the number A is at most B (no awk in the container: /usr/bin/awk is a link into
# the host's /etc/alternatives, which a volatile root does not have).
le() { [ -n "$1" ] && [ "$(printf '%s\n' "$1" "$2" | sort -g | head -1)" = "$1" ]; }
# unit_shape NAME TIER BOUND: the checks of one shape; prints PASS/FAIL lines.
unit_shape() {
  local name=$1 t=$2 bound=$3 show sec line
  show=$(unit_show "$t")
  while IFS= read -r line; do
    check "$name xmsg@$t: $line" grep -qxF "$line" <<<"$show"
  done <<<"$UNIT_WANT"
  sec=$(unit_security "$t")
  info "$name xmsg@$t: exposure $(head -1 <<<"$sec"), findings: $(tail -1 <<<"$sec")"
  check "$name xmsg@$t: exposure $(head -1 <<<"$sec") <= $bound" le "$(head -1 <<<"$sec")" "$bound"
}
unit_same() { # unit_same DEBIAN NIXOS: both show and score the same
  local d n
  d=$(unit_show "$1"); n=$(unit_show "$2")
  check "xmsg@$2 (NixOS) shows what xmsg@$1 (Debian) shows for $(tr ',' '\n' <<<"$UNIT_PROPS" | wc -l) properties" test "$d" = "$n"
  [ "$d" = "$n" ] || diff <(echo "$d") <(echo "$n") | sed 's/^/INFO diff: /'
  check "xmsg@$2 (NixOS) has the exposure and findings of xmsg@$1 (Debian)" test "$(unit_security "$1")" = "$(unit_security "$2")"
}
units() {
  local nixos=1 d=/etc/systemd/system/xmsg@debfed.service.d
  [ -d "$PL/nixos" ] || { nixos=0; info "no NixOS drop-ins in the payload (NIXPKGS_LIB unset): the Debian shape only"; }
  mkdir -p "$d"
  cp "$PL/systemd/examples/xmsg@public.service.d/credentials.conf" "$PL/systemd/examples/xmsg@public.service.d/federation.conf" "$d/"
  systemctl daemon-reload
  # WatchdogUSec= shows what a started service got (infinity before its first start): the
  # tiers compared must both run.
  systemctl -q is-active xmsg@public.service || probe_as xmsg-public "start public (probe own)" own --dir /run/xmsg-public/xmsg >/dev/null
  [ "$nixos" = 1 ] && { systemctl -q is-active xmsg@nix.service || probe_as xmsg-nix "start nix (probe own)" own --dir /run/xmsg-nix/xmsg >/dev/null; }
  check "positive control: the federating instance loads its drop-ins" bash -c "systemctl show -P DropInPaths xmsg@debfed.service | grep -q federation.conf"
  unit_shape Debian public 0.5
  if [ "$nixos" = 1 ]; then
    check "positive control: xmsg@nix loads the module's drop-in" bash -c "systemctl show -P DropInPaths xmsg@nix.service | grep -q 'xmsg@nix.service.d/overrides.conf'"
    unit_shape NixOS nix 0.5
    unit_same public nix
  fi
  local fed; fed=$(unit_security debfed)
  info "Debian federating xmsg@debfed: exposure $(head -1 <<<"$fed"), findings: $(tail -1 <<<"$fed")"
  check "Debian federating xmsg@debfed: exposure $(head -1 <<<"$fed") <= 1.3" le "$(head -1 <<<"$fed")" 1.3
  if [ "$nixos" = 1 ]; then
    check "NixOS federating xmsg@nixfed has the exposure and findings of xmsg@debfed" test "$(unit_security nixfed)" = "$fed"
    local p
    for p in PrivateNetwork RestrictAddressFamilies SocketBindAllow SocketBindDeny IPAddressAllow IPAddressDeny; do
      check "xmsg@nixfed shows the $p of xmsg@debfed ($(systemctl show -P $p xmsg@debfed.service))" \
        test "$(systemctl show -P $p xmsg@nixfed.service)" = "$(systemctl show -P $p xmsg@debfed.service)"
    done
  fi

  # Mutant: ProtectClock=yes removed from the shipped template; both shapes must fail.
  local tpl=/etc/systemd/system/xmsg@.service out
  cp "$tpl" /etc/xmsg-template.orig
  sed -i '/^ProtectClock=/d' "$tpl"
  systemctl daemon-reload
  for line in "Debian public" "NixOS nix"; do
    set -- $line
    [ "$1" = NixOS ] && [ "$nixos" = 0 ] && continue
    out=$(fail=0; unit_shape "$1" "$2" 0.5)
    grep '^FAIL ' <<<"$out" | sed 's/^FAIL /INFO mutant: /'
    check "mutant ProtectClock= removed from the template is caught for the $1 shape" grep -q '^FAIL ' <<<"$out"
  done
  cp /etc/xmsg-template.orig "$tpl"; rm -f /etc/xmsg-template.orig
  rm -rf "$d"
  systemctl daemon-reload
}

# (7) The NixOS tier runs: its sockets are wanted by sockets.target through the links NixOS
# makes, the first connection starts the daemon from the drop-in's ExecStart= (the store
# path, the module's quoting), and it serves with the unit's sandbox and Landlock in force.
nixos() {
  local t=nix s pid
  [ -d "$PL/nixos" ] || { info "no NixOS drop-ins in the payload (NIXPKGS_LIB unset)"; return; }
  for s in http agent register; do
    check "xmsg-$s@$t.socket is wanted by sockets.target" bash -c "systemctl show -P WantedBy xmsg-$s@$t.socket | grep -qw sockets.target"
    check "xmsg-$s@$t.socket is listening, $s.sock a 0600 xmsg-$t socket" bash -c "systemctl -q is-active xmsg-$s@$t.socket && test \"\$(stat -c '%F %a %U' /run/xmsg-$t/xmsg/$s.sock)\" = 'socket 600 xmsg-$t'"
  done
  check "xmsg@$t.service is not running before the first connection" test "$(systemctl is-active xmsg@$t.service)" != active
  probe_as "xmsg-$t" "first connect (probe own)" own --dir "/run/xmsg-$t/xmsg"
  pid=$(mainpid $t)
  check "the daemon runs from the store path of the drop-in ($(readlink /proc/$pid/exe))" bash -c "readlink /proc/$pid/exe | grep -q '^/nix/store/.*-xmsg-.*/bin/xmsg\$'"
  check "... with the module's command line" bash -c "tr '\\0' ' ' < /proc/$pid/cmdline | grep -q 'serve --require-landlock --svc-exe=probe=$PROBE'"
  check "the daemon runs as xmsg-$t with NoNewPrivs" bash -c "grep -qE '^Uid:\s+$(id -u xmsg-$t)\s' /proc/$pid/status && grep -qE '^NoNewPrivs:\s+1' /proc/$pid/status"
  check "journal: landlock fs=enforced" bash -c "journalctl -q --no-pager -o cat -u xmsg@$t.service | grep -qE 'landlock: abi=[0-9]+ fs=enforced'"
}

# (9) A federating tier's unit restrictions, from inside the unit: the repo's template with the
# shipped federation drop-in (systemd/examples/xmsg@public.service.d/federation.conf) on
# loopback addresses, and `probe netcheck` as the process in it. It may bind the listener's
# port over IPv4 only, reach the peer's address only, and make IPv4/IPv6 sockets but no
# netlink or packet ones. A live listener outside the unit sits on both the peer's and an
# outsider's address, so a refused dial is the unit's doing (positive control: root reaches
# both). Then one mutant per restriction, each on a scratch copy of the drop-in, must turn
# the matching check red.
FED_LISTEN=127.0.0.2:27788 FED_PEER=127.0.0.3 FED_OUTSIDER=127.0.0.4 FED_PEER_PORT=27789
fedunit_run() { # fedunit_run N NAME DROPIN: run netcheck in a fresh unit (number N) with that drop-in
  local n=$1 name=$2 drop=$3
  local unit=xmsg-netcheck$n u=/etc/systemd/system/xmsg-netcheck$n@.service
  sed -e '/^\(Requires\|After\|Also\)=/d' -e 's/^Type=notify$/Type=oneshot/' -e '/^NotifyAccess=/d' -e '/^Restart/d' -e '/^WatchdogSec=/d' \
      -e "s|^ExecStart=.*|ExecStart=$PROBE netcheck --families --bind-ok $FED_LISTEN $FED_BIND_CHECKS --dial-ok $FED_PEER:$FED_PEER_PORT --dial-denied $FED_OUTSIDER:$FED_PEER_PORT|" \
      /etc/systemd/system/xmsg@.service > "$u"
  mkdir -p "/etc/systemd/system/$unit@public.service.d"
  # the drop-in minus its ExecStart= (the probe is the process here)
  sed '/^ExecStart=/d' "$drop" > "/etc/systemd/system/$unit@public.service.d/federation.conf"
  systemctl daemon-reload
  systemctl start "$unit@public.service"; local rc=$?
  journalctl -q --no-pager -o cat -u "$unit@public.service" | grep -E '^(PASS|FAIL|INFO) ' | sed "s/^/[$name] /"
  rm -rf "$u" "/etc/systemd/system/$unit@public.service.d"
  return "$rc"
}
fedunit() {
  local ex=/etc/xmsg-fedunit.conf out m bpf=1
  # SocketBindAllow=/SocketBindDeny= are BPF programs that systemd ships only when built with
  # its BPF framework; a systemd without it (Debian 12's: -BPF_FRAMEWORK) accepts the keys and
  # enforces nothing. Then the bind checks and their mutants cannot run here: the daemon's
  # Landlock bind rule (ABI >= 4) is the layer in force.
  systemctl --version | grep -q '+BPF_FRAMEWORK' || bpf=0
  if [ "$bpf" = 1 ]; then
    FED_BIND_CHECKS="--bind-denied 127.0.0.2:27790 --bind-denied [::1]:${FED_LISTEN##*:}"
  else
    FED_BIND_CHECKS=""
    info "this systemd is built without BPF_FRAMEWORK ($(systemctl --version | head -1)): SocketBindAllow=/SocketBindDeny= are not enforced here; their checks and mutants are left out"
  fi
  # The shipped drop-in, moved to loopback: listener 127.0.0.2:27788, peer 127.0.0.3.
  sed -e "s|192.0.2.10:7788|$FED_LISTEN|" -e "s|tcp:7788|tcp:${FED_LISTEN##*:}|" -e "s|^IPAddressAllow=192.0.2.20$|IPAddressAllow=$FED_PEER|" \
    "$PL/systemd/examples/xmsg@public.service.d/federation.conf" > "$ex"
  check "the drop-in was moved to loopback (listener, bind port, peer)" bash -c "grep -qx 'SocketBindAllow=ipv4:tcp:${FED_LISTEN##*:}' $ex && grep -qx 'IPAddressAllow=$FED_PEER' $ex"
  systemctl reset-failed xmsg-fedtarget.service 2>/dev/null
  systemd-run -q --unit=xmsg-fedtarget "$PROBE" listen --addr "$FED_PEER:$FED_PEER_PORT" --addr "$FED_OUTSIDER:$FED_PEER_PORT" --timeout 60s
  wait_for "the target listens" bash -c "exec 3<>/dev/tcp/$FED_PEER/$FED_PEER_PORT"
  check "positive control: outside the unit, the peer's address is reachable" bash -c "exec 3<>/dev/tcp/$FED_PEER/$FED_PEER_PORT"
  check "positive control: outside the unit, the outsider's address is reachable too" bash -c "exec 3<>/dev/tcp/$FED_OUTSIDER/$FED_PEER_PORT"

  out=$(fedunit_run 0 shipped "$ex"); local rc=$?
  echo "$out"
  grep -q '^\[shipped\] FAIL ' <<<"$out" && fail=1
  check "inside the unit, every restriction held (rc=$rc)" bash -c "[ $rc -eq 0 ] && grep -q 'PASS bind-allowed' <<<\"\$1\" && grep -q 'PASS dial-allowed' <<<\"\$1\" && grep -q 'PASS udp-denied' <<<\"\$1\"" _ "$out"

  # Mutants: each relaxes one restriction; the check that guards it must fail.
  local n=0
  while IFS='|' read -r name edit want; do
    n=$((n + 1))
    if [ "$bpf" = 0 ] && [[ $want == bind-* ]]; then info "mutant $name: left out (no BPF_FRAMEWORK)"; continue; fi
    sed "$edit" "$ex" > /etc/xmsg-fedunit-mutant.conf
    if cmp -s "$ex" /etc/xmsg-fedunit-mutant.conf; then bad "mutant $name: the edit changed nothing"; continue; fi
    out=$(fedunit_run "$n" "$name" /etc/xmsg-fedunit-mutant.conf)
    grep "FAIL $want" <<<"$out" | head -3 | sed 's/^/INFO /'
    check "mutant $name is caught ($want fails)" grep -q "FAIL $want" <<<"$out"
  done <<'MUTANTS'
no SocketBindDeny|/^SocketBindDeny=/d|bind-denied:127.0.0.2:27790
SocketBindAllow without family|s/^SocketBindAllow=ipv4:/SocketBindAllow=/|bind-denied:[::1]
IPAddressDeny reset|$a IPAddressDeny=|udp-denied:127.0.0.4
IPAddressAllow widened|s/^IPAddressAllow=.*/IPAddressAllow=127.0.0.0\/8/|udp-denied:127.0.0.4
netlink and packet allowed|$a RestrictAddressFamilies=AF_NETLINK AF_PACKET|family-denied:netlink
MUTANTS
  systemctl stop xmsg-fedtarget.service 2>/dev/null
  rm -f "$ex" /etc/xmsg-fedunit-mutant.conf
  systemctl daemon-reload
}

# (10) Two tiers federate under the real units: public listens on 127.0.0.2:27791, trusted on
# 127.0.0.3:27792, each the other's pinned peer, each with the shipped federation drop-in
# (moved to loopback) and its peers file as the credential `peers`. Positive control: a
# message from public to svc:probe@trusted is answered and the reply comes back. In force:
# Landlock (the daemon's own line names the TCP ports left open), trusted's policy (a target
# it does not allow is refused), and IPAddressDeny=: public also knows a peer "outsider" at
# 127.0.0.4 that is not in its IPAddressAllow=, where a listener outside any unit logs every
# connection; the daemon's dial never reaches it. Mutants on scratch copies of the drop-in:
# IPAddressAllow= widened (the dial reaches the outsider), Landlock off (the line says so).
FA=127.0.0.2:27791 FB=127.0.0.3:27792 FOUT=127.0.0.4:27793
fed_addr() { [ "$1" = public ] && echo "$FA" || echo "$FB"; }
fed_dropin() { # fed_dropin TIER [SED-EDIT]: install the shipped drop-in for TIER, optionally mutated
  local t=$1 edit=${2:-} o a d
  o=$(other_tier "$t"); a=$(fed_addr "$t"); d=/etc/systemd/system/xmsg@$t.service.d
  # On one host every loopback connection comes from 127.0.0.1, so the peer's side must allow
  # that source too; destinations other than the peer's stay denied.
  sed -e "s|192.0.2.10:7788|$a|" -e "s|tcp:7788|tcp:${a##*:}|" -e "s|^IPAddressAllow=192.0.2.20$|IPAddressAllow=$(fed_addr "$o" | cut -d: -f1) 127.0.0.1|" \
    "$PL/systemd/examples/xmsg@public.service.d/federation.conf" > "$d/federation.conf"
  [ -n "$edit" ] && sed -i "$edit" "$d/federation.conf"
  printf '[Service]\nLoadCredential=peers:/etc/xmsg/%s/peers\nEnvironment=XMSG_HOST_LABEL=%s\n' "$t" "$t" > "$d/peers.conf"
}
fed_restart() { # fed_restart TIER: stop the daemon; the next connection starts it with the new units
  systemctl daemon-reload
  systemctl stop "xmsg@$1.service"; systemctl reset-failed "xmsg@$1.service" 2>/dev/null
  probe_as "xmsg-$1" "xmsg-$1 starts (probe own)" own --dir "/run/xmsg-$1/xmsg" >/dev/null
}
# fed_line TIER PATTERN: the first line of the RUNNING daemon's log matching PATTERN.
fed_line() { journalctl -q --no-pager -o cat _PID="$(mainpid "$1")" | grep -m1 "$2"; }
# fed_accepts: how many connections the outsider's listener has logged so far.
fed_accepts() { journalctl -q --no-pager -o cat -u xmsg-fedout.service | grep -c '^INFO accepted '; }
federation() {
  local t o pin_pub pin_tru
  pin_pub=$(cat "$PL/creds/public/pin"); pin_tru=$(cat "$PL/creds/trusted/pin")
  printf '{"trusted":{"address":"%s","pin":"%s","allow":["send","reply","list"]},"outsider":{"address":"%s","pin":"sha256:%064d","allow":[]}}\n' \
    "$FB" "$pin_tru" "$FOUT" 0 > /etc/xmsg/public/peers
  printf '{"public":{"address":"%s","pin":"%s","allow":["send","reply","list"],"targets":["svc:probe"]}}\n' "$FA" "$pin_pub" > /etc/xmsg/trusted/peers
  chmod 0400 /etc/xmsg/public/peers /etc/xmsg/trusted/peers
  systemctl reset-failed xmsg-fedout.service 2>/dev/null
  systemd-run -q --unit=xmsg-fedout "$PROBE" listen --addr "$FOUT" --timeout 80s
  wait_for "the outsider listens" bash -c "exec 3<>/dev/tcp/${FOUT%:*}/${FOUT##*:}"
  check "positive control: outside any unit, the outsider's address is reachable" bash -c "exec 3<>/dev/tcp/${FOUT%:*}/${FOUT##*:}"
  for t in $TIERS; do fed_dropin "$t"; fed_restart "$t"; done

  local line
  for t in $TIERS; do
    o=$(other_tier "$t")
    line=$(fed_line "$t" 'federation loaded'); info "xmsg-$t: $line"
    check "xmsg-$t loaded federation from the credentials directory" grep -q 'source=credentials-directory' <<<"$line"
    line=$(fed_line "$t" 'federation listener'); info "xmsg-$t: $line"
    check "xmsg-$t listens on $(fed_addr "$t") only" grep -q "addr=$(fed_addr "$t") " <<<"$line "
    check "nothing else listens on port ${FA##*:}/${FB##*:} (no 0.0.0.0, no ::)" bash -c "! ss -ltnH | grep -E ':(${FA##*:}|${FB##*:})\b' | grep -vE '127\.0\.0\.(2|3):'"
    line=$(fed_line "$t" 'landlock: '); info "xmsg-$t: $line"
    local port peer; port=$(fed_addr "$t"); port=${port##*:}; peer=$(fed_addr "$o"); peer=${peer##*:}
    check "xmsg-$t: Landlock enforces fs and net; TCP bind on $port only, connect to $peer among the peers' ports" \
      bash -c "grep -qE 'landlock: abi=[0-9]+ fs=enforced net=enforced .*tcp_bind=$port( |\"|\$)' <<<\"\$1\" && grep -qE 'tcp_connect=([0-9,]*,)?$peer(,|\"|\$| )' <<<\"\$1\"" _ "$line"
  done

  # Positive control: a message and its reply cross the link.
  systemctl reset-failed xmsg-fedanswer.service 2>/dev/null
  systemd-run -q --unit=xmsg-fedanswer --uid=xmsg-trusted "$PROBE" answer --dir /run/xmsg-trusted/xmsg --text "pong from trusted" --timeout 60s
  wait_for "svc:probe is registered on trusted" bash -c "journalctl -q --no-pager -o cat -u xmsg-fedanswer.service | grep -q 'registered as svc:probe'"
  probe_as xmsg-public "public -> svc:probe@trusted, reply back" send --dir /run/xmsg-public/xmsg --to svc:probe@trusted --want-reply "pong from trusted"
  check "trusted delivered it with a federation origin" bash -c "journalctl -q --no-pager -o cat -u xmsg-fedanswer.service | grep -q 'delivered .* from origin fed'"
  # trusted's policy for public: svc:probe only
  probe_as xmsg-public "a target trusted does not allow is refused" send --dir /run/xmsg-public/xmsg --to svc:other@trusted --want-status 403 --want-error op_denied

  # IPAddressDeny= on the daemon: its dial to the outsider (a configured peer, so Landlock
  # allows the port) is dropped by the unit and never reaches the listener.
  local seen; seen=$(fed_accepts)
  probe_as xmsg-public "the outsider is unreachable from the unit" send --dir /run/xmsg-public/xmsg --to svc:x@outsider --want-status 503 --want-error peer_unreachable
  check "... and the outsider saw no connection from the daemon ($seen before, $(fed_accepts) after)" test "$(fed_accepts)" = "$seen"

  # Mutant: IPAddressAllow= widened to the loopback range; now the dial gets through.
  fed_dropin public 's|^IPAddressAllow=.*|IPAddressAllow=127.0.0.0/8|'; fed_restart public
  seen=$(fed_accepts)
  as xmsg-public "$PROBE" send --dir /run/xmsg-public/xmsg --to svc:x@outsider --want-status 503 >/dev/null 2>&1
  check "mutant IPAddressAllow widened is caught: the outsider saw the daemon's connection ($seen before, $(fed_accepts) after)" test "$(fed_accepts)" -gt "$seen"

  # Mutant: Landlock off (the calls filtered out, --require-landlock dropped): the line says so.
  fed_dropin public 's|--require-landlock||; $a SystemCallFilter=~landlock_create_ruleset landlock_add_rule landlock_restrict_self'; fed_restart public
  line=$(fed_line public 'landlock'); info "mutant: $line"
  check "mutant Landlock off is caught: no 'net=enforced' line" bash -c "! grep -qE 'landlock: abi=[0-9]+ fs=enforced net=enforced' <<<\"\$1\"" _ "$line"

  systemctl stop xmsg-fedout.service xmsg-fedanswer.service 2>/dev/null
  for t in $TIERS; do rm -f "/etc/systemd/system/xmsg@$t.service.d/federation.conf" "/etc/systemd/system/xmsg@$t.service.d/peers.conf" "/etc/xmsg/$t/peers"; done
  systemctl daemon-reload
  for t in $TIERS; do systemctl stop "xmsg@$t.service"; done
}

# (8) Credential custody under the real unit: a secret delivered by LoadCredential=custody-tok
# (root-owned 0400 source) is held by the public daemon and handed, as a sealed memfd by
# SCM_RIGHTS, to svc:custody of that tier (a python3 script attested by its executable), and
# through `xmsg exec` to a shell it starts, which reads it by path. Controls and refusals:
# the tier user cannot read the source; svc:pyother (same executable, not in the policy) is
# refused op_denied with no descriptor; the value is in no journal line, no /proc/*/environ or
# cmdline, and not in doctor, which shows the pin.
custody() {
  local t=public d=/etc/systemd/system/xmsg@public.service.d py
  py=$(readlink -f "$(command -v python3 2>/dev/null)")
  if [ -z "$py" ] || ! "$py" -c 'import socket; socket.recv_fds' 2>/dev/null; then
    info "no python3 >= 3.9 on the host: the custody scenario needs it as the service"; bad "custody: python3 missing"; return
  fi
  local value; value="custody-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  local pin; pin="sha256:$(printf %s "$value" | sha256sum | cut -c1-16)"
  # The searches below read the value from this file (grep -f), never from an argument: a
  # command line holding it would be found by the /proc scan itself.
  local vf=/run/xmsg-custody.value; printf '%s\n' "$value" > "$vf"; chmod 0600 "$vf"
  printf %s "$value" > /etc/xmsg/$t/custody-tok; chown root:root /etc/xmsg/$t/custody-tok; chmod 0400 /etc/xmsg/$t/custody-tok
  # After probe.conf (drop-ins apply in name order): one XMSG_SVC_EXE for every service.
  printf '[Service]\nLoadCredential=custody-tok:/etc/xmsg/%s/custody-tok\nEnvironment=XMSG_CUSTODY=tok=svc:custody\nEnvironment=XMSG_SVC_EXE=probe=%s,custody=%s,pyother=%s\n' \
    "$t" "$PROBE" "$py" "$py" > "$d/z-custody.conf"
  cat > /tmp/xmsg-custody.py <<'PY'
import json, os, socket, subprocess, sys
name, mode = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
s.connect("/run/xmsg-public/xmsg/register.sock")
f = s.makefile("rb")
s.sendall(json.dumps({"harness": "svc", "name": name, "cwd": "/"}).encode() + b"\n")
reg = json.loads(f.readline())
if reg.get("status") != "ok":
    print("REGISTER", reg); sys.exit(1)
if mode == "exec":
    env = dict(os.environ, XMSG_AGENT_SOCK="/run/xmsg-public/xmsg/agent.sock")
    r = subprocess.run(["/usr/local/bin/xmsg", "exec", "--credential", "tok=TOK", "--", "sh", "-c", 'echo "path=$TOK"; cat "$TOK"'], env=env, capture_output=True, text=True)
    print("EXEC rc=%d %s %s" % (r.returncode, r.stdout.replace("\n", " "), r.stderr.strip()))
    # the service itself holds no memfd
    fds = [os.readlink("/proc/self/fd/" + n) for n in os.listdir("/proc/self/fd") if os.path.exists("/proc/self/fd/" + n)]
    print("SERVICE_MEMFDS", sum("memfd:" in l for l in fds))
    sys.exit(0)
s.sendall(b'{"action":"credential","name":"tok"}\n')
msg, fds, _, _ = socket.recv_fds(s, 4096, 4)
print("ANSWER", msg.decode().strip())
print("FDS", len(fds))
for fd in fds:
    print("VALUE", os.read(fd, 4096).decode())
    try:
        os.write(os.open("/proc/self/fd/%d" % fd, os.O_RDWR), b"x"); print("WRITE ok")
    except OSError as e:
        print("WRITE", e.strerror)
PY
  chmod 0644 /tmp/xmsg-custody.py
  systemctl daemon-reload
  systemctl stop "xmsg@$t.service"; systemctl reset-failed "xmsg@$t.service" 2>/dev/null
  probe_as "xmsg-$t" "xmsg-$t starts (probe own)" own --dir "/run/xmsg-$t/xmsg" >/dev/null
  local J; J=$(journalctl -q --no-pager -o cat _PID="$(mainpid $t)")
  grep 'custody secret loaded' <<<"$J" | sed 's/^/INFO journal: /'
  check "the daemon holds tok from the credentials directory with pin $pin" grep -q "custody secret loaded.* secret=tok pin=$pin source=credentials-directory allow=svc:custody" <<<"$J"
  check "/etc/xmsg/$t/custody-tok stays 0400 root:root" test "$(stat -c '%a %U %G' /etc/xmsg/$t/custody-tok)" = "400 root root"
  check "the tier user cannot read the source" as "xmsg-$t" bash -c "! cat /etc/xmsg/$t/custody-tok 2>/dev/null"
  check "positive control: root reads the source" test "$(cat /etc/xmsg/$t/custody-tok)" = "$value"

  local out; out=$(as "xmsg-$t" "$py" /tmp/xmsg-custody.py custody fd 2>&1); info "svc:custody: $(tr '\n' ' ' <<<"$out")"
  check "svc:custody received one descriptor and read the value" bash -c "grep -qx 'FDS 1' <<<\"\$1\" && grep -qx \"VALUE $value\" <<<\"\$1\"" _ "$out"
  check "the answer carries the name and pin, not the value" bash -c "grep -q '\"credential\":{\"name\":\"tok\",\"pin\":\"$pin\"}' <<<\"\$1\" && ! grep '^ANSWER' <<<\"\$1\" | grep -q \"$value\"" _ "$out"
  check "writing to the sealed memfd fails" grep -qx 'WRITE Operation not permitted' <<<"$out"
  out=$(as "xmsg-$t" "$py" /tmp/xmsg-custody.py pyother fd 2>&1); info "svc:pyother: $(tr '\n' ' ' <<<"$out")"
  check "svc:pyother (not in the policy) is refused op_denied, no descriptor" bash -c "grep -q '\"error\":\"op_denied\"' <<<\"\$1\" && grep -qx 'FDS 0' <<<\"\$1\"" _ "$out"
  out=$(as "xmsg-$t" "$py" /tmp/xmsg-custody.py custody exec 2>&1); info "xmsg exec below svc:custody: $(tr '\n' ' ' <<<"$out")"
  check "xmsg exec hands it through: the shell reads it via /proc/self/fd/3" bash -c "grep -q \"EXEC rc=0 path=/proc/self/fd/3 $value\" <<<\"\$1\"" _ "$out"
  check "... and the service holds no memfd" grep -qx 'SERVICE_MEMFDS 0' <<<"$out"

  local doc; doc=$(as "xmsg-$t" env XDG_RUNTIME_DIR=/run/xmsg-$t /usr/local/bin/xmsg doctor 2>&1)
  grep -E 'custody:|ptrace:' <<<"$doc" | sed 's/^ */INFO doctor: /'
  check "doctor shows tok, its pin and two hand-overs" grep -q "custody: tok pin $pin from credentials-directory, for svc:custody; handed over 2 times" <<<"$doc"
  check "the value is not in doctor's output" bash -c "! grep -qFf $vf <<<\"\$1\"" _ "$doc"
  check "the value is in no journal line" bash -c "! journalctl -q --no-pager -o cat | grep -qFf $vf"
  check "the value is in no /proc/*/environ or cmdline" bash -c "! cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -aqFf $vf"
  check "positive control: the search finds the value where it is" grep -qFf "$vf" /etc/xmsg/$t/custody-tok

  rm -f "$d/z-custody.conf" /etc/xmsg/$t/custody-tok /tmp/xmsg-custody.py "$vf"
  systemctl daemon-reload
  systemctl stop "xmsg@$t.service"
}

# (12) A session directory that appears after the start (Claude Code installed after the bus):
# Landlock cannot take it into a running daemon, so the daemon exits 75 and systemd, told by
# RestartForceExitStatus=75, starts it again while the socket units keep the sockets; that is
# no failure (SuccessExitStatus=75), and the new daemon's sandbox includes the directory.
relaunch() {
  local t=public d=/var/lib/xmsg-public/later/.claude/sessions hs=/run/xmsg-public/xmsg/http.sock
  local dropin=/etc/systemd/system/xmsg@$t.service.d/relaunch.conf pid1 pid2 n1 n2 h
  printf '[Service]\nEnvironment=XMSG_SESSIONS_DIR=%s\n' "$d" > "$dropin"
  rm -rf /var/lib/xmsg-public/later
  systemctl daemon-reload
  systemctl restart "xmsg@$t.service"
  wait_for "xmsg@$t.service active" systemctl -q is-active "xmsg@$t.service"
  h=$(as "xmsg-$t" /usr/local/bin/xmsg health --http-sock "$hs" 2>&1)
  check "positive control: the missing session dir is reported ($h)" grep -q sessions_dir_missing <<<"$h"
  pid1=$(mainpid $t); n1=$(systemctl show -P NRestarts "xmsg@$t.service")
  local cur; cur=$(journalctl -q -n0 --show-cursor | sed -n 's/^-- cursor: //p')
  as "xmsg-$t" mkdir -p "$d"
  wait_secs 20 "a new MainPID after $pid1" bash -c "p=\$(systemctl show -P MainPID xmsg@$t.service); [ -n \"\$p\" ] && [ \"\$p\" != 0 ] && [ \"\$p\" != $pid1 ]"
  wait_for "xmsg@$t.service active again" systemctl -q is-active "xmsg@$t.service"
  pid2=$(mainpid $t); n2=$(systemctl show -P NRestarts "xmsg@$t.service")
  check "systemd started the daemon again (MainPID $pid1 -> $pid2, NRestarts $n1 -> $n2)" bash -c "[ '$pid2' != '$pid1' ] && [ '$n2' -gt '$n1' ]"
  check "the journal says why" bash -c "journalctl -q --no-pager -u xmsg@$t.service | grep -q 'session dir appeared or was replaced'"
  check "exit 75 is no failure (no 'Failed with result' since the change)" bash -c "! journalctl -q --no-pager --after-cursor='$cur' -u xmsg@$t.service | grep -q 'Failed with result'"
  h=$(as "xmsg-$t" /usr/local/bin/xmsg health --http-sock "$hs" 2>&1)
  check "the new daemon serves the session dir ($h)" grep -q '"sessions_dir":"ok"' <<<"$h"
  rm -f "$dropin"; rm -rf /var/lib/xmsg-public/later
  systemctl daemon-reload
  systemctl restart "xmsg@$t.service"
}

# (13) Backup and a refused store. `xmsg backup` takes a copy of the running tier's store
# under the real unit and Landlock (positive control). Then the store's first meta page is
# zeroed: the daemon refuses it with exit 65 and one line, and RestartPreventExitStatus=65
# keeps systemd from starting it again every RestartSec=; the file is left as it was. Putting
# the backup back brings the tier up again, serving.
refused() {
  local t=public hs=/run/xmsg-public/xmsg/http.sock db=/var/lib/xmsg-public/xmsg.db bk=/var/lib/xmsg-public/backup.db
  local sum1 sum2 n out cur
  systemctl -q is-active "xmsg@$t.service" || probe_as "xmsg-$t" "start (probe own)" own --dir "/run/xmsg-$t/xmsg" >/dev/null
  out=$(as "xmsg-$t" /usr/local/bin/xmsg backup --http-sock "$hs" "$bk" 2>&1)
  check "positive control: xmsg backup under the unit ($out)" test -s "$bk"
  check "the backup is 0600 xmsg-$t" test "$(stat -c '%a %U' "$bk")" = "600 xmsg-$t"
  out=$(as "xmsg-$t" /usr/local/bin/xmsg doctor --http-sock "$hs" 2>&1)
  check "doctor shows the store's format and last backup" grep -q 'store: .*format [0-9]*, .*last backup [0-9]' <<<"$out"
  systemctl stop "xmsg-http@$t.socket" "xmsg-agent@$t.socket" "xmsg-register@$t.socket" "xmsg@$t.service"
  dd if=/dev/zero of="$db" bs=4096 count=1 conv=notrunc status=none
  sum1=$(sha256sum < "$db")
  cur=$(journalctl -q -n0 --show-cursor | sed -n 's/^-- cursor: //p')
  systemctl reset-failed "xmsg@$t.service" 2>/dev/null
  systemctl start "xmsg@$t.service" 2>/dev/null
  wait_secs 10 "xmsg@$t.service failed" bash -c "[ \"\$(systemctl show -P ActiveState xmsg@$t.service)\" = failed ]"
  # RestartSec=1s: had systemd restarted it, it would have done so within these seconds.
  sleep 3
  check "the unit stays failed" test "$(systemctl show -P ActiveState "xmsg@$t.service")" = failed
  check "exit status 65" test "$(systemctl show -P ExecMainStatus "xmsg@$t.service")" = 65
  n=$(systemctl show -P NRestarts "xmsg@$t.service")
  check "no restart (NRestarts=$n)" test "$n" = 0
  n=$(journalctl -q --no-pager -o cat --after-cursor="$cur" -u "xmsg@$t.service" | grep -c "xmsg: store: $db: meta page 0")
  check "one journal line names the file and the damage ($n)" test "$n" = 1
  sum2=$(sha256sum < "$db")
  check "the refused file is unchanged" test "$sum1" = "$sum2"
  install -o "xmsg-$t" -g "xmsg-$t" -m 0600 "$bk" "$db"
  rm -f "$bk"
  systemctl reset-failed "xmsg@$t.service"
  systemctl start "xmsg-http@$t.socket" "xmsg-agent@$t.socket" "xmsg-register@$t.socket"
  probe_as "xmsg-$t" "the restored store serves (probe own)" own --dir "/run/xmsg-$t/xmsg"
}

case "${1:-}" in
  setup) setup || { echo "FAIL setup"; exit 1; }; exit 0 ;;
  activation|credentials|hardening|isolation|crash|watchdog|units|nixos|fedunit|federation|custody|relaunch|refused) "$1"; finish ;;
  *) echo "usage: $0 setup|activation|credentials|hardening|isolation|crash|watchdog|units|nixos|fedunit|federation|custody|relaunch|refused" >&2; exit 64 ;;
esac
