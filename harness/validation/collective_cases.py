"""Validation cases of collectives alone: published nccl-tests bus bandwidths of 8-GPU nodes, one
node against four, and a two-node ring against a tree (:mod:`harness.validation.collectives`
simulates them).

Two efficiencies are fitted, each on one published row that is then not scored: NCCL's ring
over NVLink reaches a fraction of NVLink's line rate (fitted on the 8x H200 node's ring), and
over EFA a fraction of the node's 3,200 Gb/s (fitted on the 4-node B200 cluster at 16 GiB, the
largest payload, where the NICs bound it). Every other row is predicted with them.
"""

from __future__ import annotations

from functools import cache

from harness.validation import collectives, systems
from harness.validation.model import Case, Prediction, Published
from harness.validation.systems import GPUS_PER_NODE, Fabric, Measured

UNLIMITED = 1e6  # GB/s: a link that never binds


def busbw(
    m: Measured, nvlink: float, nic: float, nvlink_us: float = 1.0, nic_us: float = 15.0, algorithm: str = "ring"
) -> float:
    """Simulated bus bandwidth (GB/s) of ``m``'s allreduce with NVLink at ``nvlink`` and the NICs
    at ``nic`` GB/s each way."""
    t = collectives.allreduce_s(m.nodes, GPUS_PER_NODE, m.payload, nic, nic_us, nvlink, nvlink_us, algorithm)
    return collectives.bus_bandwidth(m.payload, t, m.nodes * GPUS_PER_NODE) / 1e9


@cache
def nvlink_efficiency() -> float:
    """NCCL's ring over NVLink 4 as a fraction of the line rate: the H200 node's ring."""
    m = systems.H200_1NODE_RING
    return m.busbw / busbw(m, systems.NVLINK4.gbytes_per_s, UNLIMITED)


@cache
def efa_efficiency() -> float:
    """NCCL over EFA as a fraction of the node's 400 GB/s: the 4-node B200 cluster at 16 GiB,
    with NVLink 5 at the fitted NVLink efficiency (it does not bind there)."""
    m = systems.B200_4NODE[16]
    return m.busbw / busbw(m, nvlink_efficiency() * systems.NVLINK5.gbytes_per_s, systems.EFA_3200.gbytes_per_s)


@cache
def p3dn_efa_efficiency() -> float:
    """EFA on two p3dn nodes as a fraction of 100 Gb/s: NCCL's ring there (268 ms for 1 GiB)."""
    t = collectives.allreduce_s(
        2,
        GPUS_PER_NODE,
        EFA_TREE_BYTES,
        systems.P3DN_EFA.gbytes_per_s,
        systems.P3DN_EFA.latency_us,
        nvlink_efficiency() * systems.NVLINK2.gbytes_per_s,
        systems.NVLINK2.latency_us,
        "ring",
    )
    return t / EFA_RING_S


# NVIDIA/nccl-tests issue 22 ("How busbw numbers relate to network utilization?", 2019-06-17),
# two p3dn.24xlarge nodes of 8 V100: "If I switch to ring, bus bandwidth is now 60Gbps, but
# performance is much worse. IE 1GB allreduce time goes from 134ms to 268ms". The payload is
# 2**30 bytes: 60 Gb/s of bus bandwidth at 268 ms over 16 ranks is 1.07e9 bytes.
EFA_TREE_BYTES = 1 << 30
EFA_RING_S = 0.268
EFA_TREE_S = 0.134
EFA_SOURCE = "NVIDIA/nccl-tests issue 22, comment of 2019-06-17"
EFA_QUOTE = (
    "'If I switch to ring, bus bandwidth is now 60Gbps, but performance is much worse. IE 1GB allreduce time "
    "goes from 134ms to 268ms' (two p3dn.24xlarge nodes, NCCL's default on 2 nodes is the tree)"
)


def _efa_tree_predict() -> Prediction:
    nv = nvlink_efficiency() * systems.NVLINK2.gbytes_per_s
    nic = p3dn_efa_efficiency() * systems.P3DN_EFA.gbytes_per_s
    t = collectives.allreduce_s(
        2, GPUS_PER_NODE, EFA_TREE_BYTES, nic, systems.P3DN_EFA.latency_us, nv, systems.NVLINK2.latency_us, "tree"
    )
    return Prediction(
        1e3 * t,
        note=f"tree over 2 x 8 GPUs (network.allreduce: tree), EFA at {nic:.2f} GB/s (fitted "
        f"on the ring's 268 ms), NVLink at {nv:.0f} GB/s",
    )


FITS = (
    f"NVLink efficiency: fitted on {systems.H200_1NODE_RING.where} (not scored)",
    f"EFA efficiency: fitted on {systems.B200_4NODE[16].where} (not scored)",
)


