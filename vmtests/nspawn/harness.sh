#!/usr/bin/env bash
# harness.sh -- boot a real systemd as PID 1 of a systemd-nspawn container, run commands in
# it, tear it down. Used by vmtests/nspawn_test.go to test xmsg's own units under a real
# systemd on hosts whose PID 1 is not systemd (CI runners, Firecracker VMs).
#
# Host-root mode only: the container boots the HOST's /usr read-only on an empty tmpfs root
# (--volatile=yes), so nothing is downloaded or built and a boot takes well under a second.
# Needs root, systemd-nspawn (Debian: systemd-container), unshare and nsenter (util-linux).
#
# Usage:
#   harness.sh boot               start the container, wait until systemd is running
#   harness.sh exec CMD...        run CMD inside (as root, in PID 1's namespaces)
#   harness.sh down               stop the container, remove its cgroups (idempotent)
#   harness.sh all                boot + exec sh -c "$TEST" + down (down also on failure)
#
# Environment:
#   STATE=/tmp/xmsg-nspawn   pid files, machine-id, console.log of this run (one run per STATE)
#   PAYLOAD=                 host directory bind-mounted read-only at /xmsg-payload
#   TEST=                    command line for `all`
#   MACHINE=xmsg-vmtest      container hostname
#   BPF=1                    CAP_BPF + bpf(2) for the container's PID 1, so IPAddressDeny= and
#                            DevicePolicy= are enforced (without: silently not enforced)
#   BOOT_TIMEOUT=60
#
# Why the flags (each was needed on such a host):
#   --register=no --keep-unit  without both, nspawn dials the host's (absent) system bus
#   unshare -m + tmpfs /run    nspawn writes /run/systemd/nspawn/{locks,propagate} on the host
#                              and cannot clean them up on a non-tmpfs /run
#   own cgroup                 --keep-unit makes nspawn create payload/ + supervisor/ in its
#                              CURRENT cgroup: give it a throw-away one and rmdir it afterwards
#   --console=pipe             no TTY in CI; the container's console goes to $STATE/console.log
#   machine-id bind + masks    an empty /etc means "first boot": the firstboot wizard would
#                              block, and preset-all would enable every unit installed on the host
#   SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1  a pure cgroup2 container even on a hybrid host
set -euo pipefail

STATE=${STATE:-/tmp/xmsg-nspawn}
PAYLOAD=${PAYLOAD:-}
TEST=${TEST:-}
MACHINE=${MACHINE:-xmsg-vmtest}
BPF=${BPF:-1}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-60}
INIT_ARGS="systemd.firstboot=off systemd.mask=systemd-firstboot.service systemd.mask=systemd-machine-id-commit.service"
CPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log()  { printf '[harness %(%T)T] %s\n' -1 "$*" >&2; }
now()  { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }
die()  { log "ERROR: $*"; exit 1; }

host_pid1_is_systemd() { [ "$(cat /proc/1/comm)" = systemd ]; }

