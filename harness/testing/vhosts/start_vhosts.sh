#!/usr/bin/env bash
# Start a test bed of virtual hosts on this machine: vh1 .. vhN, each a host of its own as far as
# MPI, ssh and the harness can tell, sharing this machine's file system as a cluster's nodes share
# their home directory.
#
# Each virtual host has
#   - its own network stack (network namespace harness-vhK) with one interface, eth0, address
#     198.18.0.K/24 (the benchmarking range 198.18.0.0/15, assigned inside the namespaces only),
#     a veth pair whose other end is a port of bridge br0 in a switch namespace (harness-vswitch):
#     the namespaces reach each other and nothing else, and this machine's own network stack
#     gets no address and no route to them;
#   - its own host name (a UTS namespace): `hostname` says vhK;
#   - optionally its own CLOCK_MONOTONIC (a time namespace shifted by a whole number of seconds),
#     so that clock alignment can be tested against a known skew;
#   - an sshd listening on its address only, which lets root in with a key this script creates:
#     Hydra (MPICH's mpiexec) starts its proxies on the hosts of a host file over ssh, as on a
#     cluster. The ssh client needs the test bed's configuration: `$BASE/bin/ssh` (pass it to
#     Hydra as HYDRA_LAUNCHER_EXEC) wraps ssh with it.
# Host names resolve through /etc/hosts lines this script adds (marked `# harness-vhosts`) and
# stop_vhosts.sh removes.
#
# Run a command on a virtual host with harness/testing/vhosts/vhost_exec.sh vhK CMD...
#
# Settings (environment):
#   HARNESS_VHOSTS       number of virtual hosts (default 3, at most 16)
#   HARNESS_VHOST_SKEW   CLOCK_MONOTONIC offset of each host in whole seconds, space-separated
#                        (default: 0 for every host); e.g. "0 7 -3"
#   HARNESS_VHOSTS_DIR   state: keys, configurations, pid files, logs (default /var/lib/harness-vhosts)
#
# Idempotent: when the test bed already runs with the same settings and every host answers, it
# exits 0 at once; with other settings it is stopped and built again. Needs root, Linux and
# Debian's iproute2, openssh-server, openssh-client and util-linux (installed by .ci/provision.sh;
# this script installs nothing).
#
# Output: progress on stderr; on success the last stdout line is the host names, space-separated.
# On failure: ONE line `start_vhosts: FAIL: <reason>` (the last line on stderr), nothing on stdout,
# and everything this run created is removed again (stop_vhosts.sh). Exit codes:
#   2 unsupported here (not root, not Linux, no namespaces)   3 the packages are not installed
#   4 the test bed could not be built                        5 a host did not answer in time
# Stop with harness/testing/vhosts/stop_vhosts.sh.

set -u
set -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${HARNESS_VHOSTS_DIR:-/var/lib/harness-vhosts}
N=${HARNESS_VHOSTS:-3}
SKEW=${HARNESS_VHOST_SKEW:-}
NS_DIR=/run/harness-vhosts  # namespace files: on a tmpfs, gone with a reboot like the namespaces
WAIT_S=30

log() { echo "start_vhosts: $*" >&2; }

fail() {  # fail CODE REASON...
    local code=$1; shift
    bash "$HERE/stop_vhosts.sh" >/dev/null 2>&1
    echo "start_vhosts: FAIL: $*" >&2
    exit "$code"
}

# --- where we can run ---------------------------------------------------------------------------
[ "$(uname -s)" = Linux ] || { echo "start_vhosts: FAIL: not Linux ($(uname -s))" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "start_vhosts: FAIL: not root (namespaces, /etc/hosts and sshd need root)" >&2; exit 2; }
case $N in ''|*[!0-9]*) echo "start_vhosts: FAIL: HARNESS_VHOSTS must be a number (got '$N')" >&2; exit 2 ;; esac
[ "$N" -ge 1 ] && [ "$N" -le 16 ] || { echo "start_vhosts: FAIL: HARNESS_VHOSTS must be 1..16 (got $N)" >&2; exit 2; }
read -r -a SKEWS <<< "$SKEW"
[ "${#SKEWS[@]}" = 0 ] && for _ in $(seq "$N"); do SKEWS+=(0); done
[ "${#SKEWS[@]}" = "$N" ] || { echo "start_vhosts: FAIL: HARNESS_VHOST_SKEW needs $N offsets (got '${SKEW}')" >&2; exit 2; }
for s in "${SKEWS[@]}"; do
    [[ $s =~ ^-?[0-9]+$ ]] || { echo "start_vhosts: FAIL: HARNESS_VHOST_SKEW: '$s' is not a whole number of seconds" >&2; exit 2; }
