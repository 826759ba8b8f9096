#!/usr/bin/env bash
# Start a single-node SLURM (slurmctld + slurmd, authenticated by munge) on this machine, for tests.
#
# Idempotent: starts only the daemons not already up, and exits 0 once `sinfo` shows this node
# idle.  Needs root, Linux and Debian's SLURM packages (slurmctld slurmd slurm-client munge,
# installed by .ci/provision.sh; this script installs nothing); no systemd needed (the daemons
# are run directly, in the background).
#
# Everything lives under $HARNESS_SLURM_DIR (default /var/lib/harness-slurm): slurm.conf, state,
# spool, logs, pid files and the socket of the cluster's own munged.  The system's
# /etc/slurm/slurm.conf is NOT written, so a real SLURM configuration on the machine is never
# touched; clients therefore need SLURM_CONF:
#     eval "$(tests/slurm/start_slurm.sh | tail -n1)"    # last line: export SLURM_CONF=...
# (jobs get SLURM_CONF in their environment from slurmd, so srun inside a job finds it too).
#
# Output: progress on stderr; on success the last stdout line is `export SLURM_CONF=<path>`.
# On failure: ONE line `start_slurm: FAIL: <reason>` (the last line on stderr), nothing on stdout,
# and whatever this run started is stopped again.  Exit codes:
#   2 unsupported here (not root / not Linux)                3 the packages are not installed
#   4 a daemon did not start (munged, slurmctld, slurmd)    5 the node did not become idle in time
# Stop with tests/slurm/stop_slurm.sh.
#
# Several nodes on one machine: with HARNESS_SLURM_NODES="vh1 vh2" (virtual hosts of
# harness/testing/vhosts/start_vhosts.sh, which must be running) slurmctld runs on the first of them and one
# slurmd on each, every daemon and client started inside its virtual host through
# harness/testing/vhosts/vhost_exec.sh; clients (sbatch, sinfo) must then run on a virtual host too. Use
# another HARNESS_SLURM_DIR for it than for the single-node cluster (tests/test_vhosts.py does).
#
# Settings that matter (see write_conf):
#   SlurmdParameters=config_overrides  the node may declare more CPUs than it has (CPUs=8 on a
#                                      2-core machine), so 4- and 8-task jobs fit;
#   ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, JobAcctGatherType=jobacct_gather/none
#                                      no cgroups/systemd needed (containers);
#   SlurmUser=root                     the daemons run as the user that starts them (root here);
#   ReturnToService=2                  a node that was down comes back when slurmd registers;
#   MpiDefault=none                    srun --mpi=pmi2 / --mpi=pmix select PMI explicitly.

set -u
set -o pipefail

BASE=${HARNESS_SLURM_DIR:-/var/lib/harness-slurm}
VHOST_EXEC=$(cd "$(dirname "$0")/../.." && pwd)/harness/testing/vhosts/vhost_exec.sh
read -r -a NODES <<< "${HARNESS_SLURM_NODES:-}"
CONF=$BASE/slurm.conf
NODE_CPUS=${HARNESS_SLURM_CPUS:-8}
WAIT_S=${HARNESS_SLURM_WAIT:-60}
export SLURM_CONF=$CONF

STARTED=()   # daemons this run started, stopped again on failure

log() { echo "start_slurm: $*" >&2; }

