"""Which MPI library the harness runs on, chosen once and shared by the native layer and mpi4py.

The native layer (``harness._core``) and mpi4py must call one MPI library: two libraries in one
process each start their own MPI, and messages then go nowhere. The choice, in one place
(``docs/guides/clusters.md``):

- **The PyPI wheel (the default).** ``pip install -e .`` builds the layer against MPICH from the
  ``mpich`` wheel; the venv's ``mpiexec`` (Hydra) launches.
- **A system MPI, at build time.** ``HARNESS_MPICC=mpicc.openmpi pip install -e .`` builds it
  against the MPI of that compiler wrapper: Open MPI, a system MPICH, a vendor MPI (``cc`` on a
  Cray). The layer's rpath names that library; its own launcher (``mpirun``, ``mpiexec.mpich``)
  starts the ranks.
- **A library of the MPICH ABI, at run time.** ``HARNESS_LIBMPI=/path/libmpich.so.12`` runs a
  layer built for the MPICH ABI (the wheel's included) on another MPICH, Intel MPI, MVAPICH or
  Cray MPICH without rebuilding. The ranks find it through a directory of their own on
  ``LD_LIBRARY_PATH`` in which ``libmpi.so.12`` (the name the layer and mpi4py ask for) is that
  library; the launchers here set it for them.

:func:`import_mpi` is how every part of the harness imports mpi4py: it points mpi4py at the
native layer's library (``MPI4PY_LIBMPI``), then refuses to go on when the process holds two
MPI libraries anyway (a script imported mpi4py first, or a mismatched install), naming both.
:func:`run_record` is what ``run.json`` says of the library (``mpi``), its transport and
whether device buffers went to MPI directly.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.errors import HarnessError

LIBMPI_VAR = "HARNESS_LIBMPI"
MPIEXEC_VAR = "HARNESS_MPIEXEC"
# The name under which the MPICH ABI's library is asked for (mpi4py's MPI.mpich extension and a
# layer built for that ABI both need libmpi.so.12).
MPICH_ABI_SONAME = "libmpi.so.12"


class MpiLibraryError(HarnessError):
    """The MPI library asked for cannot be used, or two MPI libraries met in one process."""


@dataclass(frozen=True)
class MpiLibrary:
    """The MPI library of this environment: what the native layer was built against and, for the
    MPICH ABI, the library ``HARNESS_LIBMPI`` puts in its place at run time."""

    family: str  # "mpich" (the MPICH ABI) or "openmpi"
    compiled_with: str  # the headers' version, "MPICH 5.0.2", "Open MPI 4.1.4"
    mpicc: str  # the wrapper it was built with; "" for the PyPI wheel
    libmpi: Path | None = None  # HARNESS_LIBMPI

    @classmethod
    def of_this_environment(cls) -> MpiLibrary:
        """Reads the native layer's build and ``HARNESS_LIBMPI``; MpiLibraryError when that
        variable names something the layer cannot use."""
        build = native_build()
        chosen = os.environ.get(LIBMPI_VAR, "")
        libmpi = None
        if chosen:
            libmpi = Path(chosen)
            if build["family"] != "mpich":
                raise MpiLibraryError(
                    f"{LIBMPI_VAR}={chosen}: a library is swapped in at run time only under the MPICH ABI, and "
                    f"this native layer is built against {build['compiled_with']}; rebuild it for that library "
                    f"instead (HARNESS_MPICC=<its mpicc> pip install -e .)"
                )
            if not libmpi.is_file():
                raise MpiLibraryError(f"{LIBMPI_VAR}={chosen}: no such file (give the MPI library's full path)")
        return cls(build["family"], build["compiled_with"], build["mpicc"], libmpi)

    @property
    def source(self) -> str:
        """How this library was chosen, as ``run.json`` says it."""
        if self.libmpi is not None:
            return f"{LIBMPI_VAR} (run time, MPICH ABI)"
        return f"HARNESS_MPICC={self.mpicc} (build time)" if self.mpicc else "the PyPI mpich wheel (default)"

    def launcher(self) -> Path:
        """The ``mpiexec`` that goes with this library: ``HARNESS_MPIEXEC`` if set; the venv's for
        the wheel; else the one installed beside the wrapper or the library (``mpirun.openmpi`` and
        ``mpiexec.mpich`` where Debian's alternatives name them, else ``mpirun`` / ``mpiexec``)."""
        override = os.environ.get(MPIEXEC_VAR)
        if override:
            path = Path(override)
            if not path.is_file():
                raise MpiLibraryError(f"{MPIEXEC_VAR}={override}: no such file")
            return path
        if self.libmpi is None and not self.mpicc:
            path = Path(sys.executable).parent / "mpiexec"
            if not path.exists():
                raise MpiLibraryError(
                    f"no mpiexec next to {sys.executable}: install the project (pip install -e .) into this "
                    "environment; it brings MPICH's mpiexec with the 'mpich' package"
                )
            return path
        names = ["mpirun", "prterun", "mpiexec"] if self.family == "openmpi" else ["mpiexec.hydra", "mpiexec"]
        if self.libmpi is not None:
            dirs = [a / "bin" for a in self.libmpi.resolve().parents[:3]]
            names = ["mpiexec.mpich", *names]
        else:
            wrapper = Path(self.mpicc)
            dirs = [wrapper.parent]
            suffix = wrapper.name.partition(".")[2]  # mpicc.openmpi -> openmpi (Debian's alternatives)
            if suffix:
                names = [f"{name}.{suffix}" for name in names] + names
        for folder in dirs:
            for name in names:
                if (folder / name).is_file():
                    return folder / name
        raise MpiLibraryError(
            f"no launcher found for {self.compiled_with} ({self.source}) in {', '.join(map(str, dirs))}: "
            f"set {MPIEXEC_VAR} to its mpiexec or mpirun"
        )

    def rank_env(self) -> dict[str, str]:
        """What the ranks' environment needs for this library (added to the launcher's)."""
        env: dict[str, str] = {}
        swapped = self.libmpi
        if swapped is None and self.mpicc and self.family == "mpich":
            # A system MPICH whose library has another name (Debian's libmpich.so.12): mpi4py's
            # extension for the MPICH ABI still asks for libmpi.so.12.
            from harness import _core  # noqa: PLC0415  (lazy: loads libmpi)

            built = Path(_core.mpi_library_path())
            swapped = None if built.name.startswith(MPICH_ABI_SONAME) else built
        if swapped is not None:
            folder = abi_folder(swapped)
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("LD_LIBRARY_PATH")) if p)
            env["MPI4PY_LIBMPI"] = str(folder / MPICH_ABI_SONAME)
        elif "MPI4PY_LIBMPI" not in os.environ:
            # A script that imports mpi4py before the harness loads this library too (mpi4py alone
            # would take the first it finds: the wheel's, in a venv that has it).
            from harness import _core  # noqa: PLC0415  (lazy: loads libmpi)

            env["MPI4PY_LIBMPI"] = _core.mpi_library_path()
        return env

    def check_mpi4py_choice(self) -> None:
        """MpiLibraryError, before anything starts, when ``MPI4PY_LIBMPI`` names another library
        than this one (the ranks would hold two MPIs and stop at start-up)."""
        chosen = os.environ.get("MPI4PY_LIBMPI")
        if not chosen:
            return
        from harness import _core  # noqa: PLC0415  (lazy: loads libmpi)

        ours = Path(self.libmpi if self.libmpi is not None else _core.mpi_library_path()).resolve()
        if Path(chosen).resolve() != ours:
            raise MpiLibraryError(
                f"MPI4PY_LIBMPI={chosen} points mpi4py at another MPI library than the native layer's ({ours}, "
                f"{self.source}): one process needs one MPI; unset MPI4PY_LIBMPI (the harness points mpi4py at the "
                f"layer's library itself), or rebuild the layer for that library (docs/guides/clusters.md)"
            )


