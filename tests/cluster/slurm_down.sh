#!/usr/bin/env bash
# Stops the cluster tests/cluster/slurm_up.sh started in STATE_DIR (default /tmp/specdec-slurm):
# each daemon by the PID file it wrote there, munged only if slurm_up.sh started it, then removes
# the /etc/slurm links that point into STATE_DIR. Running it twice, or after a failed start, is
# harmless.
set -uo pipefail

D="$(realpath -m "${1:-/tmp/specdec-slurm}")"

stop() {   # stop NAME PIDFILE: SIGTERM, then SIGKILL after 15 s
    local name=$1 pidfile=$2 pid
    [ -s "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 75); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "slurm_down.sh: $name (pid $pid) ignored SIGTERM; killing it" >&2
            kill -9 "$pid" 2>/dev/null
        fi
    fi
    rm -f "$pidfile"
}

stop slurmd "$D/run/slurmd.pid"
stop slurmctld "$D/run/slurmctld.pid"
stop slurmdbd "$D/run/slurmdbd.pid"
stop mariadbd "$D/run/mariadbd.pid"
if [ -f "$D/run/started-munged" ]; then
    stop munged "$(cat "$D/run/started-munged")"
    rm -f "$D/run/started-munged"
fi
for conf in slurm.conf slurmdbd.conf; do
    if [ "$(readlink "/etc/slurm/$conf" 2>/dev/null)" = "$D/$conf" ]; then
        rm -f "/etc/slurm/$conf"
    fi
done