done

# One start or stop at a time (two test sessions would race on the namespaces). The daemons are
# started with fd 9 closed, or they would hold the lock for ever.
{ exec 9>/run/lock/harness-vhosts.lock; } 2>/dev/null || exec 9>/tmp/harness-vhosts.lock
flock -w 300 9 || { echo "start_vhosts: FAIL: another start_vhosts.sh holds the lock for more than 300 s" >&2; exit 4; }
export HARNESS_VHOSTS_LOCKED=1  # stop_vhosts.sh, called from here, must not wait for our lock

# --- packages -----------------------------------------------------------------------------------
missing=()
command -v ip >/dev/null && command -v tc >/dev/null || missing+=(iproute2)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v unshare >/dev/null && command -v nsenter >/dev/null || missing+=(util-linux)
# Installed by .ci/provision.sh (as root, with apt-get); this script installs nothing.
if [ "${#missing[@]}" -gt 0 ]; then
    echo "start_vhosts: FAIL: missing packages ${missing[*]} (.ci/provision.sh installs them)" >&2; exit 3
fi

# --- already running with these settings? --------------------------------------------------------
WANT="hosts=$N skew=${SKEWS[*]}"
healthy() {
    [ "$(cat "$BASE/settings" 2>/dev/null)" = "$WANT" ] || return 1
    local k
    for k in $(seq "$N"); do
        [ "$(bash "$HERE/vhost_exec.sh" "vh$k" hostname 2>/dev/null)" = "vh$k" ] || return 1
        [ -s "$BASE/run/sshd-vh$k.pid" ] && kill -0 "$(cat "$BASE/run/sshd-vh$k.pid")" 2>/dev/null || return 1
    done
    bash "$HERE/vhost_exec.sh" vh1 "$BASE/bin/ssh" "vh$N" true 2>/dev/null  # reachable only from a virtual host
}
hosts_line() { local k out=(); for k in $(seq "$N"); do out+=("vh$k"); done; echo "${out[*]}"; }
if healthy; then
    log "already running ($WANT)"
    hosts_line
    exit 0
fi
if [ -e "$BASE/settings" ] || ip netns list 2>/dev/null | grep -q '^harness-v'; then
    log "rebuilding (was: $(cat "$BASE/settings" 2>/dev/null || echo 'partial'))"
    bash "$HERE/stop_vhosts.sh" >&2
fi

t_start=$(date +%s%N)
mkdir -p "$BASE"/{bin,ssh,run,log} "$NS_DIR" || fail 4 "cannot create $BASE or $NS_DIR"
echo "$WANT" > "$BASE/settings.partial"

# --- the switch ---------------------------------------------------------------------------------
ip netns add harness-vswitch || fail 2 "cannot create a network namespace (ip netns add)"
ip -n harness-vswitch link set lo up
ip -n harness-vswitch link add br0 type bridge || fail 4 "cannot create the bridge"
ip -n harness-vswitch link set br0 up

