"""Choosing the MPI library, its launcher and its transport (harness.mpi_library, harness.mpi_transport,
harness.launch), without starting MPI; and the refusal of two MPI libraries in one process, for real.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import _core, launch, mpi_library
from harness.launch import Launch, LaunchError
from harness.mpi_library import MpiLibrary, MpiLibraryError, abi_folder, check_one_library
from harness.mpi_transport import fabrics_visible, mpich_device, tcp_warning, transport

WHEEL_VERSION = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\n"


# -- transport --------------------------------------------------------------------------------------
def test_mpich_device_is_read_from_the_version_string():
    assert mpich_device(WHEEL_VERSION) == "ch4:ucx ofi"
    assert mpich_device("Open MPI v4.1.4, package: Debian OpenMPI") is None


@pytest.mark.parametrize(
    ("family", "env", "netmod", "over_tcp"),
    [
        ("mpich", {}, "ucx", None),  # UCX picks by itself
        ("mpich", {"UCX_TLS": "tcp"}, "ucx", True),
        ("mpich", {"UCX_TLS": "tcp,sm,self"}, "ucx", True),
        ("mpich", {"UCX_TLS": "rc,sm,self"}, "ucx", False),
        ("mpich", {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp;ofi_rxm"}, "ofi", True),
        ("mpich", {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "cxi"}, "ofi", False),
        ("openmpi", {}, "auto", None),
        ("openmpi", {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self,vader"}, "ob1", True),
        ("openmpi", {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "^openib"}, "ob1", None),  # excludes only
        ("openmpi", {"OMPI_MCA_pml": "ucx", "UCX_TLS": "rc_x,sm"}, "ucx", False),
    ],
)
def test_the_transport_follows_the_selection(family, env, netmod, over_tcp):
    version = WHEEL_VERSION if family == "mpich" else "Open MPI v4.1.4"
    got = transport(family, version, env)
    assert (got["netmod"], got["over_tcp"]) == (netmod, over_tcp)
    assert got["selection"] == env


def test_fabrics_are_read_from_sys_and_dev(tmp_path):
    assert fabrics_visible(tmp_path) == []
    for dev in ("mlx5_0", "efa_0", "hfi1_0"):
        (tmp_path / "sys/class/infiniband" / dev).mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/cxi0").touch()
    assert fabrics_visible(tmp_path) == ["cxi:cxi0", "efa:efa_0", "infiniband:mlx5_0", "opa:hfi1_0"]


def test_tcp_with_a_faster_fabric_is_warned_about():
    tcp = transport("mpich", WHEEL_VERSION, {"UCX_TLS": "tcp"})
    warning = tcp_warning(tcp, ["infiniband:mlx5_0"])
    assert warning is not None and "UCX_TLS=tcp" in warning and "infiniband:mlx5_0" in warning
    assert tcp_warning(tcp, []) is None  # nothing faster to use
    assert tcp_warning(transport("mpich", WHEEL_VERSION, {}), ["infiniband:mlx5_0"]) is None  # UCX picks


# -- the library and its launcher ------------------------------------------------------------------
def _build(monkeypatch, family: str, mpicc: str = "") -> None:
    build = {"family": family, "compiled_with": f"{family} 1.0", "mpicc": mpicc, "mpi_version": 31}
    monkeypatch.setattr(mpi_library, "native_build", lambda: build)
    monkeypatch.setattr(launch, "native_build", lambda: build)


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_system_mpis_launcher_is_found_beside_its_wrapper(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_MPIEXEC", raising=False)
    monkeypatch.delenv("HARNESS_LIBMPI", raising=False)
    wrapper = _executable(tmp_path / "bin/mpicc.openmpi")
    _build(monkeypatch, "openmpi", str(wrapper))
    with pytest.raises(MpiLibraryError, match="HARNESS_MPIEXEC"):
        MpiLibrary.of_this_environment().launcher()
    _executable(tmp_path / "bin/mpirun")
    assert MpiLibrary.of_this_environment().launcher() == tmp_path / "bin/mpirun"
    _executable(tmp_path / "bin/mpirun.openmpi")  # Debian's alternatives: the suffixed one is this MPI's
    assert MpiLibrary.of_this_environment().launcher() == tmp_path / "bin/mpirun.openmpi"
    own = _executable(tmp_path / "elsewhere/mpiexec")
    monkeypatch.setenv("HARNESS_MPIEXEC", str(own))
    assert MpiLibrary.of_this_environment().launcher() == own


def test_a_library_chosen_at_run_time_needs_the_mpich_abi(tmp_path, monkeypatch):
    lib = tmp_path / "lib/libmpich.so.12"
    lib.parent.mkdir()
    lib.touch()
    monkeypatch.setenv("HARNESS_LIBMPI", str(lib))
    _build(monkeypatch, "openmpi", "/usr/bin/mpicc.openmpi")
    with pytest.raises(MpiLibraryError, match="only under the MPICH ABI"):
        MpiLibrary.of_this_environment()
    _build(monkeypatch, "mpich")
    monkeypatch.setenv("HARNESS_LIBMPI", str(tmp_path / "missing.so"))
    with pytest.raises(MpiLibraryError, match="no such file"):
        MpiLibrary.of_this_environment()
    monkeypatch.setenv("HARNESS_LIBMPI", str(lib))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    env = MpiLibrary.of_this_environment().rank_env()
    folder = Path(env["LD_LIBRARY_PATH"].split(os.pathsep)[0])
    assert (folder / "libmpi.so.12").resolve() == lib.resolve()  # the name the layer and mpi4py ask for
    assert env["MPI4PY_LIBMPI"] == str(folder / "libmpi.so.12")
    assert abi_folder(lib) == folder  # made once, found again


def test_open_mpis_command_line_places_ranks_and_forwards_the_environment(tmp_path, monkeypatch):
    _build(monkeypatch, "openmpi", "/usr/bin/mpicc.openmpi")
    monkeypatch.setenv("HARNESS_MPIEXEC", str(_executable(tmp_path / "mpirun")))
    hosts = tmp_path / "hosts"
    hosts.write_text("a:2\nb\n")
    chosen = Launch.choose("mpiexec", hosts)
    cmd = chosen.command(5, ["python", "x.py"], {"HARNESS_SEED": "1", "HOME": "/root", "UCX_TLS": "tcp"})
    assert cmd[0] == str(tmp_path / "mpirun") and cmd[-3:] == ["5", "python", "x.py"]
    assert "--oversubscribe" in cmd and cmd[cmd.index("--bind-to") + 1] == "none"
    assert cmd[cmd.index("--host") + 1] == "a:4,b:1"  # Hydra's counts for 5 ranks on a:2, b:1
    forwarded = [cmd[i + 1] for i, word in enumerate(cmd) if word == "-x"]
    assert forwarded == ["HARNESS_SEED", "UCX_TLS"]  # the harness's and MPI's, not everything
    assert chosen.rank_hosts(5) == ["a", "a", "a", "a", "b"]  # mpirun fills each host's count in turn
    assert "--host" not in Launch().command(2, ["x"])


def test_srun_speaks_each_mpis_process_management(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    for var in ("SLURM_STEP_ID",):
        monkeypatch.delenv(var, raising=False)
    _build(monkeypatch, "openmpi", "/usr/bin/mpicc.openmpi")
    assert Launch.choose("srun").command(3, ["x"])[:2] == ["srun", "--mpi=pmix"]
    _build(monkeypatch, "mpich")
    assert Launch.choose("srun").command(3, ["x"])[:2] == ["srun", "--mpi=pmi2"]
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(LaunchError, match="not inside a SLURM allocation"):
        Launch.choose("srun")


def test_two_libraries_in_one_process_are_refused_naming_both(monkeypatch):
    class FakeMPI:
        @staticmethod
        def Get_library_version() -> str:
            return "Open MPI v4.1.4, package: Debian OpenMPI\x00"

    monkeypatch.delenv("HARNESS_LIBMPI", raising=False)
    monkeypatch.setattr(_core, "mpi_library_path", lambda: "/venv/lib/libmpi.so.12")
    monkeypatch.setattr(_core, "mpi_library_version", lambda: "MPICH Version:      5.0.2\nMPICH Device: ch4:ucx")
    monkeypatch.setattr(_core, "mpi_libraries_loaded", lambda: ["/usr/lib/libmpi.so.40", "/venv/lib/libmpi.so.12"])
    with pytest.raises(MpiLibraryError) as err:
        check_one_library(FakeMPI)
    message = str(err.value)
    assert "calls MPICH Version: 5.0.2 (/venv/lib/libmpi.so.12)" in message
    assert "mpi4py loaded Open MPI v4.1.4, package: Debian OpenMPI (/usr/lib/libmpi.so.40)" in message


def _another_mpi() -> str | None:
    """A library of the other family than the native layer's that mpi4py can load, if any here."""
    if mpi_library.native_build()["family"] == "openmpi":
        wheel = [str(p) for p in Path(sys.executable).resolve().parents[1].glob("lib/libmpi.so.12")]
        wheel += glob.glob(str(Path(sys.prefix) / "lib/libmpi.so.12"))
        return next(iter(wheel), None)
    return next(iter(glob.glob("/usr/lib/*/libmpi.so.40") + glob.glob("/usr/lib*/openmpi/lib/libmpi.so.40")), None)


