#!/usr/bin/env bash
# CI provisioning: the system packages some tests use, installed with apt-get as root. .ci/run
# calls it before the tests; the tests themselves install nothing: they look for the tools and
# skip, saying which are missing, where they are absent.
#
# Never fails CI: where it cannot install (not Linux, not root, no apt-get, a package missing
# from the mirror, no network), it prints why on stderr and exits 0; the tests that need the
# package then skip with the reason. Idempotent: installed packages are left as they are, and
# apt-get runs only for missing ones (apt-get update only when a first install fails).
set -u
set -o pipefail

# Each group is installed on its own: one the mirror lacks does not keep the others out.
GROUPS_=(
    # tests/test_slurm.py, tests/test_vhosts.py: a single-node SLURM (tests/slurm/start_slurm.sh)
    "slurm:--no-install-recommends:slurmctld slurmd slurm-client munge"
    # tests/test_vhosts.py: namespaces, links and sshd of the virtual hosts
    # (harness/testing/vhosts/start_vhosts.sh); unshare for tests/test_clock.py and test_calibrate.py
    "virtual hosts:--no-install-recommends:iproute2 openssh-server openssh-client util-linux"
    # tests/test_report.py: report.html in headless Chromium
    "chromium::chromium"
    # .ci/system_mpi.sh: the suite's slice under Debian's Open MPI and MPICH (tests/test_system_mpi.py)
    "system MPIs:--no-install-recommends:openmpi-bin libopenmpi-dev mpich libmpich-dev"
)
LOG=${TMPDIR:-/tmp}/harness-provision-apt.log

note() { echo "provision: $*" >&2; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing_all=()
for group in "${GROUPS_[@]}"; do
    for p in ${group##*:}; do installed "$p" || missing_all+=("$p"); done
done
if [ "${#missing_all[@]}" = 0 ]; then
    note "every package the tests use is installed"
    exit 0
fi
why=""
if [ "$(uname -s)" != Linux ]; then why="not Linux ($(uname -s))"
elif [ "$(id -u)" != 0 ]; then why="not root"
elif ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then why="no apt-get"
fi
if [ -n "$why" ]; then
    note "$why: not installing ${missing_all[*]}; the tests that need them skip"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# policy-rc.d answering 101: no package starts its service here (sshd, munge, slurmctld); the
# tests start the daemons they need themselves.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy && own_policy=1; fi
: > "$LOG"
updated=0
for group in "${GROUPS_[@]}"; do
    name=${group%%:*}; rest=${group#*:}; options=${rest%%:*}; packages=${rest#*:}
    missing=()
    for p in $packages; do installed "$p" || missing+=("$p"); done
    [ "${#missing[@]}" = 0 ] && continue
    note "installing ${missing[*]} ($name)"
    # shellcheck disable=SC2086  # options: none or one word
    install() { apt-get install -y -qq -o DPkg::Lock::Timeout=300 $options "${missing[@]}" >>"$LOG" 2>&1; }
    if ! install; then
        if [ $updated = 0 ]; then
            apt-get update -qq -o DPkg::Lock::Timeout=300 >>"$LOG" 2>&1 || note "apt-get update failed (no network or mirror?)"
            updated=1
        fi
        install || note "could not install ${missing[*]} ($name): $(tail -n1 "$LOG"); the tests that need them skip"
    fi
done
[ $own_policy = 1 ] && rm -f $policy
exit 0