def abi_folder(libmpi: Path) -> Path:
    """A folder in which ``libmpi.so.12`` is ``libmpi`` (made once, in the venv, which every node
    of a cluster shares, else in the user's cache)."""
    target = libmpi.resolve()
    key = hashlib.sha256(str(target).encode()).hexdigest()[:12]
    for base in (Path(sys.prefix) / "lib" / "harness-libmpi", Path.home() / ".cache" / "harness" / "libmpi"):
        folder = base / key
        link = folder / MPICH_ABI_SONAME
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not (link.is_symlink() and link.resolve() == target):
                link.unlink(missing_ok=True)
                link.symlink_to(target)
            return folder
        except OSError:
            continue
    raise MpiLibraryError(f"{LIBMPI_VAR}={libmpi}: cannot make a folder for it in {sys.prefix}/lib or ~/.cache")


@cache
def native_build() -> dict[str, Any]:
    """What the native layer reports of its build (``harness._core.mpi_build``)."""
    from harness import _core  # noqa: PLC0415  (loads libmpi: only where an MPI answer is needed)

    return dict(_core.mpi_build())


def first_line(version: str) -> str:
    """A library's version string's first line, spaces collapsed."""
    version = version.replace("\0", "").strip()  # Open MPI's string ends in its terminator
    return " ".join(version.splitlines()[0].split()) if version else "unknown"


