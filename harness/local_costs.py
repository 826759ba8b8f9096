"""A rank's local time per iteration beside its compute: the node agent's combine across its GPUs
and the copies of the communicated buffer between GPU and host. One definition: the real loop
sleeps it (``harness.runner.local_work``, and ``harness.api.DistributedOptimizer`` in a
user's script), the simulator waits it (``harness.sim.timing``).

- ``workload.node`` (a rank stands for a node of G GPUs driven by one process, as the SGP paper
  ran): after backward the node's GPUs reduce their gradients to the first GPU, and before the
  next forward that GPU broadcasts the parameters back. The SGP code does both with
  ``torch.cuda.comm`` (``reduce_add_coalesced``, ``broadcast_coalesced``), which use NCCL's
  reduce and broadcast: pipelined along a chain of the G GPUs, each about ``(G - 1)`` link
  latencies plus ``bytes / bandwidth`` (the pipeline's fill is left out).
- ``workload.staging`` (communication from host memory, as the SGP code's ``cpu_comm`` on TCP):
  the buffer goes to the host before communication and back after it, one copy each way:
  ``2 (latency + bytes / bandwidth)``.

Both are charged every iteration, whether or not the algorithm communicates in it: the SGP
code stages and combines every iteration. They are not stretched by injected compute factors
(they are not compute). A run on a real GPU (``workload.device: cuda``) copies its buffers for
real, so the emulated staging is left out there; the node's combine is still emulated.

>>> from harness.scenario.schema import HostStaging, NodeAgent
>>> round(node_combine_s(NodeAgent(gpus=8, link={"bandwidth_gbps": 800}), 100e6), 4)
0.002
>>> round(staging_s(HostStaging(bandwidth_gbps=80), 100e6), 4)
0.02
"""

from __future__ import annotations

from typing import Any

FLOAT_BYTES = 4


def node_combine_s(node: Any, nbytes: float) -> float:
    """Seconds a node of ``node.gpus`` GPUs spends reducing ``nbytes`` of gradients to one GPU
    and broadcasting ``nbytes`` of parameters back (0 without a node or with one GPU)."""
    if node is None or node.gpus <= 1:
        return 0.0
    link = node.link
    transfer = 0.0 if link.bandwidth_bytes_per_s is None else nbytes / link.bandwidth_bytes_per_s
    return 2.0 * ((node.gpus - 1) * link.latency_s + transfer)


def staging_s(staging: Any, nbytes: float) -> float:
    """Seconds to copy ``nbytes`` from the GPU to the host and back (0 without staging)."""
    if staging is None:
        return 0.0
    return 2.0 * (staging.latency_us * 1e-6 + nbytes * 8.0 / (staging.bandwidth_gbps * 1e9))


def iteration_overhead_s(workload: Any, floats: int, staged_for_real: bool = False) -> float:
    """The local time per iteration of ``workload`` beside compute, for a buffer of ``floats``
    float32 values; ``staged_for_real``: the rank's buffers are copied to the host for real (a
    GPU run), so the emulated staging is not added."""
    nbytes = float(floats) * FLOAT_BYTES
    staging = 0.0 if staged_for_real else staging_s(workload.staging, nbytes)
    return node_combine_s(workload.node, nbytes) + staging
