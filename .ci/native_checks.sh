#!/usr/bin/env bash
# Native checks (.ci/run calls this with the venv active): the C++ tests of kernels/tests and a
# slice of the multi-rank Python checks, under AddressSanitizer + UBSan, and the progress thread
# and the shared-memory path under ThreadSanitizer. Everything is built into build/native-checks/
# (CMake directly, -O1), never into the venv: the module `pip install -e .` built stays in place.
# Exits non-zero on any failure or sanitizer report. How to run parts of it: docs/guides/native-layer.md.
#
# Why the pieces are as they are:
# - Python and MPICH are not instrumented, so the Python slice runs with libasan preloaded and
#   leak detection off (the interpreter leaks by design); the instrumented module is loaded in
#   place of the venv's by kernels/tests/asan_site/sitecustomize.py.
# - TSan would report races inside the uninstrumented interpreter, so the progress thread and the
#   shared-memory path are driven by C++ binaries (engine_threads_test, shm_collective_test)
#   instead; kernels/tests/tsan.supp may only name MPICH internals, never harness code.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VIRTUAL_ENV:?activate the venv of the project first (. .venv/bin/activate)}"
OUT=${NATIVE_CHECKS_DIR:-build/native-checks}
JOBS=${JOBS:-2}
START=$SECONDS
step() { echo "== $* ($((SECONDS - START)) s)"; }
run() { echo "+ $*"; "$@"; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# pybind11 is a build requirement (pip installs it into an isolated build env), not a venv
# package: put a copy in the build directory once.
PYB=$OUT/pybind11
if ! PYTHONPATH=$PYB python -c "import pybind11" 2>/dev/null; then
  run pip install -q --no-deps --target "$PYB" 'pybind11>=2.13'
fi
PYBIND11_DIR=$(PYTHONPATH=$PYB python -c "import pybind11; print(pybind11.get_cmake_dir())")

step "configure (asan: module + tests; tsan: tests)"
run cmake -S . -B "$OUT/asan" -DCMAKE_BUILD_TYPE= -DHARNESS_SANITIZE=address -DHARNESS_NATIVE_TESTS=ON \
  -Dpybind11_DIR="$PYBIND11_DIR" -DPython_EXECUTABLE="$(command -v python)" >"$OUT/asan-configure.log" &
ASAN_CFG=$!
run cmake -S . -B "$OUT/tsan" -DCMAKE_BUILD_TYPE= -DHARNESS_SANITIZE=thread -DHARNESS_NATIVE_TESTS=ON \
  -DHARNESS_BUILD_MODULE=OFF >"$OUT/tsan-configure.log"
wait $ASAN_CFG

step "build asan"
run nice cmake --build "$OUT/asan" -j "$JOBS"
T=$OUT/asan/kernels/tests
CORE=$(ls "$OUT"/asan/_core*.so)

# halt_on_error: the first report fails the run; UBSan aborts on its own (-fno-sanitize-recover).
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

step "C++ unit tests under ASan + UBSan"
run "$T/step_program_test"
run "$T/link_emulator_test"
run mpiexec -n 3 "$T/shared_nics_test"
run mpiexec -n 2 "$T/engine_threads_test"
run mpiexec -n 3 "$T/shm_collective_test"

step "build tsan (in the background, while the Python slice runs)"
nice cmake --build "$OUT/tsan" -j 1 --target engine_threads_test shm_collective_test >"$OUT/tsan-build.log" 2>&1 &
TSAN_BUILD=$!

step "Python slice under ASan + UBSan: tests/mpi/comm_checks.py on 3 and 2 ranks"
# The interpreter is not instrumented: libasan must come first (LD_PRELOAD), and libstdc++ be
# loaded when it starts (else its __cxa_throw interceptor finds nothing to call, and the first
# C++ exception aborts). Each rank loads $CORE (asan_site/sitecustomize.py); the first command
# proves that it does.
ASAN_ENV=(env LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
  HARNESS_CORE_OVERRIDE="$CORE"
  PYTHONPATH="$PWD/kernels/tests/asan_site${PYTHONPATH:+:$PYTHONPATH}")
run "${ASAN_ENV[@]}" python -c "import harness._core as c, sys; assert c.__file__ == sys.argv[1], c.__file__" "$CORE"
for ranks in 3 2; do
  report=$OUT/comm_checks-$ranks.json
  rm -f "$report"
  run "${ASAN_ENV[@]}" timeout 240 mpiexec -n "$ranks" python -u tests/mpi/comm_checks.py "$report" -v >"$OUT/comm_checks-$ranks.log" 2>&1 \
    || { tail -n 80 "$OUT/comm_checks-$ranks.log"; echo "comm_checks.py on $ranks ranks failed under ASan"; exit 1; }
  # Every check must pass or skip (a skip says the rank count cannot show it).
  python - "$report" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
failed = {k: v["detail"] for k, v in report.items() if v["status"] == "fail"}
print(f"{len(report)} checks: {sum(v['status'] == 'pass' for v in report.values())} passed, "
      f"{sum(v['status'] == 'skip' for v in report.values())} skipped, {len(failed)} failed")
for name, detail in failed.items():
    print(f"FAILED {name}:\n{detail}")
sys.exit(1 if failed or not report else 0)
PY
done

step "progress thread and shared-memory path under TSan (engine_threads_test, shm_collective_test on 2 ranks)"
wait $TSAN_BUILD || { tail -n 40 "$OUT/tsan-build.log"; exit 1; }
# UCX (MPICH's network layer) hooks madvise, and its hook takes a lock while a thread exits,
# which crashes TSan's runtime: the hooks are off for this run (they only speed up memory
# registration for RDMA, unused between ranks of one host).
UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
  TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/kernels/tests/tsan.supp" \
  run mpiexec -n 2 "$OUT/tsan/kernels/tests/engine_threads_test"
UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
  TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/kernels/tests/tsan.supp" \
  run mpiexec -n 2 "$OUT/tsan/kernels/tests/shm_collective_test"

step "native checks passed"
