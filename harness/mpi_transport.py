"""Which transport MPI takes between hosts, and which faster fabric this host has.

An MPI on a cluster may still carry every message over TCP (a wheel without the fabric's
provider, ``UCX_TLS=tcp``, Open MPI's ``ob1`` with the ``tcp`` BTL), and every time measured
between hosts then says TCP, not InfiniBand or Slingshot, without anyone being told.
:func:`transport` says what can be known without starting MPI's own diagnostics: the device and
network module the library reports, the variables that choose the transport, and whether the
library has a provider for a fabric this host shows. :func:`fabrics_visible` lists those
fabrics; :func:`tcp_warning` is what a multi-host run says at start when the two disagree.

Read from the library's version string, the environment and ``/sys``; nothing here starts MPI.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# What each family reads to choose its transport (recorded when set).
SELECTION_VARS = (
    "UCX_TLS",
    "UCX_NET_DEVICES",
    "FI_PROVIDER",
    "MPIR_CVAR_CH4_NETMOD",
    "MPIR_CVAR_OFI_USE_PROVIDER",
    "MPIR_CVAR_CH4_OFI_USE_PROVIDER",
    "OMPI_MCA_pml",
    "OMPI_MCA_btl",
    "OMPI_MCA_mtl",
    "OMPI_MCA_osc",
    "I_MPI_FABRICS",
    "I_MPI_OFI_PROVIDER",
)
# UCX transports and libfabric providers that do not leave TCP (or the host).
_UCX_SLOW = {"tcp", "sm", "self", "shm", "posix", "sysv", "cma", "knem", "xpmem"}
_OFI_SLOW = {"tcp", "sockets", "udp", "shm", "tcp;ofi_rxm", "udp;ofi_rxd", "ofi_rxm", "ofi_rxd"}


def fabrics_visible(sys_root: Path = Path("/")) -> list[str]:
    """The fast fabrics this host shows: InfiniBand/RoCE/EFA devices (``infiniband:mlx5_0``,
    ``efa:efa_0``), Slingshot (``cxi:cxi0``), Omni-Path (``opa:hfi1_0``)."""
    found: list[str] = []
    ib = sys_root / "sys/class/infiniband"
    if ib.is_dir():
        for dev in sorted(p.name for p in ib.iterdir()):
            found.append(
                f"{'efa' if dev.startswith('efa') else 'opa' if dev.startswith('hfi') else 'infiniband'}:{dev}"
            )
    for cxi in (sys_root / "sys/class/cxi", sys_root / "dev"):
        if cxi.is_dir():
            found += [f"cxi:{p.name}" for p in sorted(cxi.glob("cxi[0-9]*"))]
    return sorted(set(found))


def mpich_device(version: str) -> str | None:
    """The ``MPICH Device:`` of an MPICH-family version string (``ch4:ucx``, ``ch4:ofi``,
    ``ch4:ucx ofi``), None for other libraries."""
    match = re.search(r"^MPICH Device:\s*(.+)$", version, flags=re.M)
    return match.group(1).strip() if match else None


def transport(family: str, version: str, env: dict[str, str] | None = None) -> dict:
    """What the library's messages between hosts go over, as far as can be told before MPI starts.

    ``netmod``: the network module the library will use (MPICH: ``ucx``/``ofi``; Open MPI: the
    requested ``pml``, else "auto"); ``selection``: the variables that choose it, where set;
    ``over_tcp``: True when the selection allows only TCP, False when it names a fast transport,
    None when the library picks by itself at start (the usual case).
    """
    env = dict(os.environ) if env is None else env
    selection = {name: env[name] for name in SELECTION_VARS if env.get(name)}
    over_tcp: bool | None = None
    netmod = "auto"
    device = mpich_device(version) if family == "mpich" else None
    if device is not None:
        modules = device.split(":", 1)[-1].replace(",", " ").split()
        chosen = env.get("MPIR_CVAR_CH4_NETMOD") or (modules[0] if modules else "")
        netmod = chosen or "auto"
        if chosen == "ucx" and env.get("UCX_TLS"):
            over_tcp = _only(env["UCX_TLS"], _UCX_SLOW)
        elif chosen == "ofi":
            provider = env.get("FI_PROVIDER") or env.get("MPIR_CVAR_OFI_USE_PROVIDER") or ""
            if provider:
                over_tcp = provider.lower() in _OFI_SLOW
        elif device.startswith("ch3:sock") or chosen in ("tcp", "sock"):
            over_tcp = True
    elif family == "openmpi":
        pml = env.get("OMPI_MCA_pml", "")
        netmod = pml or "auto"
        if pml == "ucx" and env.get("UCX_TLS"):
            over_tcp = _only(env["UCX_TLS"], _UCX_SLOW)
        elif pml == "ob1" and env.get("OMPI_MCA_btl") and not env["OMPI_MCA_btl"].startswith("^"):
            over_tcp = _only(env["OMPI_MCA_btl"], {"tcp", "self", "vader", "sm", "smcuda"})
    return {"device": device, "netmod": netmod, "selection": selection, "over_tcp": over_tcp}


def _only(listing: str, slow: set[str]) -> bool:
    """Whether a comma-separated selection names nothing outside ``slow``."""
    items = {item.strip().lower() for item in listing.split(",") if item.strip()}
    return bool(items) and items <= slow


def tcp_warning(record: dict, fabrics: list[str]) -> str | None:
    """The warning a multi-host run prints at start when MPI is set to go over TCP while this
    host shows a faster fabric; None otherwise."""
    if not fabrics or record.get("over_tcp") is not True:
        return None
    chosen = ", ".join(f"{k}={v}" for k, v in record["selection"].items()) or record["netmod"]
    return (
        f"warning: MPI's messages between hosts go over TCP ({chosen}), while this host has "
        f"{', '.join(fabrics)}; every time measured between hosts is TCP's. Unset the selection, or build "
        f"against the cluster's MPI (docs/guides/clusters.md)"
    )
