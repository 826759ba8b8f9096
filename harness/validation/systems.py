"""The published systems the validation cases and the paper figures simulate, and where every
number about them comes from. A constant the source of a case does not give is defined here
once, with its own source; a constant fitted on a published measurement says which one (that
measurement is then never a scored case).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.sim.calibration import NetworkModel

# -- the SGP paper's cluster as it ran (setup "paper" of the SGP figure) ---------------------------
# facebookresearch/stochastic_gradient_push at tag sgp_pytorch0.5: job_scripts/submit_*.sh
# (`--nodes=N --gres=gpu:8`, one task per node, `--batch_size 256`, "per-agent batch size" in
# gossip_sgd.py): one process per node drives its 8 GPUs, batch 256 per node (32 per GPU).
SGP_PAPER_GPUS_PER_NODE = 8
SGP_PAPER_NODE_BATCH = 256
# A V100's ResNet-50 training throughput: 363.1 images/s, FP32, PyTorch, one V100 16 GB of a
# DGX-1 (NVIDIA DeepLearningExamples, PyTorch/Classification/RN50v1.5/README.md, October 2018,
# container pytorch-18.09; measured at a larger batch per GPU than the paper's 32, so it is
# an upper bound on the paper's throughput). A node's 256 images on 8 GPUs: 32 / 363.1 s.
V100_RESNET50_IMAGES_PER_S = 363.1
SGP_PAPER_COMPUTE_MS = 1000.0 * SGP_PAPER_NODE_BATCH / SGP_PAPER_GPUS_PER_NODE / V100_RESNET50_IMAGES_PER_S
# Host <-> GPU copies over PCIe 3.0 x16 with pinned memory: 12.15 GB/s host to device (CUDA
# bandwidthTest on a PCIe 3.0 host, mpicbg-scicomp/gearshifft pull request 82; device to host
# was 12.89 GB/s, the slower direction is used both ways). The SGP code copies the model into
# pinned host buffers when it communicates from the CPU (`cpu_comm`, set for the TCP backend).
PCIE3_X16_GBPS = 12.15 * 8
# What each series ran. README at the tag: "TCP for all methods (gossip-based and AllReduce) over
# Ethernet", MPI for the gossip methods and Gloo for AllReduce on InfiniBand; gossip_sgd.py sets
# `cpu_comm` (copy the model to pinned host buffers and communicate from there) for the TCP
# backend only.
# - 10 GbE, every method staged through the host. AllReduce: PyTorch 0.5.0a0+ec42a11's THD TCP
#   backend implements allReduce as recursive doubling (DataChannelTCP.cpp: log2(p) exchanges of
#   the whole tensor, MPICH's algorithm).
# - InfiniBand, nothing staged. AllReduce: THD's Gloo channel runs CUDA tensors through
#   gloo::CudaAllreduceHalvingDoublingPipelined (GlooCache.hpp), bandwidth-optimal like a ring
#   (2 (p-1)/p of the buffer each way) with log2(p) steps instead of p-1: `ring` stands in for
#   it (the latency terms differ by microseconds here). The plot tags (AR-DPSGD-CPUCOMM-*IB in
#   visualization/plotting.py) say CPU; on CPU tensors THD's Gloo would have run
#   gloo::AllreduceRing, which passes the whole buffer around the ring p - 1 times and would
#   grow linearly with the nodes, against the paper's own InfiniBand result and its note that
#   Gloo and NCCL performed alike; the code's reading is used.
SGP_PAPER_SERIES: dict[str, list[tuple[str, Any, str, bool]]] = {  # network -> (series, algorithm, allreduce, staged)
    "10 GbE": [
        ("allreduce_sgd", "allreduce_sgd", "recursive_doubling", True),
        ("dpsgd", "dpsgd", "auto", True),
        ("sgp", "sgp", "auto", True),
    ],
    "100 Gb InfiniBand": [("allreduce_sgd", "allreduce_sgd", "ring", False), ("sgp", "sgp", "auto", False)],
}

# The SGP paper's two networks as topology presets (harness.scenario.network_fields.TOPOLOGY_PRESETS:
# 10 Gb/s Ethernet at 20 us and 100 Gb/s InfiniBand at 2 us per node NIC, NVLink-class inside
# the node). The topology is the whole network: the base point-to-point cost is taken as free.
SGP_NETWORKS: dict[str, str] = {"10 GbE": "ethernet_10g", "100 Gb InfiniBand": "infiniband_100g"}

# -- the WAGMA-SGD repository's ResNet-50 runs (the WAGMA figure) --------------------------------
# Shigangli/WAGMA-SGD, test-models/tf-models-r1.11/official/resnet: test_imagenet_scripts/
# daint_imagenet_wagma_sgd.sh (`--nodes=64 --ntasks-per-node=1`, `-bs 128`; the batch is per
# worker, resnet_run_loop_wagma_sgd.py) on Piz Daint: one P100 per worker, 128 images each.
WAGMA_REPO_RANKS = 64
WAGMA_REPO_BATCH = 128
# A P100's ResNet-50 training throughput: 219 images/s (tensorflow.org Benchmarks, "Training
# with NVIDIA Tesla P100", batch 64 per GPU, synthetic data, tf_cnn_benchmarks' default fp32,
# May 2017). 128 images: 128 / 219 s. No compute jitter: the repository adds none, and the
# injected stragglers are the imbalance it studies.
P100_RESNET50_IMAGES_PER_S = 219.0
WAGMA_REPO_COMPUTE_MS = 1000.0 * WAGMA_REPO_BATCH / P100_RESNET50_IMAGES_PER_S
# Piz Daint's Aries network between two GPU nodes, measured with the OSU benchmarks over Cray MPI
# (eth-cscs/sarus, doc/cookbook/osu_mb/osu_mb.rst): 1.11 us for an empty message, 431.85 us for
# 4 MiB (9.7 GB/s).
ARIES = NetworkModel(latency_s=1.11e-6, bandwidth_bytes_per_s=4 * 1024 * 1024 / 431.85e-6)
# The injection (resnet_run_loop_wagma_sgd.py): every step two `randint(P)` draws, the ranks
# drawn sleep 320 ms before the forward pass (one rank when the draws coincide).
WAGMA_REPO_STRAGGLERS = [{"kind": "random_ranks", "count": 2, "delay_ms": 320.0, "replace": True}]


# The WAGMA-SGD repository's methods (series key -> algorithm entry; the keys are the names
# paper_figs.style knows), as the repository runs them (test-models/.../official/utils): WAGMA-SGD
# with groups of 8 and a global average every 11th step (opt_wagma_sgd_imagenet.py: groupsize 8,
# LIMITER 10); Local SGD averaging every step (optimizer_localsgd_imagenet.py has no period);
# D-PSGD with ring neighbours; SGP pushing to 2 peers a step (optimizer_sgp_imagenet.py); AD-PSGD
# (optimizer_adpsgd_imagenet.py; its passive side serves one request at a time); and the
# authors' eager-SGD (majority), which this repository does not include.
WAGMA_SERIES: dict[str, Any] = {
    "allreduce_sgd": "allreduce_sgd",
    "local_sgd": {"name": "local_sgd", "period": 1},
    "dpsgd": {"name": "dpsgd", "graph": "ring"},
    "adpsgd": "adpsgd",
    "sgp": {"name": "sgp", "peers": 2},
    "eager_sgd": {"name": "eager_sgd", "mode": "majority"},
    "wagma": {"name": "wagma", "group_size": 8, "period": 11},
}

# -- GPU nodes and their fabrics, for the nccl-tests cases ---------------------------------------

GPUS_PER_NODE = 8  # every nccl-tests case below: HGX / p5en / p6 nodes of 8 GPUs
GIB = 1 << 30
# stas00/ml-engineering (github), network/README.md: the section "Inter-node speed depends on
# intra-node speed" (all_reduce_bench.py, torch 2.9.1+cu130, NCCL 2.27.7, measured on 1 and 4
# AWS p6-b200.48xlarge nodes) and the section "SHARP" (nccl-tests on one 8x H200 node and one
# 8x B200 node, 2026-08), and the footnote on a 4-node 8x H200 p5en.48xlarge cluster (NCCL 2.27.7,
# EFA, "selects `Ring`", 2026-08-07). Their payloads are GiB (2**30 bytes), their GBps 10**9
# bytes per second (the section's own footnote).
STAS_SOURCE = "stas00/ml-engineering, network/README.md"


@dataclass(frozen=True)
class Fabric:
    """A fabric's line rate in one direction (GB/s, 10**9 bytes) and one-way latency (us),
    and where both come from."""

    gbytes_per_s: float
    latency_us: float
    source: str


# NVLink 4 (H100, H200): 900 GB/s per GPU both ways together, 450 GB/s each way (NVIDIA H200
# datasheet; stas00 writes "the 450GBps unidirectional NVLink 4 spec"). NVLink 5 (B200): 1.8 TB/s
# both ways, 900 GB/s each way ("each accelerator has 900GBps of NVLink 5", same section). The
# NVSwitch gives every pair of GPUs the full rate. Latency: about 1 us (NVIDIA does not publish
# one; a GPU-to-GPU NVLink message costs a microsecond or two in the nccl-tests tables' 8-byte
# rows, which are dominated by launch costs, so latency hardly matters at GiB payloads).
NVLINK4 = Fabric(450.0, 1.0, "NVLink 4: 450 GB/s each way per GPU (NVIDIA H100/H200 datasheets: 900 GB/s both ways)")
NVLINK5 = Fabric(900.0, 1.0, "NVLink 5: 900 GB/s each way per GPU (NVIDIA B200 datasheet: 1.8 TB/s both ways)")
# EFA on p5en.48xlarge (16 x 200 Gb/s EFAv3) and p6-b200.48xlarge (8 x 400 Gb/s EFAv4): 3,200
# Gb/s a node, 400 GB/s (AWS EC2 accelerated instance types; stas00: "8x 50GBps EFA v4 out").
# Latency about 15 us (EFA's SRD small-message latency; it only matters at small payloads).
EFA_3200 = Fabric(
    400.0,
    15.0,
    "EFA: 3,200 Gb/s a node = 400 GB/s (AWS: p5en.48xlarge 16 x 200 Gb/s EFAv3, p6-b200.48xlarge 8 x 400 Gb/s EFAv4)",
)


@dataclass(frozen=True)
class Measured:
    """One published nccl-tests style row: the bus bandwidth (GB/s) of an allreduce of
    ``payload`` bytes over ``nodes`` nodes of 8 GPUs, with its source and words."""

    nodes: int
    payload: int
    busbw: float
    where: str


H200_1NODE_RING = Measured(
    1,
    8 * GIB,
    365.6,
    f"{STAS_SOURCE}, section SHARP: 8x H200 node, nccl-tests, 8GiB, "
    "8 GPUs, 'busbw, NVLS off' = 365.6GBps (NCCL_NVLS_ENABLE=0: the ring)",
)
H200_4NODE_RING = Measured(
    4,
    4 * GIB,
    364.87,
    f"{STAS_SOURCE}, footnote under 'Inter-node networking': 4-node 8x "
    "H200 p5en.48xlarge, NCCL 2.27.7, EFA, 4GiB over 32 ranks selects Ring, "
    "'364.65 against 364.87GBps busbw' (forced ring against the default)",
)
B200_1NODE_RING = Measured(
    1,
    8 * GIB,
    682.2,
    f"{STAS_SOURCE}, section SHARP: 8x B200 p6-b200.48xlarge, nccl 2.27.7, 8GiB, 8 GPUs, 'busbw, NVLS off' = 682.2GBps",
)
B200_1NODE_DEFAULT = Measured(
    1,
    16 * GIB,
    845.67,
    f"{STAS_SOURCE}, table in 'Inter-node speed depends on intra-node "
    "speed': 16GiB, 1 node = 845.67GBps (NCCL's default: NVLS)",
)
B200_4NODE = {
    size: Measured(
        4,
        size * GIB,
        busbw,
        f"{STAS_SOURCE}, table in 'Inter-node speed depends on intra-node speed': {size}GiB, 4 nodes = {busbw}GBps",
    )
    for size, busbw in ((1, 361.99), (4, 377.34), (16, 381.80))
}

# -- two AWS p3dn.24xlarge nodes, NCCL ring against tree (NVIDIA/nccl-tests issue 22) -------------
# p3dn.24xlarge: 8 V100 (NVLink 2, 6 links of 25 GB/s each way per GPU: 150 GB/s each way, NVIDIA
# Tesla V100 datasheet: 300 GB/s of NVLink both ways) and one 100 Gb/s EFA NIC (AWS EC2 P3
# instance types page).
NVLINK2 = Fabric(
    150.0,
    1.0,
    "NVLink 2: 150 GB/s each way per GPU, NCCL's channels together (NVIDIA V100 datasheet: "
    "300 GB/s of NVLink both ways)",
)
P3DN_EFA = Fabric(
    12.5,
    15.0,
    "EFA on p3dn.24xlarge: 100 Gb/s (AWS EC2 P3 instance types); its small-message latency "
    "is not in the source: 15 us is assumed (it only weighs on the tree, once per 1 MiB "
    "chunk: 954 chunks x 15 us = 14 ms of a 1 GB allreduce)",
)

# -- Goyal et al. 2017 (arXiv 1706.02677): ResNet-50 on 256 P100s in one hour ---------------------
# Big Basin servers of 8 P100s (NVLink), one 50 Gb/s Ethernet NIC each; Caffe2 with Gloo, NCCL
# inside a server, recursive halving and doubling between servers (the paper's sections 4-5).
# Batch 32 per GPU, 90 epochs. The 8-GPU baseline took 29 hours (NVIDIA's blog on the paper,
# developer.nvidia.com/facebook-trains-imagenet-1-hour: "reduced the training time of a ResNet-50
# deep learning model on ImageNet from 29 hours to one").
GOYAL_SERVERS = 32
GOYAL_GPUS_PER_SERVER = 8
GOYAL_BATCH_PER_GPU = 32
GOYAL_BASELINE_HOURS = 29.0
GOYAL_NIC = Fabric(
    50 / 8,
    20.0,
    "50 Gb/s Ethernet per Big Basin server (Goyal et al., section 5); latency: the "
    "ethernet_10g preset's 20 us (not in the source; a few ms of a 0.26 s iteration)",
)
