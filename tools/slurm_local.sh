#!/usr/bin/env bash
# A real one-node Slurm on this machine for the Slurm lane (make test-slurm): installs Debian's slurm-wlm and
# munge where missing (as root), writes a small slurm.conf for this host, starts munged, slurmctld and slurmd, and
# waits until the node takes jobs. Exits non-zero, saying why, where any of that fails: the lane must not pass
# without a Slurm. `tools/slurm_local.sh stop` stops the daemons it started.
set -euo pipefail
STATE=${SLURM_LOCAL_STATE:-/tmp/slurm-local}
fail() { echo "slurm_local: $*" >&2; exit 1; }

if [ "${1:-start}" = stop ]; then
  for pidfile in "$STATE"/slurmd.pid "$STATE"/slurmctld.pid "$STATE"/munged.pid; do
    if [ -s "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
  exit 0
fi

[ "$(id -u)" -eq 0 ] || fail "needs root (it installs packages and runs slurmd); run the lane as root"
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || fail "slurm-wlm and munge are missing and there is no apt-get to install them"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null || fail "apt-get install slurm-wlm munge failed"
fi

mkdir -p "$STATE"/ctld "$STATE"/d /etc/slurm /run/munge /var/lib/munge /var/log/munge
host=$(hostname -s)
cpus=$(nproc)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

if [ ! -s /etc/munge/munge.key ]; then mungekey --create --keyfile /etc/munge/munge.key >/dev/null 2>&1 || \
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; fi
chmod 400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
  munged --force --pid-file "$STATE"/munged.pid 2>"$STATE"/munged.err || fail "munged did not start: $(cat "$STATE"/munged.err)"
fi
munge -n | unmunge >/dev/null 2>&1 || fail "munge does not work (munged: $(cat "$STATE"/munged.err 2>/dev/null))"
pgrep -x slurmctld >/dev/null || slurmctld -c || fail "slurmctld did not start (see $STATE/slurmctld.log)"
pgrep -x slurmd >/dev/null || slurmd -c || fail "slurmd did not start (see $STATE/slurmd.log)"
for _ in $(seq 60); do
  if sinfo -h -N -o "%T" 2>/dev/null | grep -Eq "^(idle|mixed|allocated)"; then
    echo "slurm_local: node $host up ($cpus CPUs), partition 'local'"
    exit 0
  fi
  sleep 1
done
fail "the node did not come up within 60 s: $(sinfo -h -N -o '%N %T %E' 2>&1 | head -n 1); logs in $STATE"
