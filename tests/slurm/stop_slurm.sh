#!/usr/bin/env bash
# Stop the daemons tests/slurm/start_slurm.sh started: every slurmd, slurmctld (by their pid files under
# $HARNESS_SLURM_DIR, default /var/lib/harness-slurm) and its munged, only if start_slurm.sh started it.
# Running jobs are killed with slurmd.  Idempotent; always exits 0.

set -u
BASE=${HARNESS_SLURM_DIR:-/var/lib/harness-slurm}

stop() {  # stop PIDFILE: the daemon whose pid is in $BASE/run/PIDFILE.pid (slurmd-vh1: a slurmd)
    local f=$BASE/run/$1.pid pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${1%%-*}" ]; then
        kill "$pid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null && echo "stop_slurm: $1 ($pid) needed SIGKILL" >&2
        echo "stop_slurm: stopped $1 ($pid)" >&2
    fi
    rm -f "$f"
}

for f in "$BASE"/run/slurmd*.pid; do
    [ -e "$f" ] && stop "$(basename "$f" .pid)"
done
stop slurmctld
if [ -e "$BASE/run/munged.started" ]; then
    stop munged
    rm -f "$BASE/run/munged.started"
fi
exit 0
