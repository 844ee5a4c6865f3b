#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for the grid's Slurm tests (tests/test_grid.py):
# Debian's slurmctld, slurmd and munge, configured for this host's CPUs and started as root.
#   sudo bash scripts/slurm_local.sh start    # install (apt) if needed, configure, start; waits until idle
#   sudo bash scripts/slurm_local.sh stop
#   bash scripts/slurm_local.sh status       # exit 0 when a job can run
# Exit status of start: 0 running; 1 it could not start (the reason is printed).
set -euo pipefail
action="${1:-status}"
conf_dir=/etc/slurm
host="$(hostname -s)"

status() { timeout 20 sinfo -h -o "%T" 2>/dev/null | grep -qE "^(idle|mixed|allocated)"; }

case "$action" in
  status) status && { echo "slurm: up on $host"; exit 0; } || { echo "slurm: not running"; exit 1; } ;;
  stop)
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    pkill -x munged 2>/dev/null || true
    exit 0 ;;
  start) ;;
  *) echo "usage: slurm_local.sh start|stop|status" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || { echo "slurm_local.sh start: needs root (it installs packages and starts daemons)" >&2; exit 1; }
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge \
    >/tmp/slurm_local_apt.log 2>&1 || { echo "slurm_local.sh: apt-get install failed (/tmp/slurm_local_apt.log)" >&2; exit 1; }
fi
status && { echo "slurm: already up on $host"; exit 0; }

# munge: a key, its runtime folders, the daemon.
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
chmod 0700 /etc/munge /var/lib/munge /var/log/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- munged || munged --force

cpus="$(nproc)"
memory_mb="$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)"
mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > "$conf_dir/slurm.conf" <<CONF
# Written by scripts/slurm_local.sh: one node, this host, for tests.
ClusterName=plugin-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
DefMemPerCPU=$(( memory_mb / cpus ))
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
# No cgroup.conf: with proctrack/linuxproc and task/none the default plugin loads in a container
# (22.05 has no "CgroupPlugin=disabled").
rm -f "$conf_dir/cgroup.conf"

pgrep -x slurmctld >/dev/null || slurmctld || true
pgrep -x slurmd >/dev/null || slurmd || true
for _ in $(seq 1 30); do
  status && { echo "slurm: up on $host ($cpus CPUs, ${memory_mb} MB)"; exit 0; }
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm_local.sh: the daemons did not come up; logs: /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log" >&2
tail -5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 2>/dev/null || true
exit 1
