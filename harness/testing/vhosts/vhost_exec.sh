#!/usr/bin/env bash
# vhost_exec.sh HOST CMD [ARGS...]: run CMD on a virtual host of harness/testing/vhosts/start_vhosts.sh,
# inside its network, host-name and clock namespaces (the file system is this machine's), with
# the test bed's environment:
#   HYDRA_LAUNCHER_EXEC  ssh with the test bed's keys and settings, for Hydra's proxies;
#   UCX_TLS=tcp          MPI's messages between virtual hosts cross their network: the hosts share
#                        one kernel, and UCX, seeing that, would otherwise move them through
#                        shared memory around the network (and around any shaping of it).
# Both reach the ranks: Hydra and sbatch pass the launching environment on. With
# HARNESS_VHOST_NO_SSH=1, HYDRA_LAUNCHER_EXEC is left out: for SLURM jobs, whose Hydra starts its
# proxies with srun and would take HYDRA_LAUNCHER_EXEC for the path of srun.
# Exit status: CMD's; 2 when HOST is not a running virtual host.
set -u
NS_DIR=/run/harness-vhosts
host=${1:-}
if [ -z "$host" ] || [ $# -lt 2 ]; then
    echo "usage: vhost_exec.sh HOST CMD [ARGS...]" >&2; exit 2
fi
shift
if [ ! -e "/run/netns/harness-$host" ] || [ ! -e "$NS_DIR/$host.uts" ]; then
    echo "vhost_exec.sh: no virtual host '$host' (start it with harness/testing/vhosts/start_vhosts.sh)" >&2; exit 2
fi
BASE=${HARNESS_VHOSTS_DIR:-/var/lib/harness-vhosts}
export UCX_TLS=tcp
# How each MPI's launcher reaches the other hosts: Hydra's and Open MPI's remote shell.
if [ "${HARNESS_VHOST_NO_SSH:-}" = 1 ]; then
    unset HYDRA_LAUNCHER_EXEC OMPI_MCA_plm_rsh_agent
else
    export HYDRA_LAUNCHER_EXEC=$BASE/bin/ssh OMPI_MCA_plm_rsh_agent=$BASE/bin/ssh
fi
exec nsenter --net="/run/netns/harness-$host" --uts="$NS_DIR/$host.uts" --time="$NS_DIR/$host.time" -- "$@"
