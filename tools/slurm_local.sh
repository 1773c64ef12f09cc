#!/usr/bin/env bash
# A private one-node Slurm on this machine for the Slurm lane (make test-slurm): installs Debian's slurm-wlm and
# munge where missing (as root), then keeps everything of its own in one folder, $SLURM_LOCAL_STATE (default
# /tmp/slurm-local): slurm.conf, the daemons' state, pid and log files, and munge's key, socket, seed and log. It
# starts munged on that socket, slurmctld and slurmd with that slurm.conf, waits until the node takes jobs, and
# prints (and writes to $SLURM_LOCAL_STATE/env) the line that points Slurm's commands at it:
#   eval "$(tools/slurm_local.sh)"     # export SLURM_CONF=/tmp/slurm-local/slurm.conf
# Nothing of the host's Slurm or munge is read or written (/etc/slurm, /etc/munge, /run/munge). It refuses, exit 2,
# where a slurmctld or slurmd it did not start runs here, or Slurm's ports already answer: the lane must not run on
# (or beside) a real cluster. Exits non-zero, saying why, where a step fails (what it started by then is stopped):
# the lane must not pass without a Slurm. `tools/slurm_local.sh stop` stops the daemons it started, and only those.
set -euo pipefail
STATE=${SLURM_LOCAL_STATE:-/tmp/slurm-local}
case $STATE in /*) ;; *) STATE=$PWD/$STATE ;; esac
CONF=$STATE/slurm.conf
MUNGE=$STATE/munge
SOCKET=$MUNGE/munge.socket
PORTS="6817 6818"  # SlurmctldPort, SlurmdPort (Slurm's defaults)
DAEMONS=(slurmd slurmctld munged)  # in the order they are stopped
refuse() { echo "error: $*" >&2; exit 2; }
fail() { echo "error: slurm_local: $*" >&2; exit 1; }

# ours NAME: the pid of the NAME daemon this script started ($STATE/NAME.pid, a live process of that name)
ours() {
  local pid
  pid=$(cat "$STATE/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
}

# within PID ANCESTOR: PID is ANCESTOR or one of its descendants (a daemon's forks keep its name a while)
within() {
  local pid=$1
  while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
    [ "$pid" = "$2" ] && return 0
    pid=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') || return 1
  done
  return 1
}

stop() {
  local name pid pids=""
  for name in "$@"; do
    if pid=$(ours "$name"); then kill "$pid" 2>/dev/null || true; pids="$pids $pid"; fi
  done
  for pid in $pids; do
    for _ in $(seq 300); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    [ ! -e "/proc/$pid" ] || echo "slurm_local: pid $pid did not end within 30 s" >&2
  done
  for name in "$@"; do rm -f "$STATE/$name.pid"; done
}

case ${1:-start} in
  start) ;;
  -h|--help) echo "usage: tools/slurm_local.sh [start|stop]"; sed -n '2,11s/^# //p' "$0"; exit 0 ;;
  stop)
    [ $# -le 1 ] || refuse "tools/slurm_local.sh stop takes no more arguments, got '$2'"
    stop "${DAEMONS[@]}"
    exit 0 ;;
  *) refuse "unknown command '$1': tools/slurm_local.sh [start|stop]" ;;
esac
[ $# -le 1 ] || refuse "tools/slurm_local.sh start takes no more arguments, got '$2'"
[ "$(id -u)" -eq 0 ] || refuse "tools/slurm_local.sh needs root (it installs packages and runs slurmd): run it as root"

# a Slurm this script did not start: its daemons' processes, or something on Slurm's ports
command -v pgrep >/dev/null 2>&1 || fail "pgrep is missing (Debian: apt-get install procps): it finds a running Slurm"
others=""
for name in slurmctld slurmd; do
  mine=$(ours "$name") || mine=""
  for pid in $(pgrep -x "$name" || true); do
    if [ -n "$mine" ] && within "$pid" "$mine"; then continue; fi
    state=$(ps -o stat= -p "$pid" 2>/dev/null) || continue  # ended since
    [[ $state == Z* ]] || others="$others $name (pid $pid)"  # (a zombie is no Slurm: a daemon's unreaped parent)
  done
done
[ -z "$others" ] || refuse "a Slurm that tools/slurm_local.sh did not start runs here:$others; it starts a private" \
  "one only where none runs: use that Slurm, or stop it (tools/slurm_local.sh stop stops only its own)"
if ! ours slurmctld >/dev/null && ! ours slurmd >/dev/null; then
  for port in $PORTS; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      refuse "port $port on this host already answers (a Slurm daemon of another container or user?): stop it," \
        "tools/slurm_local.sh starts a private Slurm only where Slurm's ports $PORTS are free"
    fi
  done
fi
if [ -L "$STATE" ] || { [ -e "$STATE" ] && [ "$(stat -c %u "$STATE")" != 0 ]; }; then
  refuse "$STATE is a link or not root's: set SLURM_LOCAL_STATE to a folder of its own"
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || fail "slurm-wlm and munge are missing and there is no apt-get to install them"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || fail "apt-get update failed: slurm-wlm and munge cannot be installed"
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null || \
    fail "apt-get install slurm-wlm munge failed"
fi

# from here on, a failure stops what this run started
started=()
# shellcheck disable=SC2317  # run by the trap
cleanup() { local rc=$?; if [ "$rc" -ne 0 ] && [ ${#started[@]} -gt 0 ]; then stop "${started[@]}"; fi; exit "$rc"; }
trap cleanup EXIT

mkdir -p "$STATE"
chmod 700 "$STATE"
mkdir -p "$STATE"/ctld "$STATE"/d "$MUNGE"
host=$(hostname -s)
cpus=$(nproc)
cat > "$CONF" <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${PORTS% *}
SlurmdPort=${PORTS#* }
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (120 s by default) is also how long a requeued job waits before it may start again, and the main
# scheduler looks at pending jobs every sched_interval (60 s by default): with 10 s and 2 s a job that requeues itself
# after Slurm's warning signal (sbatch --signal --requeue, tests/test_slurm.py) starts again seconds later
AuthInfo=socket=$SOCKET,cred_expire=10
SchedulerParameters=sched_interval=2
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
PlugStackConfig=$STATE/plugstack.conf
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
: > "$STATE"/plugstack.conf
export SLURM_CONF=$CONF

if [ ! -s "$MUNGE"/munge.key ]; then
  mungekey --create --keyfile "$MUNGE"/munge.key >/dev/null 2>&1 || \
    dd if=/dev/urandom of="$MUNGE"/munge.key bs=1024 count=1 2>/dev/null
fi
chmod 400 "$MUNGE"/munge.key
if ! ours munged >/dev/null; then
  munged --force --key-file "$MUNGE"/munge.key --socket "$SOCKET" --pid-file "$STATE"/munged.pid \
    --log-file "$MUNGE"/munged.log --seed-file "$MUNGE"/munged.seed 2>"$MUNGE"/munged.err || \
    fail "munged did not start: $(head -c 300 "$MUNGE"/munged.err)"
  started=(munged "${started[@]}")
fi
munge -n --socket "$SOCKET" | unmunge --socket "$SOCKET" >/dev/null 2>&1 || \
  fail "munge does not work (see $MUNGE/munged.log)"
if ! ours slurmctld >/dev/null; then
  slurmctld -c || fail "slurmctld did not start (see $STATE/slurmctld.log)"
  started=(slurmctld "${started[@]}")
fi
if ! ours slurmd >/dev/null; then
  slurmd -c || fail "slurmd did not start (see $STATE/slurmd.log)"
  started=(slurmd "${started[@]}")
fi
# until the node takes jobs, or a daemon has ended (its pid file gone stale, or never written within 10 s)
begin=$SECONDS
while [ $((SECONDS - begin)) -lt 60 ]; do
  if timeout 10 sinfo -h -N -o "%T" 2>/dev/null | grep -Eq "^(idle|mixed|allocated)"; then
    echo "export SLURM_CONF=$CONF" > "$STATE"/env
    echo "# slurm_local: node $host up ($cpus CPUs), partition 'local'; tools/slurm_local.sh stop stops it"
    echo "export SLURM_CONF=$CONF"
    exit 0
  fi
  for name in slurmctld slurmd; do
    if ! ours "$name" >/dev/null && { [ -s "$STATE/$name.pid" ] || [ $((SECONDS - begin)) -ge 10 ]; }; then
      fail "$name ended: $(grep -E "fatal|error" "$STATE/$name.log" | tail -n 1) (log: $STATE/$name.log)"
    fi
  done
  sleep 1
done
fail "the node did not come up within 60 s: $(timeout 10 sinfo -h -N -o '%N %T %E' 2>&1 | head -n 1); logs in $STATE"