def _bus_case(name: str, claim: str, m: Measured, nvlink: Fabric, setup: str, gap: str = "") -> Case:
    def predict() -> Prediction:
        nv = nvlink_efficiency() * nvlink.gbytes_per_s
        nic = efa_efficiency() * systems.EFA_3200.gbytes_per_s if m.nodes > 1 else UNLIMITED
        value = busbw(m, nv, nic, nvlink.latency_us, systems.EFA_3200.latency_us)
        return Prediction(
            value,
            note=f"flat ring over {m.nodes * GPUS_PER_NODE} GPUs, NVLink at {nv:.0f} GB/s"
            + (f", each node's NICs at {nic:.0f} GB/s" if m.nodes > 1 else ""),
        )

    source = m.where.split(", section")[0].split(", table")[0].split(", footnote")[0]
    published = Published(m.busbw, "GB/s", "table", source, m.where)
    constants = (nvlink.source, systems.EFA_3200.source, *FITS)
    return Case(name, claim, published, setup, constants, predict, gap=gap)


NVLS_GAP = (
    "NCCL's default on a full node is NVLS (NVLink SHARP): the NVSwitch adds the GPUs' data itself, "
    "so the bus bandwidth exceeds what a ring over the links can carry (the same source measures 1.23x "
    "over the ring on this node). The harness has no in-switch reduction, so it predicts the ring."
)

B200_SETUP = (
    "8x B200 per node (AWS p6-b200.48xlarge), NVLink 5 through NVSwitch inside, 8 x 400 Gb/s EFA v4 "
    "between nodes; torch 2.9.1+cu130 all_reduce_bench.py / nccl-tests, NCCL 2.27.7; one rank per GPU"
)
H200_SETUP = (
    "8x H200 per node (AWS p5en.48xlarge), NVLink 4 through NVSwitch inside, 16 x 200 Gb/s EFAv3 between "
    "nodes; nccl-tests, NCCL 2.27.7, the ring (NCCL's choice there); one rank per GPU"
)

EFA_TREE_GAP = (
    "The ring's 268 ms puts EFA at 7.5 GB/s, so the buffer once each way through the NIC takes 143 ms "
    "at least: NCCL's 134 ms is below what the ring's bandwidth allows (its tree's two half-size trees "
    "and its protocol move more than the ring did through one NIC). The harness's tree also waits for "
    "every round's messages before the next, paying the NIC latency once per 1 MiB chunk, where NCCL "
    "keeps several chunks in flight."
)

COLLECTIVE_CASES: list[Case] = [
    Case(
        "nccl_efa_tree_1gib",
        "1 GiB allreduce on 2 nodes of 8 V100 over 100 Gb/s EFA with NCCL's tree (ms)",
        Published(1e3 * EFA_TREE_S, "ms", "text", EFA_SOURCE, EFA_QUOTE),
        "2 x AWS p3dn.24xlarge (8 V100 with NVLink 2, one 100 Gb/s EFA NIC each), nccl-tests all_reduce_perf, "
        "NCCL 2.4 with aws-ofi-nccl; one rank per GPU; the tree (NCCL's default on 2 nodes) against the ring "
        "(NCCL_TREE_THRESHOLD=0)",
        (
            systems.NVLINK2.source,
            systems.P3DN_EFA.source,
            "EFA efficiency: fitted on the ring's 268 ms in the same comment (not scored)",
            FITS[0],
        ),
        _efa_tree_predict,
        gap=EFA_TREE_GAP,
    ),
    _bus_case(
        "nccl_h200_4node_ring",
        "allreduce bus bandwidth, 4 nodes of 8 H200 over EFA, 4 GiB, ring",
        systems.H200_4NODE_RING,
        systems.NVLINK4,
        H200_SETUP,
    ),
    _bus_case(
        "nccl_b200_1node_ring",
        "allreduce bus bandwidth, one node of 8 B200, 8 GiB, ring (NVLS off)",
        systems.B200_1NODE_RING,
        systems.NVLINK5,
        B200_SETUP,
    ),
    _bus_case(
        "nccl_b200_4node_1gib",
        "allreduce bus bandwidth, 4 nodes of 8 B200 over EFA, 1 GiB",
        systems.B200_4NODE[1],
        systems.NVLINK5,
        B200_SETUP,
    ),
    _bus_case(
        "nccl_b200_4node_4gib",
        "allreduce bus bandwidth, 4 nodes of 8 B200 over EFA, 4 GiB",
        systems.B200_4NODE[4],
        systems.NVLINK5,
        B200_SETUP,
    ),
    _bus_case(
        "nccl_b200_1node_default",
        "allreduce bus bandwidth, one node of 8 B200, 16 GiB, NCCL's default",
        systems.B200_1NODE_DEFAULT,
        systems.NVLINK5,
        B200_SETUP,
        gap=NVLS_GAP,
    ),
]
