"""The simulated network: per-message alpha-beta cost and emulated slow links.

A message of b bytes posted at time t from src to dst:

1. If its path is emulated (the scenario's ``network``: the pair's link rule; with a topology,
   the intra-node link, or the source node's NIC, the fabric and the destination node's NIC) it
   is held by the native layer's rule (``kernels/link_emulator.hpp``): each resource on the path
   carries messages one after another in posting order, a message starts on a resource no
   earlier than on the previous one, ``start_k = max(start_(k-1), free_k)``, occupies it for
   ``b / bandwidth_k``, and is released at ``max_k(start_k + b / bandwidth_k)`` plus the path's
   latencies. Other messages are released at t.
2. From its release it takes the calibrated base cost ``alpha + b / base_bandwidth`` to arrive.

The nodes may also be the hosts of a multi-host run (``hosts``, from ``harness.sim.hosts``):
their NICs are then real, not the native emulator's, and the same rule models how the messages
of a host's ranks queue on its NIC; only the emulator's wake-up (``progress_s``) is left out.

A send completes (its buffer may be reused, the next program step may start) at its release:
the native layer hands it to MPI then, and MPI's shared-memory sends complete locally.

Collectives built from these messages are timed in :mod:`harness.sim.collective_timing`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import numpy as np

from harness.emulated_link import EmulatedLink
from harness.scenario.network import NodeTopology
from harness.schedules import RING_THRESHOLD_BYTES
from harness.sim.calibration import NetworkModel
from harness.sim.step_programs import (
    ALLREDUCE_ALGORITHMS,
    RingProgram,
    StepProgram,
    allreduce_program,
)

_MATRIX_MAX_RANKS = 4096  # emulated-link lookup by a dense boolean matrix up to this size


class _Resource:
    """One emulated resource's reservations (a link, a NIC direction, the fabric)."""

    __slots__ = ("busy", "ends", "in_order", "last_post", "max_end", "posts", "prune_at", "run_count", "runs")

    def __init__(self) -> None:
        self.busy: list[tuple[float, float]] = []  # reserved intervals, in time order
        self.posts: list[float] = []  # post times of the reservations, sorted, ...
        self.ends: list[float] = []  # ... and their ends, in the same order
        self.last_post = -math.inf
        self.max_end = -math.inf
        self.prune_at = 256
        # Whether ``ends`` grows with ``posts``, as FIFO makes it unless a message posted before
        # others took a later gap (reserve's second branch): then pruning cuts a prefix.
        self.in_order = True
        # Reservations appended in bulk (append_free), after everything in the lists, kept as
        # arrays (posts, transfers: their ends are posts + transfers; the run's last end) until a
        # message needs them in the lists: a ring through NICs adds thousands per resource and
        # collective, and the next message usually needs only last_post and max_end.
        self.runs: list[tuple[np.ndarray, np.ndarray | float, float]] = []
        self.run_count = 0

    def reserve(self, post: float, earliest: float, transfer: float, now: float) -> float:
        """Start of a ``transfer`` long slot for a message posted at ``post`` that may not start
        before ``earliest``: after every message posted before it (FIFO by posting, as the native
        layer), in the first gap from there. ``now``: no message is posted before it any more."""
        if self.runs:
            self._unpack_runs()
        if post >= self.last_post:  # posted after all the others (the common case): after them all
            max_end = self.max_end
            start = earliest if earliest > max_end else max_end
            end = start + transfer
            self.busy.append((start, end))
            self.posts.append(post)
            self.ends.append(end)
            self.last_post = post
            self.max_end = end  # it starts after every other ends: it ends last
        else:
            i = bisect.bisect_right(self.posts, post)
            start = max(earliest, max(self.ends[:i], default=earliest))
            busy = self.busy
            j = max(bisect.bisect_right(busy, (start, math.inf)) - 1, 0)  # the interval starting at or before start
            while j < len(busy) and busy[j][0] < start + transfer:
                if busy[j][1] > start:
                    start = busy[j][1]
                j += 1
            busy.insert(j, (start, start + transfer))
            self.posts.insert(i, post)
            self.ends.insert(i, start + transfer)
            self.in_order = False
            self.max_end = max(self.max_end, start + transfer)
        if len(self.busy) > self.prune_at:
            self._forget_before(now)
        return start

    def append_free(self, posts: np.ndarray, transfers: np.ndarray | float, now: float) -> None:
        """The reservations ``reserve`` makes for messages posted (in order, after all others) to
        a resource free for each of them: ``[post, post + transfer)`` each, ``transfers`` one per
        post or one for all (``harness.sim.ring_paths``). ``posts`` is kept, not copied."""
        last_end = float(posts[-1]) + float(transfers[-1] if isinstance(transfers, np.ndarray) else transfers)
        self.runs.append((posts, transfers, last_end))
        self.run_count += len(posts)
        self.last_post = float(posts[-1])
        self.max_end = max(self.max_end, last_end)  # free for each: the last ends last
        if len(self.busy) + self.run_count > self.prune_at:
            self._forget_before(now)

    def _unpack_runs(self) -> None:
        """Move the bulk reservations into the lists, in order after what is there."""
        for posts, transfers, _ in self.runs:
            p, e = posts.tolist(), (posts + transfers).tolist()
            self.busy.extend(zip(p, e))
            self.posts.extend(p)
            self.ends.extend(e)
        self.runs.clear()
        self.run_count = 0

    def _forget_before(self, horizon: float) -> None:
        """Drop reservations that ended before ``horizon``: no message posted from then on can
        queue behind them. The next pruning waits until the lists doubled: O(1) per message.

        Intervals never overlap, so in time order their ends grow too: those that ended are a
        prefix of ``busy``, and of ``posts``/``ends`` while those are in order. Bulk runs go
        whole once their last reservation ended (keeping a few ended ones changes nothing: no
        message posted from ``horizon`` on starts before it)."""
        if self.runs:
            kept = [run for run in self.runs if run[2] >= horizon]
            self.run_count -= sum(len(run[0]) for run in self.runs) - sum(len(run[0]) for run in kept)
            self.runs[:] = kept
        del self.busy[: bisect.bisect_left(self.busy, horizon, key=lambda interval: interval[1])]
        if self.in_order:
            cut = bisect.bisect_left(self.ends, horizon)
            del self.posts[:cut]
            del self.ends[:cut]
        else:
            live = [(p, e) for p, e in zip(self.posts, self.ends) if e >= horizon]
            self.posts[:] = [p for p, _ in live]
            self.ends[:] = [e for _, e in live]
            self.in_order = all(a <= b for a, b in zip(self.ends, self.ends[1:]))
        self.prune_at = max(256, 2 * (len(self.busy) + self.run_count))


