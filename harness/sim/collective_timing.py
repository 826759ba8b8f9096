"""Collectives timed on the simulated network (:class:`harness.sim.network.SimNetwork`), and the
alpha-beta model fitted to measured allreduces.

Collectives are decomposed into the point-to-point steps the native layer performs
(``kernels/step_program.cpp``; the steps are :mod:`harness.sim.step_programs`) for the
scenario's ``network.allreduce``: with ``auto``, recursive doubling below
``ring_threshold_bytes`` (with the same fold/unfold of the ranks beyond the largest power of
two), ring reduce-scatter + allgather above it; or the one it names (ring, recursive doubling,
binomial reduce + broadcast, hierarchical, tree). :func:`run_program` computes every member's
completion time from the members' join times, step by step, as max-plus algebra over numpy
vectors: a member starts step i when it finished step i-1, posts its send then, and finishes step
i when its send is released and the message it receives in step i has arrived.

Approximation (documented): a collective's messages are computed when its last member joins,
so a resource's slots are not reserved strictly in posting order; a message queues behind every
message posted before it and takes the first gap at or after that, which is FIFO except where a
later-posted message was computed first and left no gap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.scenario.network import NodeTopology
from harness.schedules import RING_THRESHOLD_BYTES
from harness.sim.calibration import NetworkModel
from harness.sim.network import SimNetwork
from harness.sim.ring_paths import ring_over_held_paths
from harness.sim.step_programs import FLOAT_BYTES, RingProgram, StepProgram


def _ring_completion(join: np.ndarray, cost: float) -> np.ndarray:
    """Completion times of a ring allreduce whose every message takes ``cost`` after its source
    finished the previous step, members joining at ``join``.

    Step by step, t_m <- max(t_m, t_(m-1) + cost) for 2(p-1) steps, whose solution is
    t_m = max over j = 0..2(p-1) of join_(m-j) + j cost (indices mod p). For each source k the
    largest admissible j is taken, which splits into a prefix maximum, a suffix maximum and the
    one source (m+1) reachable only p-1 steps back: O(p) instead of O(p^2). With unequal chunks
    ``cost`` is the largest chunk's, a bound within one float per step of the step-by-step times.
    """
    p = len(join)
    m = np.arange(p, dtype=float)
    u = join - m * cost
    prefix = np.maximum.accumulate(u)  # max over k <= m of u_k
    suffix = np.maximum.accumulate(u[::-1])[::-1]  # max over k >= m of u_k
    done = (m + p) * cost + prefix
    done[:-2] = np.maximum(done[:-2], (m[:-2] + 2 * p) * cost + suffix[2:])  # sources k >= m + 2
    done[:-1] = np.maximum(done[:-1], join[1:] + (p - 1) * cost)  # source m + 1
    # Member p-1: its special source is member 0, which the prefix must not count as p + p-1 back.
    last = (p - 1 + p) * cost + (u[1:].max() if p > 1 else -np.inf)
    done[-1] = max(last, join[0] + (p - 1) * cost, join[-1])
    return done


def broadcast_times(
    p: int, root: int, world: Sequence[int], join: Sequence[float], nbytes: int, network: SimNetwork
) -> list[float]:
    """Completion time of every member of the native binomial broadcast (``binomial_bcast`` in
    kernels/step_program.cpp): member v (counted from the root) receives from v minus its lowest set
    bit, then sends to v + mask for every lower mask, all posted when its data is there; it
    completes when it has the data and its sends are released."""
    ready = [0.0] * p
    done = [0.0] * p
    order = sorted(range(p), key=lambda v: (v & -v) if v else p + 1, reverse=True)  # parents before children
    for v in order:
        m = (v + root) % p
        if v == 0:
            ready[v] = join[m]
        top = 1
        while top < p and not (v & top):
            top <<= 1
        finish = ready[v]
        mask = top >> 1
        while mask > 0:
            child = v + mask
            if child < p:
                c = (child + root) % p
                release, arrival = network.message(world[m], world[c], nbytes, ready[v])
                ready[child] = max(join[c], arrival)
                finish = max(finish, release)
            mask >>= 1
        done[v] = finish
    return [done[(m - root) % p] for m in range(p)]


_PYTHON_MAX_MEMBERS = 32  # below this, plain Python beats numpy's per-call overhead


def run_program(
    program: StepProgram | RingProgram, world: Sequence[int], join: Sequence[float], network: SimNetwork
) -> list[float]:
    """Completion time of every member of a collective that member m joined at ``join[m]``.

    ``world[m]`` is member m's rank (for link lookup). Max-plus over the aligned steps; see the
    module docstring. The steps of a round (``StepProgram.continues_round``: the tree's) are posted
    together, when the member finished its previous round. Small collectives on the base network
    run in plain Python (the common case of WAGMA groups), everything else vectorised; both
    compute the same times.
    """
    emulated = network.held_among(world)  # none of its messages held: the base network's fast paths
    if isinstance(program, RingProgram):
        if not emulated:
            load = network.load_factor()
            cost = (network.alpha + program.chunk_bytes * network.inv_bandwidth) * load
            return _ring_completion(np.asarray(join, dtype=float), cost).tolist()
        done = ring_over_held_paths(program.sizes, world, join, network)  # every edge on paths of its own
        if done is not None:
            return done
        program = program.steps_program
    if not emulated and len(join) <= _PYTHON_MAX_MEMBERS:
        return _run_small(program, list(join), network)
    t = np.array(join, dtype=float)
    ranks = np.asarray(world)
    load = network.load_factor()  # the load when the collective is computed holds for all its steps
    alpha, inv_bw = network.alpha * load, network.inv_bandwidth * load
    rounds = program.continues_round
    start = t  # the posts: when each member finished its previous round (a step of its own: t)
    for i, (senders, dst, nbytes, receivers, sources, source_bytes) in enumerate(program.compiled):
        if rounds is not None and not rounds[i]:  # a round of several steps starts
            start = t.copy()
        if not emulated:  # releases are the posts: only arrivals move the receivers
            arrival = start[sources] + (alpha + source_bytes * inv_bw)
            t[receivers] = np.maximum(t[receivers], arrival)
            continue
        arrival_at = np.full(len(t), -np.inf)
        if len(senders):
            release, arrival = network.messages(ranks[senders], ranks[dst], nbytes, start[senders])
            arrival_at[dst] = arrival
            t[senders] = np.maximum(t[senders], release)
        t[receivers] = np.maximum(t[receivers], arrival_at[receivers])
    return t.tolist()


def _run_small(program: StepProgram, t: list[float], network: SimNetwork) -> list[float]:
    load = network.load_factor()
    alpha, inv_bw = network.alpha * load, network.inv_bandwidth * load
    rounds = program.continues_round
    for i, (receivers, sources, source_bytes) in enumerate(program.compiled_lists):
        if rounds is None or not rounds[i]:  # a round starts: its sends leave when it does
            before = t[:]
        for m, src, nbytes in zip(receivers, sources, source_bytes):
            arrival = before[src] + alpha + nbytes * inv_bw
            if arrival > t[m]:
                t[m] = arrival
    return t


def predict_allreduce_s(
    ranks: int,
    nbytes: int,
    base: NetworkModel,
    ring_threshold_bytes: int = RING_THRESHOLD_BYTES,
    hosts: NodeTopology | None = None,
) -> float:
    """Predicted time of a blocking allreduce of ``nbytes`` per rank that all ranks join at once
    (no emulated links; on ``hosts``, see :class:`SimNetwork`): the slowest member's completion."""
    network = SimNetwork(ranks, base, ring_threshold_bytes=ring_threshold_bytes, hosts=hosts)
    program = network.allreduce_program(range(ranks), max(0, nbytes // FLOAT_BYTES))
    done = run_program(program, range(ranks), [0.0] * ranks, network)
    return max(done) if ranks else 0.0


def fit_to_allreduce(
    points: Sequence[tuple[int, int, float]], ring_threshold_bytes: int = RING_THRESHOLD_BYTES
) -> NetworkModel:
    """The alpha-beta model under which simulated allreduces take the measured times.

    ``points``: (ranks, bytes per rank, measured seconds) of allreduces that all ranks joined at
    once. With simultaneous joins and no emulated links, the simulated time is exactly
    ``alpha * S + beta * B`` (S: messages on the critical path, B: their bytes), so a
    least-squares fit of the measured times (relative errors, as ``fit_alpha_beta``) gives the
    per-message cost that the decomposed collectives really see, contention included.
    """
    rows, times = [], []
    for ranks, nbytes, seconds in points:
        if ranks < 2:
            continue
        count = max(0, int(nbytes) // FLOAT_BYTES)
        unit_alpha = predict_allreduce_s(
            ranks, count * FLOAT_BYTES, NetworkModel(latency_s=1.0, bandwidth_bytes_per_s=1e300), ring_threshold_bytes
        )
        unit_beta = predict_allreduce_s(
            ranks, count * FLOAT_BYTES, NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1.0), ring_threshold_bytes
        )
        rows.append((unit_alpha, unit_beta))
        times.append(seconds)
    if len(rows) < 2:
        raise ValueError(f"need allreduce times at 2 or more sizes to fit the network (got {len(rows)})")
    design, t = np.array(rows), np.array(times)
    w = 1.0 / np.maximum(t, 1e-9)
    (alpha, beta), *_ = np.linalg.lstsq(design * w[:, None], t * w, rcond=None)
    return NetworkModel(latency_s=max(float(alpha), 0.0), bandwidth_bytes_per_s=1.0 / max(float(beta), 1e-15))