@pytest.mark.subprocess
@pytest.mark.skipif(_another_mpi() is None, reason="needs a second MPI library (Debian's Open MPI: libmpi.so.40)")
def test_the_native_layer_refuses_an_mpi4py_on_another_library():
    env = dict(os.environ, MPI4PY_LIBMPI=str(_another_mpi()))
    proc = subprocess.run([sys.executable, "-c", "import harness.comm.communicator"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "the native layer and mpi4py use different MPI libraries" in proc.stderr, proc.stderr[-2000:]
    assert "Open MPI" in proc.stderr and "MPICH" in proc.stderr
def test_tcp_warning_at_start_judges_the_ranks_environment(monkeypatch, tmp_path):
    from harness import mpi_transport

    monkeypatch.setattr(mpi_transport, "fabrics_visible", lambda: ["infiniband:mlx5_0"])
    tcp = {"UCX_TLS": "tcp", "OMPI_MCA_pml": "ucx"}
    warning = mpi_library.tcp_warning_at_start(tcp)
    assert warning is not None and "infiniband:mlx5_0" in warning
    assert mpi_library.tcp_warning_at_start({}) is None


def test_mpi4py_pointed_at_another_library_is_refused_before_the_launch(tmp_path, monkeypatch):
    other = tmp_path / "libmpi.so.40"
    other.touch()
    monkeypatch.delenv("HARNESS_LIBMPI", raising=False)
    monkeypatch.setenv("MPI4PY_LIBMPI", str(other))
    with pytest.raises(LaunchError, match=r"MPI4PY_LIBMPI=.*libmpi.so.40 points mpi4py at another MPI library"):
        Launch.choose("mpiexec")
    monkeypatch.setenv("MPI4PY_LIBMPI", _core.mpi_library_path())  # the layer's own: fine
    assert Launch.choose("mpiexec").launcher == "mpiexec"