class SimNetwork:
    """Message timing for ``ranks`` ranks: base alpha-beta plus the scenario's emulated links and
    topology of nodes (``harness.scenario.network.NodeTopology``), or the hosts of a multi-host
    run as nodes."""

    def __init__(
        self,
        ranks: int,
        base: NetworkModel,
        links: Sequence[EmulatedLink] = (),
        ring_threshold_bytes: int = RING_THRESHOLD_BYTES,
        topology: NodeTopology | None = None,
        clock: Callable[[], float] | None = None,
        hosts: NodeTopology | None = None,
        allreduce: str = "auto",
    ) -> None:
        """``allreduce``: the algorithm of every allreduce (``network.allreduce``; ``hierarchical``
        and ``tree`` go through the nodes of ``topology``).

        ``clock``: the simulated time now, before which no message is posted any more (lets the
        network forget old reservations); without one it keeps the last 10 s before each post.

        ``hosts``: instead of an emulated ``topology``, the real hosts the ranks ran on, as nodes
        (``harness.sim.hosts.hosts_topology``). Their paths hold messages by the same rule, but a
        real NIC hands a message on by itself: no progress-thread wake-up (``base.progress_s``) is
        added unless the pair also has an emulated link."""
        if topology is not None and hosts is not None:
            raise ValueError("give the scenario's emulated topology or the run's hosts, not both")
        self._wake_on_topology = hosts is None  # only the native emulator needs a progress thread to release
        topology = topology if hosts is None else hosts
        self.ranks = ranks
        self.clock = clock
        self.alpha = base.latency_s
        self.inv_bandwidth = 1.0 / base.bandwidth_bytes_per_s
        self.progress = base.progress_s
        self.shared_cores = base.shared_cores
        self.computing = 0  # ranks whose main thread is computing now (kept by the simulator)
        self.ring_threshold_bytes = ring_threshold_bytes
        if allreduce not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {allreduce!r} (one of {', '.join(ALLREDUCE_ALGORITHMS)})")
        if allreduce == "hierarchical" and topology is None:
            raise ValueError("a hierarchical allreduce needs the topology of nodes")
        self.allreduce = allreduce
        self._links: dict[tuple[int, int], tuple[float, float]] = {}
        for link in links:
            if not (0 <= link.src < ranks and 0 <= link.dst < ranks):
                raise ValueError(f"link {link.src}->{link.dst} outside ranks 0..{ranks - 1}")
            bandwidth = link.bandwidth_bytes_per_s
            self._links[(link.src, link.dst)] = (link.latency_s, 0.0 if bandwidth is None else 1.0 / bandwidth)
        self._sources = {src for src, _ in self._links}
        self._link_dsts: dict[int, set[int]] = {}  # src -> the dsts it has a link rule to
        for src, dst in self._links:
            self._link_dsts.setdefault(src, set()).add(dst)
        self._held_among: dict[tuple[int, ...], bool] = {}
        self.ring_edges: dict = {}  # harness.sim.ring_paths' per-ring analysis, by member tuple
        self._resources: dict[tuple, _Resource] = {}
        # Held pairs only (message() takes a cached route to mean "held"), by (src, dst).
        self._paths: dict[tuple[int, int], tuple[list[tuple[_Resource, float]], float, bool]] = {}
        self.topology = topology
        self._node: np.ndarray | None = None
        self._intra_emulated = self._inter_emulated = False
        if topology is not None:
            if len(topology.node_of) != ranks:
                raise ValueError(f"topology places {len(topology.node_of)} ranks, the network has {ranks}")
            self._node = np.asarray(topology.node_of, dtype=np.int64)
            self._node_list = [int(n) for n in topology.node_of]  # plain ints: message() looks them up per message

            def inv(bandwidth: float | None) -> float:
                return 0.0 if bandwidth is None else 1.0 / bandwidth

            self._intra = (topology.intra_latency_s, inv(topology.intra_bandwidth_bytes_per_s))
            self._nic = (topology.nic_latency_s, inv(topology.nic_bandwidth_bytes_per_s))
            self._fabric_inv = inv(topology.fabric_bandwidth_bytes_per_s)
            self._intra_emulated = self._intra != (0.0, 0.0)
            self._inter_emulated = self._nic != (0.0, 0.0) or self._fabric_inv > 0
        self._holds = self.emulated  # whether any message may be held (message()'s fast path)
        self._matrix = None
        if self._links and ranks <= _MATRIX_MAX_RANKS:
            self._matrix = np.zeros((ranks, ranks), dtype=bool)
            for src, dst in self._links:
                self._matrix[src, dst] = True

    @property
    def emulated(self) -> bool:
        return bool(self._links) or self._intra_emulated or self._inter_emulated

    def held_among(self, members: Sequence[int]) -> bool:
        """Whether a message between two of ``members`` (ranks) may cross an emulated path: a
        link rule between two of them, or the topology's intra-node links (two on one node) or
        NICs (two nodes). The collectives of the others take the base network's fast paths."""
        if not self.emulated:
            return False
        key = tuple(members)
        held = self._held_among.get(key)
        if held is None:
            held = False
            if self._node is not None:
                nodes = {self._node_list[m] for m in key}
                held = (self._intra_emulated and len(nodes) < len(key)) or (self._inter_emulated and len(nodes) > 1)
            if not held and self._links:
                inside, dsts = set(key), self._link_dsts
                if len(dsts) <= len(inside):  # walk the shorter of the two
                    held = any(src in inside and not to.isdisjoint(inside) for src, to in dsts.items())
                else:
                    held = any(m in dsts and not dsts[m].isdisjoint(inside) for m in inside)
            if len(self._held_among) < 65536:  # groups repeat; a bound keeps odd member lists from piling up
                self._held_among[key] = held
        return held

    def links_from(self, src: int) -> bool:
        """Whether any message ``src`` sends may cross an emulated link."""
        return src in self._sources or self._intra_emulated or self._inter_emulated

    def _held(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Which of the messages src[i] -> dst[i] have an emulated path (boolean mask)."""
        if self._matrix is not None:
            held = self._matrix[src, dst]
        elif self._links:
            held = np.array([(int(s), int(d)) in self._links for s, d in zip(src, dst)], dtype=bool)
        else:
            held = np.zeros(len(src), dtype=bool)
        if self._node is not None:
            same = self._node[src] == self._node[dst]
            held = held | (same & self._intra_emulated) | (~same & self._inter_emulated)
        return held & (src != dst)

    def _path(self, src: int, dst: int) -> tuple[list[tuple[_Resource, float]], float, bool]:
        """The resources (with their seconds per byte) a message src -> dst crosses, its latency,
        and whether the native emulator holds it (then releasing it costs a wake-up);
        unlimited resources are left out (they queue nothing)."""
        cached = self._paths.get((src, dst))
        if cached is not None:
            return cached
        path: list[tuple[tuple, float]] = []  # (resource key, seconds per byte)
        latency = 0.0
        link = self._links.get((src, dst))
        wakes = link is not None or self._wake_on_topology
        if link is not None:
            latency += link[0]
            path.append((("link", src, dst), link[1]))
        if self._node is not None:
            a, b = self._node_list[src], self._node_list[dst]
            if a == b:
                latency += self._intra[0]
                path.append((("intra", src, dst), self._intra[1]))
            else:
                latency += self._nic[0]
                path.append((("out", a), self._nic[1]))
                path.append((("fabric",), self._fabric_inv))
                path.append((("in", b), self._nic[1]))
        resources = [(self._resources.setdefault(key, _Resource()), inv_bw) for key, inv_bw in path if inv_bw > 0]
        self._paths[(src, dst)] = (resources, latency, wakes)
        return resources, latency, wakes

    def load_factor(self) -> float:
        """How much slower the progress threads are now: ``computing / shared_cores``, at least 1.

        With more ranks than cores, a message hop needs the receiving progress thread to get a
        core; while k ranks compute on C shared cores it waits for a time slice about k / C
        times as long (docs/guides/simulation.md). 1 when the cores are not shared.
        """
        if not self.shared_cores or self.computing <= self.shared_cores:
            return 1.0
        return self.computing / self.shared_cores

    def _hold(self, src: int, dst: int, nbytes: float, post: float) -> float:
        """Release time of a message on an emulated path (reserves it), by the native layer's rule:
        on each resource it starts no earlier than on the previous one, after the messages posted
        before it; it is released when its last byte has crossed them all, plus the latencies."""
        route = self._paths.get((src, dst))
        return self._hold_on(route if route is not None else self._path(src, dst), nbytes, post)

    def _hold_on(self, route: tuple[list[tuple[_Resource, float]], float, bool], nbytes: float, post: float) -> float:
        """:meth:`_hold` on the pair's ``route`` (``_path``'s answer)."""
        path, latency, wakes = route
        now = self.clock() if self.clock is not None else post - 10.0
        start = finish = post
        for resource, inv_bw in path:
            transfer = nbytes * inv_bw
            start = resource.reserve(post, start, transfer, now)
            end = start + transfer
            if end > finish:
                finish = end
        return finish + latency + (self.progress * self.load_factor() if wakes else 0.0)

    def message(self, src: int, dst: int, nbytes: float, post: float) -> tuple[float, float]:
        """(release, arrival) of one message posted at ``post``."""
        release = post
        if self._holds:  # else nothing is emulated: every message is released at once
            # A pair held before has its route cached: the hot path of point-to-point algorithms.
            route = self._paths.get((src, dst))
            if route is None and src != dst:  # a pair not held before: held on an emulated path?
                if (src, dst) in self._links:
                    route = self._path(src, dst)
                elif self._node is not None:
                    same_node = self._node_list[src] == self._node_list[dst]
                    if self._intra_emulated if same_node else self._inter_emulated:
                        route = self._path(src, dst)
            if route is not None:
                release = self._hold_on(route, nbytes, post)
        cost = self.alpha + nbytes * self.inv_bandwidth
        return release, release + (cost * self.load_factor() if self.shared_cores else cost)

    def messages(
        self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, post: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`message` for many messages (emulated ones in order of posting)."""
        release = post.copy()
        if self.emulated:
            held = np.flatnonzero(self._held(src, dst))
            for i in held[np.argsort(post[held], kind="stable")]:
                release[i] = self._hold(int(src[i]), int(dst[i]), float(nbytes[i]), float(post[i]))
        return release, release + (self.alpha + nbytes * self.inv_bandwidth) * self.load_factor()

    def allreduce_program(self, members: Sequence[int], count: int) -> StepProgram | RingProgram:
        """The native layer's allreduce program over ``members`` (ranks) for ``count`` floats with
        this network's algorithm (hierarchical: by the members' nodes)."""
        # The native layer knows only the emulated nodes: the hierarchical allreduce and the tree
        # follow them, never the hosts a real multi-host run was on.
        by_node = self.allreduce == "hierarchical" or (
            self.allreduce == "tree" and self.topology is not None and self._wake_on_topology
        )
        nodes = tuple(self._node_list[m] for m in members) if by_node else ()
        return allreduce_program(len(members), count, self.ring_threshold_bytes, self.allreduce, nodes)
