#!/usr/bin/env bash
# Remove everything harness/testing/vhosts/start_vhosts.sh created: every process running on a virtual host
# (its sshd, and whatever a test left there), the namespaces and their interfaces, the /etc/hosts
# lines marked `# harness-vhosts`, and the state under $HARNESS_VHOSTS_DIR (default
# /var/lib/harness-vhosts; the ssh keys are kept for the next start). Idempotent; always exits 0.
# Prints on stderr what it had to kill.
set -u
BASE=${HARNESS_VHOSTS_DIR:-/var/lib/harness-vhosts}
NS_DIR=/run/harness-vhosts

if [ -z "${HARNESS_VHOSTS_LOCKED:-}" ]; then  # start_vhosts.sh holds the lock when it calls us
    { exec 9>/run/lock/harness-vhosts.lock; } 2>/dev/null || exec 9>/tmp/harness-vhosts.lock
    flock -w 300 9
fi

# Processes: every one in a virtual host's network namespace, the sshd first (it starts no new
# sessions once stopped), then the rest; TERM, then KILL what is left.
hosts=$(ip netns list 2>/dev/null | awk '{print $1}' | grep '^harness-vh')
for sig in TERM KILL; do
    for ns in $hosts; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] || continue
        [ $sig = KILL ] && echo "stop_vhosts: $ns: killing what outlived SIGTERM: $(echo $pids)" >&2
        kill -s $sig $pids 2>/dev/null
    done
    for _ in $(seq 50); do
        left=0
        for ns in $hosts; do [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && left=1; done
        [ $left = 0 ] && break
        sleep 0.1
    done
done

# Namespaces: deleting a network namespace removes its veth pair (both ends) with it.
for ns in $hosts $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^harness-vswitch'); do
    ip netns del "$ns" 2>/dev/null
done
for f in "$NS_DIR"/*; do
    [ -e "$f" ] || continue
    umount "$f" 2>/dev/null
    rm -f "$f"
done
rmdir "$NS_DIR" 2>/dev/null

if grep -q '# harness-vhosts$' /etc/hosts 2>/dev/null; then
    grep -v '# harness-vhosts$' /etc/hosts > /etc/hosts.harness-vhosts.new && cat /etc/hosts.harness-vhosts.new > /etc/hosts
    rm -f /etc/hosts.harness-vhosts.new
fi
rm -rf "$BASE/run" "$BASE/log" "$BASE/bin" "$BASE/settings" "$BASE/settings.partial"
exit 0
