"""Under whichever MPI this environment runs on (harness.mpi_library): the library every rank calls is
the one chosen, mpi4py and the native layer share it, and ``run.json`` says so.

The default suite runs these on the PyPI MPICH; ``.ci/system_mpi.sh`` runs them again under Debian's
Open MPI (the layer built with ``HARNESS_MPICC=mpicc.openmpi``) and Debian's MPICH (``HARNESS_LIBMPI``),
together with the main job at 4 ranks, which the default suite covers in tests/test_run.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import REPO, harness_cli

from harness.launch import run_ranks
from harness.mpi_library import LIBMPI_VAR, native_build

PROBE = (
    "import json, sys; from harness.mpi_library import import_mpi, run_record; MPI = import_mpi(); "
    "r = MPI.COMM_WORLD.rank; open(f'{sys.argv[1]}/{r}.json', 'w').write(json.dumps({'rank': r, **run_record(MPI)}))"
)


def _expected_file() -> str | None:
    chosen = os.environ.get(LIBMPI_VAR)
    return str(Path(chosen).resolve()) if chosen else None


@pytest.mark.mpi
def test_the_library_is_the_one_chosen(tmp_path):
    proc = run_ranks(3, ["python", "-c", PROBE, str(tmp_path)], capture=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert sorted(r["rank"] for r in records) == [0, 1, 2]
    assert len({r["file"] for r in records}) == 1, records  # one library on every rank
    record = records[0]
    assert record["family"] == native_build()["family"]
    expected = _expected_file()
    if expected is not None:
        assert record["file"] == expected and record["chosen_by"].startswith(LIBMPI_VAR)
    elif not native_build()["mpicc"]:
        assert record["library"].startswith("MPICH") and "the PyPI mpich wheel" in record["chosen_by"]
    else:
        assert record["chosen_by"].startswith("HARNESS_MPICC")


@pytest.mark.mpi
@pytest.mark.skipif(not native_build()["mpicc"] and not os.environ.get(LIBMPI_VAR),
                    reason="the PyPI MPICH's main job is tests/test_run.py's; this one runs under a system MPI")
def test_the_main_job_at_4_ranks(tmp_path):
    out = tmp_path / "results"
    proc = harness_cli("run", str(REPO / "scenarios" / "straggler.yaml"), "--ranks", "4", "--iterations", "20",
                       "--only", "allreduce_sgd,wagma,sgp", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / "straggler").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete"
    assert meta["mpi"]["family"] == native_build()["family"], meta["mpi"]
    assert meta["mpi"]["chosen_by"].startswith(LIBMPI_VAR if os.environ.get(LIBMPI_VAR) else "HARNESS_MPICC")