stop_started() {
    local name pidfile pid
    for name in "${STARTED[@]}"; do
        pidfile=$BASE/run/$name.pid
        [ -s "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
        rm -f "$pidfile"
    done
    [ "${#STARTED[@]}" -gt 0 ] && rm -f "$BASE/run/munged.started"
}

fail() {  # fail CODE REASON...
    local code=$1; shift
    stop_started
    echo "start_slurm: FAIL: $*" >&2
    exit "$code"
}

# --- where we can run ---------------------------------------------------------------------------
[ "$(uname -s)" = Linux ] || fail 2 "not Linux ($(uname -s))"
[ "$(id -u)" = 0 ] || fail 2 "not root (installing packages and running slurmd need root)"

# One start at a time (two test sessions at once would race on the daemons).
# The daemons are started with fd 9 closed, or they would hold the lock for ever.
{ exec 9>/run/lock/harness-slurm.lock; } 2>/dev/null || exec 9>/tmp/harness-slurm.lock
flock -w 900 9 || fail 4 "another start_slurm.sh holds the lock for more than 900 s"

# --- packages -----------------------------------------------------------------------------------
PKGS="slurmctld slurmd slurm-client munge"
missing=()
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Installed by .ci/provision.sh (as root, with apt-get); this script installs nothing.
[ "${#missing[@]}" = 0 ] || fail 3 "SLURM is not installed (missing ${missing[*]}; .ci/provision.sh installs them)"
for b in munged munge unmunge slurmctld slurmd sinfo sbatch srun scontrol; do
    command -v "$b" >/dev/null || fail 3 "$b not found (the packages $PKGS are installed)"
done

mkdir -p "$BASE"/{state,spool,log,run} || fail 4 "cannot create $BASE"

# --- munge --------------------------------------------------------------------------------------
# A munged of this cluster's own, on its own socket (slurm.conf's AuthInfo names it): the
# single-node cluster and the virtual hosts' one may run at once (two test files side by side),
# and stopping one cluster must not take the other's authentication with it.
MUNGE_DIR=$BASE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
munge_ok() { munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }
if ! munge_ok; then
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key || fail 4 "cannot create the munge key"
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null \
                || fail 4 "cannot create the munge key"
        fi
    fi
    chown -R munge:munge /etc/munge && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
    mkdir -p "$MUNGE_DIR" && chown munge:munge "$MUNGE_DIR" && chmod 755 "$MUNGE_DIR" \
        || fail 4 "cannot create $MUNGE_DIR"
    log "starting munged on $MUNGE_SOCKET"
    # munged daemonizes; as the munge user, like the Debian service does.  --force: a stale
    # socket left by a killed munged is replaced.
    runuser -u munge -- munged --force --socket="$MUNGE_SOCKET" --pid-file="$MUNGE_DIR/munged.pid" \
        --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
        >/dev/null 2>"$BASE/log/munged.start" 9>&- \
        || fail 4 "munged did not start: $(tail -n1 "$BASE/log/munged.start")"
    cp "$MUNGE_DIR/munged.pid" "$BASE/run/munged.pid" 2>/dev/null
    touch "$BASE/run/munged.started"
    STARTED+=(munged)
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
    munge_ok || fail 4 "munged started but munge -n | unmunge fails"
fi

# --- slurm.conf ---------------------------------------------------------------------------------
if [ "${#NODES[@]}" -gt 0 ]; then
    for n in "${NODES[@]}"; do
        bash "$VHOST_EXEC" "$n" true || fail 4 "virtual host $n is not running (harness/testing/vhosts/start_vhosts.sh)"
    done
    NODE=${NODES[0]}
    on() { local host=$1; shift; bash "$VHOST_EXEC" "$host" "$@"; }   # on HOST CMD...: inside that host
else
    NODES=("$(hostname -s)")
    NODE=${NODES[0]}
    on() { shift; "$@"; }
fi
PIDS=""   # several slurmd on one machine: pid, spool and log files per node (%n: the node name)
[ "${#NODES[@]}" -gt 1 ] && PIDS=-%n
write_conf() {
    cat > "$CONF.new" <<EOF
# Written by tests/slurm/start_slurm.sh: test cluster of ${NODES[*]}.
ClusterName=harness
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool$PIDS
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd$PIDS.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd$PIDS.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$(IFS=,; echo "${NODES[*]}") CPUs=$NODE_CPUS State=UNKNOWN
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new"; then
        rm -f "$CONF.new"; return 1   # unchanged
    fi
    mv "$CONF.new" "$CONF"; return 0
}
conf_changed=0
write_conf && conf_changed=1

running() {  # running PIDFILE: the pid in $BASE/run/PIDFILE.pid is alive and is that daemon
    local f=$BASE/run/$1.pid
    [ -s "$f" ] && [ "$(cat "/proc/$(cat "$f")/comm" 2>/dev/null)" = "${1%%-*}" ]
}
SLURMDS=()   # the pid file name of each node's slurmd
for n in "${NODES[@]}"; do SLURMDS+=("slurmd${PIDS:+-$n}"); done

if [ "$conf_changed" = 1 ]; then   # a running daemon would keep the old configuration
    for d in "${SLURMDS[@]}" slurmctld; do
        if running "$d"; then
            log "configuration changed, restarting $d"
            pid=$(cat "$BASE/run/$d.pid"); kill "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
    done
fi

# --- slurmctld, slurmd --------------------------------------------------------------------------
if ! running slurmctld; then
    log "starting slurmctld on $NODE"
    # -i: ignore unreadable state from an older run rather than refuse to start
    on "$NODE" slurmctld -f "$CONF" -i >/dev/null 2>"$BASE/log/slurmctld.start" 9>&- \
        || fail 4 "slurmctld did not start: $(tail -n1 "$BASE/log/slurmctld.start") (log $BASE/log/slurmctld.log)"
    STARTED+=(slurmctld)
fi
for _ in $(seq 100); do on "$NODE" scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
on "$NODE" scontrol ping 2>/dev/null | grep -q "is UP" \
    || fail 4 "slurmctld not answering: $(grep -iE 'error|fatal' "$BASE/log/slurmctld.log" | tail -n1)"

for i in "${!NODES[@]}"; do
    n=${NODES[$i]} d=${SLURMDS[$i]}
    if ! running "$d"; then
        log "starting slurmd on $n"
        on "$n" slurmd -f "$CONF" >/dev/null 2>"$BASE/log/$d.start" 9>&- \
            || fail 4 "slurmd on $n did not start: $(tail -n1 "$BASE/log/$d.start") (log $BASE/log/$d.log)"
        STARTED+=("$d")
    fi
done

# --- wait for the nodes ---------------------------------------------------------------------------
for i in "${!NODES[@]}"; do
    n=${NODES[$i]} d=${SLURMDS[$i]}
    state=""
    for k in $(seq $((WAIT_S * 2))); do
        state=$(on "$NODE" sinfo -h -n "$n" -o %T 2>/dev/null | head -n1)
        case $state in
            idle|mixed|allocated) break ;;
            drain*|down*) [ $((k % 10)) = 1 ] && on "$NODE" scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 ;;
        esac
        # slurmd writes its pid file after it daemonizes, which a loaded machine can delay: gone is
        # a pid file whose daemon ended, or none after 10 s.
        if ! running "$d" && { [ -s "$BASE/run/$d.pid" ] || [ "$k" -gt 20 ]; }; then
            fail 4 "slurmd on $n exited: $(grep -iE 'error|fatal' "$BASE/log/$d.log" | tail -n1)"
        fi
        sleep 0.5
    done
    case $state in
        idle|mixed|allocated) ;;
        *) fail 5 "node $n not idle after ${WAIT_S} s (state '${state}'; $(on "$NODE" scontrol show node "$n" 2>/dev/null | grep -o 'Reason=.*'))" ;;
    esac
done
log "nodes ${NODES[*]} are up (conf $CONF)"
echo "export SLURM_CONF=$CONF"
