#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, from Debian's packages, with accounting (slurmdbd on
# MariaDB) so that sacct answers as it does on a real cluster. For the integration tests
# (tests/test_slurm.py); .ci/run installs the packages:
#   apt-get install slurmctld slurmd slurm-client slurmdbd munge mariadb-server
#
#   tests/cluster/slurm_up.sh [STATE_DIR]     # default /tmp/specdec-slurm
#   tests/cluster/slurm_down.sh [STATE_DIR]   # stops every daemon this script started, by PID
#
# The node has this machine's cores and 80% of its available memory; one partition (debug) and one
# account (ci). Everything lives in STATE_DIR except two links: /etc/slurm/slurm.conf and
# /etc/slurm/slurmdbd.conf (the jobstep plugin drops SLURM_CONF, so the default path must hold the
# config). Exit status 3: this machine cannot run the cluster (the message says why); nothing was
# started. Any other failure stops what was started and prints the daemons' logs.
set -euo pipefail

D="$(realpath -m "${1:-/tmp/specdec-slurm}")"
HOST="$(hostname -s)"
ETC=/etc/slurm
MYSQL_SOCKET=/run/mysqld/mysqld.sock   # where slurmdbd's MySQL client looks for "localhost"

refuse() { echo "slurm_up.sh: a SLURM cluster cannot run on this machine: $*" >&2; exit 3; }

[ "$(id -u)" = 0 ] || refuse "it needs root (slurmd starts jobs as their user, the config goes to $ETC)"
for bin in munged slurmctld slurmd slurmdbd sacctmgr sbatch sacct squeue sinfo mariadbd mariadb mariadb-install-db; do
    command -v "$bin" >/dev/null || refuse "'$bin' is not installed (apt-get install slurmctld slurmd slurm-client slurmdbd munge mariadb-server)"
done
[ -r /etc/munge/munge.key ] || refuse "/etc/munge/munge.key is missing (the munge package creates it)"
for daemon in slurmctld slurmd slurmdbd mariadbd; do
    if pid=$(pgrep -x "$daemon"); then
        refuse "$daemon is already running (pid ${pid//$'\n'/ }); stop it first (tests/cluster/slurm_down.sh for one this script started)"
    fi
done
for conf in slurm.conf slurmdbd.conf; do
    if [ -e "$ETC/$conf" ] && [ "$(readlink "$ETC/$conf" || true)" != "$D/$conf" ]; then
        refuse "$ETC/$conf exists and is not this fixture's link; this machine has its own SLURM"
    fi
done

rm -rf "$D"
mkdir -p "$D"/{state,spool,run,log} "$ETC" /run/munge /run/mysqld
chown munge: /run/munge

cleanup_on_error() {
    echo "slurm_up.sh: failed; the daemons' logs follow" >&2
    tail -n 20 "$D"/log/*.log >&2 || true
    "$(dirname "$0")/slurm_down.sh" "$D" >&2 || true
}
trap cleanup_on_error ERR

wait_for() {   # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq $((seconds * 5))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "slurm_up.sh: $what did not come up within $seconds s" >&2
    return 1
}

# munge: the credentials slurmctld, slurmd and slurmdbd share. A munged already running is used
# and left alone; one started here is stopped by slurm_down.sh.
if ! pgrep -x munged >/dev/null; then
    su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=/run/munge/specdec-munged.pid"
    echo /run/munge/specdec-munged.pid > "$D/run/started-munged"
fi
wait_for 10 munged bash -c "munge -n | unmunge"

# MariaDB for slurmdbd: a private data directory, no TCP
mariadb-install-db --user=root --datadir="$D/mysql" --auth-root-authentication-method=socket \
    > "$D/log/mariadb-install.log" 2>&1
mariadbd --user=root --datadir="$D/mysql" --socket="$MYSQL_SOCKET" --pid-file="$D/run/mariadbd.pid" \
    --skip-networking --innodb-buffer-pool-size=32M --log-error="$D/log/mariadbd.log" \
    < /dev/null > "$D/log/mariadbd.out" 2>&1 &
wait_for 30 MariaDB mariadb --socket="$MYSQL_SOCKET" -e "SELECT 1"
mariadb --socket="$MYSQL_SOCKET" -e "CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"

cpus=$(nproc)
mem_mb=$(awk '/MemAvailable/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
cat > "$D/slurm.conf" <<EOF
ClusterName=ci
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageEnforce=associations
AccountingStoreFlags=job_comment
NodeName=$HOST CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
cat > "$D/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
chmod 600 "$D/slurmdbd.conf"
ln -sfn "$D/slurm.conf" "$ETC/slurm.conf"
ln -sfn "$D/slurmdbd.conf" "$ETC/slurmdbd.conf"

slurmdbd
wait_for 30 slurmdbd sacctmgr -n list cluster
# the cluster, its account and this user's association, before slurmctld registers
sacctmgr -i add cluster ci > /dev/null
sacctmgr -i add account ci Description=ci Organization=ci > /dev/null
sacctmgr -i add user root Account=ci DefaultAccount=ci > /dev/null

slurmctld
wait_for 30 slurmctld scontrol ping
slurmd
wait_for 60 "the node $HOST" bash -c "sinfo -h -n '$HOST' -o %t | grep -qx idle"

trap - ERR
echo "SLURM up: cluster ci, node $HOST ($cpus CPUs, $mem_mb MB), partition debug, account ci, state in $D"
