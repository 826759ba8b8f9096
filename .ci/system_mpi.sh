#!/usr/bin/env bash
# CI: a slice of the suite under the system MPIs (docs/guides/clusters.md, "The cluster's own MPI").
# .ci/provision.sh installs Debian's Open MPI and MPICH; where either is missing this step says
# so and skips it (not root, no apt-get, no mirror).
#
# - Open MPI: the native layer built against it (HARNESS_MPICC=mpicc.openmpi, the documented
#   install option) in a second venv that shares the first one's packages, so only the layer is
#   built again; mpirun launches. The slice: every check of tests/mpi/comm_checks.py at
#   2, 3, 4 and 5 ranks; the main job at 4 ranks (a shorter one: three algorithms, 20
#   iterations); faults and the watchdog (a rank killed by a fault and the run resumed, a hung
#   rank), each named and stopped with nothing left running; the virtual-host test bed's 2-host
#   run and native-layer checks (tests/test_vhosts.py); and SLURM (tests/test_slurm.py): the
#   sbatch script (mpirun inside the allocation) and `--launcher srun` (srun --mpi=pmix).
#   The rest of tests/test_faults.py, tests/test_slurm.py and tests/test_vhosts.py passes under
#   Open MPI too (docs/guides/clusters.md); CI's 20 minutes leave room for this slice only.
# - Debian's MPICH: the default venv's layer (built for the MPICH ABI) on Debian's libmpich.so.12,
#   chosen at run time (HARNESS_LIBMPI); its mpiexec.mpich launches. The slice: every check of
#   comm_checks.py at 3 and 4 ranks (2 to 5 pass too), and the library every rank reports
#   (tests/test_system_mpi.py).
#
# Run from the repository root, inside the default venv (.ci/run calls it after the suite).
set -euo pipefail
started=$SECONDS
step() { echo "== $* ($((SECONDS - started)) s)"; }
SLICE="tests/test_comm_mpi.py"
BASE_SITE=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
    step "Open MPI: the native layer built against it"
    rm -rf .venv-openmpi
    python3 -m venv .venv-openmpi
    site=$(.venv-openmpi/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$BASE_SITE" > "$site/harness-base.pth"  # the first venv's packages; this venv's own harness
    HARNESS_MPICC=mpicc.openmpi .venv-openmpi/bin/pip install -q --no-deps -e . -C build-dir=build/openmpi
    (
        # mpirun refuses root without these; CI's containers run as root.
        export PATH="$PWD/.venv-openmpi/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        python -c 'from harness.mpi_library import MpiLibrary as M; m = M.of_this_environment(); print(m.compiled_with, "launched by", m.launcher())'
        step "Open MPI: the checks at 2-5 ranks, the main job at 4 ranks, faults, 2 virtual hosts, SLURM"
        HARNESS_TEST_RANKS=2,3,4,5 python -m pytest -q -p no:cacheprovider $SLICE tests/test_system_mpi.py \
            "tests/test_vhosts.py::test_run_across_hosts_on_one_clock[2hosts]" \
            tests/test_vhosts.py::test_the_native_layer_across_hosts \
            tests/test_faults.py::test_killed_rank_ends_the_job_and_resume_finishes_it \
            tests/test_faults.py::test_hung_rank_is_found_by_the_watchdog \
            tests/test_slurm.py::test_script_of_the_sbatch_command_runs_the_scenario \
            tests/test_slurm.py::test_the_srun_launcher_starts_the_ranks_with_this_mpis_plugin
    )
else
    echo "system_mpi: SKIP Open MPI: mpicc.openmpi or mpirun.openmpi missing (Debian's openmpi-bin, libopenmpi-dev)" >&2
fi

LIBMPICH=$(ls /usr/lib/*/libmpich.so.12 2>/dev/null | head -n1 || true)
if [ -n "$LIBMPICH" ] && command -v mpiexec.mpich >/dev/null; then
    step "Debian's MPICH (HARNESS_LIBMPI): the checks at 3 and 4 ranks"
    HARNESS_LIBMPI=$LIBMPICH HARNESS_TEST_RANKS=3,4 \
        python -m pytest -q -p no:cacheprovider $SLICE tests/test_system_mpi.py::test_the_library_is_the_one_chosen
else
    echo "system_mpi: SKIP Debian's MPICH: libmpich.so.12 or mpiexec.mpich missing (Debian's mpich, libmpich-dev)" >&2
fi
step "system MPIs done"