boot() {
  [ "$(id -u)" = 0 ] || die "needs root"
  mkdir -p "$STATE"
  [ -f "$STATE/nspawn.pid" ] && kill -0 "$(cat "$STATE/nspawn.pid")" 2>/dev/null \
    && die "a container from $STATE is already running"
  local t; t=$(now)
  [ -s "$STATE/machine-id" ] || systemd-id128 new > "$STATE/machine-id"
  local -a args=(-b -D / -M "$MACHINE" --register=no --keep-unit --console=pipe --volatile=yes
                 --bind-ro="$STATE/machine-id:/etc/machine-id")
  [ "$BPF" = 1 ] && args+=(--capability=CAP_BPF --system-call-filter=bpf)
  # nspawn's own seccomp allow-list (systemd 252) predates Landlock: without this, every process
  # the container's PID 1 starts gets EPERM from landlock_*(2), whatever the unit allows.
  args+=(--system-call-filter="landlock_create_ruleset landlock_add_rule landlock_restrict_self")
  [ -n "$PAYLOAD" ] && args+=(--bind-ro="$PAYLOAD:/xmsg-payload")
  export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
  local cg="xmsg-nspawn-$$" h cgdirs=""
  if ! host_pid1_is_systemd; then
    for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do
      if [ -f "$h/cgroup.procs" ] && [ ! -d "$h/$cg" ] && mkdir "$h/$cg" 2>/dev/null; then
        cgdirs+="$h/$cg "
      fi
    done
  fi
  echo "$cgdirs" > "$STATE/cgroups"
  log "boot: systemd-nspawn ${args[*]}"
  (
    for d in $cgdirs; do echo "$BASHPID" > "$d/cgroup.procs"; done
    # shellcheck disable=SC2086
    exec unshare --mount --propagation private -- sh -c \
      'mount -t tmpfs -o mode=0755,size=16m xmsg-harness-run /run && exec "$@"' sh \
      systemd-nspawn "${args[@]}" $INIT_ARGS
  ) > "$STATE/console.log" 2>&1 < /dev/null &
  local np=$!
  echo "$np" > "$STATE/nspawn.pid"
  # Wait until the container's PID 1 has exec'd systemd in its own namespaces.
  local leader="" c
  for _ in $(seq $((BOOT_TIMEOUT * 10))); do
    kill -0 "$np" 2>/dev/null || { cat "$STATE/console.log" >&2; die "systemd-nspawn exited during boot"; }
    for c in $(pgrep -P "$np" || true); do
      if [ "$(readlink "/proc/$c/ns/pid" 2>/dev/null)" != "$(readlink /proc/self/ns/pid)" ] &&
         nsenter -t "$c" -m -p test -S /run/systemd/private 2>/dev/null; then leader=$c; break; fi
    done
    [ -n "$leader" ] && break
    sleep 0.1
  done
  [ -n "$leader" ] || die "container PID 1 did not come up in ${BOOT_TIMEOUT}s"
  echo "$leader" > "$STATE/leader.pid"
  local st
  st=$(timeout "$BOOT_TIMEOUT" nsenter -t "$leader" -a env -i PATH="$CPATH" \
        systemctl is-system-running --wait 2>&1) || true
  log "TIMING boot $(took "$t")s state=$st nspawn_pid=$np leader_pid=$leader"
  case "$st" in
    running) ;;
    degraded) cexec systemctl --no-pager --failed >&2 || true ;;
    *) die "container did not reach running/degraded: $st" ;;
  esac
}

cexec() {
  local leader; leader=$(cat "$STATE/leader.pid" 2>/dev/null) || die "not booted"
  nsenter -t "$leader" -a env -i PATH="$CPATH" TERM=dumb SYSTEMD_PAGER= SYSTEMD_COLORS=0 LC_ALL=C "$@"
}

down() {
  local t np leader d; t=$(now)
  np=$(cat "$STATE/nspawn.pid" 2>/dev/null || true)
  leader=$(cat "$STATE/leader.pid" 2>/dev/null || true)
  if [ -n "$np" ] && kill -0 "$np" 2>/dev/null; then
    kill -TERM "$np"                       # nspawn turns this into an orderly halt
    for _ in $(seq 200); do kill -0 "$np" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$np" 2>/dev/null; then
      log "down: orderly halt timed out, forcing"
      kill -TERM "$np" 2>/dev/null || true   # a 2nd SIGTERM = immediate termination
      sleep 2
      [ -n "$leader" ] && kill -KILL "$leader" 2>/dev/null || true   # kills the whole PID ns
      kill -KILL "$np" 2>/dev/null || true
    fi
  fi
  # nspawn itself gone (killed with its caller) but the container's PID 1 still alive: kill
  # that PID 1, which takes its whole PID namespace with it. Only if it still is the process
  # we recorded: systemd, in a PID namespace other than ours.
  if [ -n "$leader" ] && [ "$(cat "/proc/$leader/comm" 2>/dev/null)" = systemd ] &&
     [ "$(readlink "/proc/$leader/ns/pid")" != "$(readlink /proc/self/ns/pid)" ]; then
    log "down: container PID 1 ($leader) outlived systemd-nspawn, killing it"
    kill -KILL "$leader" 2>/dev/null || true
    for _ in $(seq 50); do [ -d "/proc/$leader" ] || break; sleep 0.1; done
  fi
  for d in $(cat "$STATE/cgroups" 2>/dev/null); do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$d" ] && log "down: could not remove cgroup $d"
  done
  rm -f "$STATE/nspawn.pid" "$STATE/leader.pid" "$STATE/cgroups"
  log "TIMING down $(took "$t")s"
}

all() {
  local t0 rc=0; t0=$(now)
  [ -n "$TEST" ] || die "TEST is empty"
  trap down EXIT
  boot
  cexec /bin/sh -c "$TEST" || rc=$?
  log "TIMING total $(took "$t0")s rc=$rc"
  return "$rc"
}

cmd=${1:-}; shift || true
case "$cmd" in
  boot) boot ;; down) down ;; exec) cexec "$@" ;; all) all ;;
  *) echo "usage: $0 boot|exec CMD...|down|all" >&2; exit 64 ;;
esac
