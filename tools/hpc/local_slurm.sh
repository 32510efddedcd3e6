#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (munged, slurmctld, slurmd from Debian's slurm-wlm and
# munge packages), for testing `srun ... hydragnn-train` for real. Needs root.
#   tools/hpc/local_slurm.sh start DIR   write DIR/slurm.conf, start the daemons, wait for the node
#   tools/hpc/local_slurm.sh stop DIR    stop the daemons started with DIR
# Then: SLURM_CONF=DIR/slurm.conf srun -n 2 --overcommit hydragnn-train config.json
set -euo pipefail
cmd=${1:?start or stop}; dir=$(realpath -m "${2:?a folder for the cluster state}")
conf="$dir/slurm.conf"
case "$cmd" in
start)
  mkdir -p "$dir"/{spool,state,log}
  host=$(hostname -s)
  cat > "$conf" <<CONF
ClusterName=hydragnn
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  if ! munge -n >/dev/null 2>&1; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
    runuser -u munge -- munged
  fi
  slurmctld -f "$conf"
  slurmd -f "$conf"
  for _ in $(seq 60); do
    if SLURM_CONF="$conf" sinfo -h -o %T 2>/dev/null | grep -q idle; then echo "SLURM_CONF=$conf"; exit 0; fi
    sleep 0.5
  done
  echo "local_slurm.sh: the node did not become idle; see $dir/log" >&2; exit 1 ;;
stop)
  for pid in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    [[ -f $pid ]] && kill "$(cat "$pid")" 2>/dev/null || true
  done ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