# --- the hosts ----------------------------------------------------------------------------------
for k in $(seq "$N"); do
    h=vh$k
    ip netns add "harness-$h" || fail 4 "ip netns add harness-$h failed"
    # Both ends are created in the host's namespace, so nothing appears in this machine's own.
    ip -n "harness-$h" link add eth0 type veth peer name "$h-port" || fail 4 "veth for $h failed"
    ip -n "harness-$h" link set "$h-port" netns harness-vswitch || fail 4 "moving $h-port failed"
    ip -n "harness-$h" addr add "198.18.0.$k/24" dev eth0
    ip -n "harness-$h" link set eth0 up
    ip -n "harness-$h" link set lo up
    ip -n harness-vswitch link set "$h-port" master br0
    ip -n harness-vswitch link set "$h-port" up
    # Host name and clock: namespaces kept alive by bind mounts on files, entered with nsenter.
    touch "$NS_DIR/$h.uts" "$NS_DIR/$h.time"
    unshare --uts="$NS_DIR/$h.uts" --time="$NS_DIR/$h.time" --monotonic="${SKEWS[$((k - 1))]}" --fork \
        hostname "$h" || fail 2 "cannot create UTS and time namespaces (unshare --uts --time)"
done

# --- names ---------------------------------------------------------------------------------------
{
    grep -v '# harness-vhosts$' /etc/hosts
    for k in $(seq "$N"); do echo "198.18.0.$k vh$k # harness-vhosts"; done
} > /etc/hosts.harness-vhosts.new || fail 4 "cannot write /etc/hosts"
cat /etc/hosts.harness-vhosts.new > /etc/hosts && rm -f /etc/hosts.harness-vhosts.new  # in place: it may be a mount

# --- ssh -----------------------------------------------------------------------------------------
[ -s "$BASE/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C harness-vhosts -f "$BASE/ssh/id_ed25519" \
    || fail 4 "ssh-keygen failed"
[ -s "$BASE/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C harness-vhosts -f "$BASE/ssh/host_ed25519" \
    || fail 4 "ssh-keygen (host key) failed"
cp "$BASE/ssh/id_ed25519.pub" "$BASE/ssh/authorized_keys"
cat > "$BASE/ssh/sshd_config" <<EOF
# Written by harness/testing/vhosts/start_vhosts.sh: one sshd per virtual host (ListenAddress and PidFile
# are given on its command line).
HostKey $BASE/ssh/host_ed25519
AuthorizedKeysFile $BASE/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel ERROR
MaxStartups 200
MaxSessions 200
EOF
cat > "$BASE/ssh/config" <<EOF
# Written by harness/testing/vhosts/start_vhosts.sh: the ssh client settings for the virtual hosts.
Host vh*
    IdentityFile $BASE/ssh/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 30
EOF
cat > "$BASE/bin/ssh" <<EOF
#!/bin/sh
# ssh with the virtual hosts' client settings (Hydra: HYDRA_LAUNCHER_EXEC=$BASE/bin/ssh).
exec ssh -F $BASE/ssh/config "\$@"
EOF
chmod +x "$BASE/bin/ssh"
mkdir -p /run/sshd && chmod 755 /run/sshd  # sshd's privilege-separation directory
for k in $(seq "$N"); do
    h=vh$k
    bash "$HERE/vhost_exec.sh" "$h" /usr/sbin/sshd -f "$BASE/ssh/sshd_config" -o "ListenAddress=198.18.0.$k" \
        -o "PidFile=$BASE/run/sshd-$h.pid" -E "$BASE/log/sshd-$h.log" 9>&- \
        || fail 4 "sshd on $h did not start: $(tail -n1 "$BASE/log/sshd-$h.log" 2>/dev/null)"
done

# --- every host answers over ssh, from another host ----------------------------------------------
mv "$BASE/settings.partial" "$BASE/settings"
for k in $(seq "$N"); do
    from=vh$(( k % N + 1 ))
    ok=0
    for _ in $(seq $((WAIT_S * 5))); do
        if [ "$(bash "$HERE/vhost_exec.sh" "$from" "$BASE/bin/ssh" "vh$k" hostname 2>/dev/null)" = "vh$k" ]; then
            ok=1; break
        fi
        sleep 0.2
    done
    [ $ok = 1 ] || fail 5 "vh$k does not answer ssh from $from within ${WAIT_S} s ($(tail -n1 "$BASE/log/sshd-vh$k.log" 2>/dev/null))"
done
log "$N virtual hosts up in $(( ($(date +%s%N) - t_start) / 1000000 )) ms ($WANT, state in $BASE)"
hosts_line
