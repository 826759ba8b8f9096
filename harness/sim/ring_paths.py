"""A ring allreduce whose messages the emulated network holds, computed for the whole ring at once.

``harness.sim.collective_timing.run_program`` walks a collective's steps and, on an emulated network,
hands every held message to ``SimNetwork._hold`` one by one: a Python call per message, 2(p-1) x
p of them for a ring (2 million at 1,024 ranks: a ring through nodes' NICs took minutes per
iteration). This module computes the same times with a few vector operations per step, when
they are the same:

- no resource (a pair's link, a NIC direction, the fabric) lies on the paths of two of the
  ring's edges (a ring over ranks placed node by node leaves each node once, through its own NIC;
  with a bisection limit, or ranks dealt round-robin, edges share resources);
- every resource is free when its edge first posts (its reservations ended, and were posted,
  no later).

Then every message starts on every resource of its path when it is posted: a member posts step
s + 1 only after its step-s message was released, which is after that message left every
resource. So the message is released at ``post + bytes x (the path's slowest seconds per byte)
+ the path's latencies (+ the progress thread's wake-up)``, as ``_hold`` computes it (term for
term with unequal chunks; with equal chunks the delay after the post is summed once per edge,
which can differ from ``_hold``'s sum in the last bit). The reservations ``_hold`` would have
made are appended to the resources afterwards, so messages computed later queue behind them as
before. Otherwise :func:`ring_over_held_paths`
returns None and the caller walks the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_POSTS = 20_000_000
"""Posts kept for the reservations (steps x held edges): beyond this, walk the steps instead."""


def ring_over_held_paths(sizes: np.ndarray, world: Sequence[int], join: Sequence[float], network) -> list[float] | None:
    """Completion time of every member of a ring allreduce of chunks of ``sizes`` bytes (member
    m sends chunk m - s in reduce-scatter step s, chunk m + 1 - s in allgather step s), member m
    being rank ``world[m]`` and joining at ``join[m]``, on ``network`` (a ``SimNetwork``); None
    when the conditions of the module docstring do not hold."""
    p = len(sizes)
    edges = _ring_edges(tuple(world), network)
    if edges is None:
        return None
    senders, lat, slowest, wakes, paths = edges
    steps = 2 * (p - 1)
    if len(senders) * steps > MAX_POSTS:
        return None
    for m, resources in paths:
        first = join[m]
        for resource, _ in resources:
            if resource.max_end > first or resource.last_post > first:
                return None  # busy with other traffic: the steps must queue behind it
    load = network.load_factor()
    wake = wakes * (network.progress * load)

    # shift[s]: member m sends chunk m - shift[s] at step s
    shift = np.concatenate([np.arange(p - 1), np.arange(-1, p - 2)])
    alpha, inv_bw = network.alpha, network.inv_bandwidth
    t = np.array(join, dtype=float)
    # Every step's posts of the held edges, a row per step (written whole each step; a
    # resource keeps its edge's column as a view).
    posts = np.empty((steps, len(senders)))
    received = np.empty(p)
    all_held = len(senders) == p
    nbytes: float | np.ndarray  # one chunk size, or every member's chunk of the step
    if float(sizes.min()) == float(sizes.max()):  # equal chunks (count a multiple of p): one cost per edge
        nbytes = float(sizes[0])
        hold = ((nbytes * slowest) + lat) + wake  # the release's delay after the post (0 unheld)
        travel = (alpha + nbytes * inv_bw) * load
        release, arrival = np.empty(p), np.empty(p)
        for s in range(steps):  # in place: this loop runs 2(p-1) times per collective
            posts[s] = t if all_held else t[senders]
            np.add(t, hold, out=release)  # >= t: the member's own send released
            np.add(release, travel, out=arrival)
            np.maximum(release[1:], arrival[:-1], out=t[1:])  # member m receives from m - 1
            t[0] = max(release[0], arrival[-1])
        sent = None
    else:
        ring3 = np.concatenate([sizes, sizes, sizes])  # a slice of it is the chunks shifted by k
        for s in range(steps):
            k = int(shift[s])
            nbytes = ring3[p - k : 2 * p - k]
            release = ((t + nbytes * slowest) + lat) + wake  # _hold's terms in _hold's order
            arrival = release + (alpha + nbytes * inv_bw) * load
            posts[s] = t if all_held else t[senders]
            t = np.maximum(t, release)
            received[1:] = arrival[:-1]
            received[0] = arrival[-1]
            t = np.maximum(t, received)
        sent = sizes[(senders[:, None] - shift[None, :]) % p]  # bytes of every held edge's every message

    now = network.clock() if network.clock is not None else None
    for j, (_m, resources) in enumerate(paths):
        post = posts[:, j]
        later = now if now is not None else float(post[-1]) - 10.0
        for resource, inv in resources:
            resource.append_free(post, nbytes * inv if sent is None else sent[j] * inv, later)
    return t.tolist()


def _ring_edges(world: tuple[int, ...], network):
    """The ring over ``world``'s held edges, per member m sending to m + 1: (senders, latency,
    slowest seconds per byte, wakes (1.0 where the progress thread must wake up), [(m, resources)]);
    None when two edges share a resource. Cached on the network: a ring's members repeat."""
    cache = network.ring_edges
    if world in cache:
        return cache[world]
    p = len(world)
    ranks = np.asarray(world)
    senders = np.flatnonzero(network._held(ranks, np.roll(ranks, -1)))
    lat, slowest, wakes = np.zeros(p), np.zeros(p), np.zeros(p)
    paths: list[tuple[int, Any]] = []  # (member, its path's [(resource, seconds per byte)])
    seen: set[int] = set()
    edges = None
    for m in senders.tolist():
        resources, latency, wake = network._path(world[m], world[(m + 1) % p])
        if any(id(resource) in seen for resource, _ in resources):
            break  # shared: walk the steps
        seen.update(id(resource) for resource, _ in resources)
        lat[m] = latency
        slowest[m] = max((inv for _, inv in resources), default=0.0)
        wakes[m] = 1.0 if wake else 0.0
        paths.append((m, resources))
    else:
        edges = (senders, lat, slowest, wakes, paths)
    if len(cache) < 256:
        cache[world] = edges
    return edges