def import_mpi() -> ModuleType:
    """mpi4py's ``MPI`` module, on the native layer's own library, started (see the module
    docstring). The check comes before MPI starts: a library started under another MPI's
    launcher may abort the process before a word is said."""
    if _checked:
        from mpi4py import MPI  # noqa: PLC0415  (loaded and checked already)

        return MPI
    import mpi4py  # noqa: PLC0415  (lazy: only ranks use MPI)

    from harness import _core  # noqa: PLC0415  (the native layer loads its libmpi first)

    MpiLibrary.of_this_environment()  # a bad HARNESS_LIBMPI is said here, before MPI starts
    start = False
    if "mpi4py.MPI" not in sys.modules:
        if "MPI4PY_LIBMPI" not in os.environ:
            os.environ["MPI4PY_LIBMPI"] = _core.mpi_library_path()
        # Load without starting; MPI starts below as mpi4py would have (its rc: thread level,
        # and MPI_Finalize at exit).
        start = bool(mpi4py.rc.initialize)
        if mpi4py.rc.finalize is None:
            mpi4py.rc.finalize = start
        mpi4py.rc.initialize = False
    from mpi4py import MPI  # noqa: PLC0415  (lazy, as above)

    check_one_library(MPI)
    _checked.append(True)
    if start and not MPI.Is_initialized():
        MPI.Init_thread(getattr(MPI, f"THREAD_{str(mpi4py.rc.thread_level).upper()}"))  # rc's names: single..multiple
    return MPI


_checked: list[bool] = []  # once a process: the libraries loaded do not change after the first


def check_one_library(MPI: ModuleType) -> None:
    """MpiLibraryError when mpi4py and the native layer do not call the same MPI library."""
    from harness import _core  # noqa: PLC0415  (lazy, as above)

    native_path = _core.mpi_library_path()
    ours = first_line(_core.mpi_library_version())
    native = f"{ours} ({native_path})"
    others = [path for path in _core.mpi_libraries_loaded() if path != native_path]
    theirs = first_line(MPI.Get_library_version())
    if others or theirs != ours:
        where = others[0] if others else "the same file"
        raise MpiLibraryError(
            f"the native layer and mpi4py use different MPI libraries: the native layer (harness._core, "
            f"{MpiLibrary.of_this_environment().source}) calls {native}; mpi4py loaded {theirs} ({where}). "
            f"One process needs one MPI: point mpi4py at the native layer's (MPI4PY_LIBMPI={native_path}, or import "
            f"harness before mpi4py), or rebuild the native layer against mpi4py's "
            f"(HARNESS_MPICC=<its mpicc> pip install -e .); see docs/guides/clusters.md"
        )
    chosen = os.environ.get(LIBMPI_VAR)
    if chosen and Path(chosen).resolve() != Path(native_path).resolve():
        raise MpiLibraryError(
            f"{LIBMPI_VAR}={chosen}, but the native layer loaded {native}: the process was started without "
            f"the library's folder first on LD_LIBRARY_PATH. Start the ranks with the harness (run, launch, "
            f"bench), or with LD_LIBRARY_PATH={abi_folder(Path(chosen))}"
        )


def run_record(MPI: ModuleType) -> dict[str, Any]:
    """``run.json``'s ``mpi``: the library every rank called, how it was chosen, the MPI standard
    it implements, and its transport between hosts (``harness.mpi_transport``)."""
    from harness import _core  # noqa: PLC0415  (lazy, as above)
    from harness.mpi_transport import fabrics_visible, transport  # noqa: PLC0415  (reads /sys: ranks only)

    library = MpiLibrary.of_this_environment()
    version = MPI.Get_library_version()
    major, minor = MPI.Get_version()
    return {
        "library": first_line(version),
        "standard": f"{major}.{minor}",
        "family": library.family,
        "file": _core.mpi_library_path(),
        "chosen_by": library.source,
        "built_against": library.compiled_with,
        "transport": transport(library.family, version),
        "fabrics_visible": fabrics_visible(),
    }


def tcp_warning_at_start(env: dict[str, str] | None = None) -> str | None:
    """What a multi-host launch says when the ranks' environment ``env`` sends MPI over TCP while
    this host shows a faster fabric (``harness.mpi_transport.tcp_warning``); None otherwise."""
    from harness import _core  # noqa: PLC0415  (loads libmpi; its version string needs no MPI_Init)
    from harness.mpi_transport import fabrics_visible, tcp_warning, transport  # noqa: PLC0415  (as run_record)

    record = transport(str(native_build()["family"]), _core.mpi_library_version(), env)
    return tcp_warning(record, fabrics_visible())
