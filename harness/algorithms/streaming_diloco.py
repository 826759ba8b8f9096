"""Streaming DiLoCo: fragment-wise, overlapped outer steps (Douillard et al., 2025).

Arthur Douillard, Yanislav Donchev, Keith Rush, Satyen Kale, Zachary Charles, Zachary Garrett,
Gabriel Teston, Dave Lacey, Ross McIlroy, Jiajun Shen, Alexandre Ramé, Arthur Szlam,
Marc'Aurelio Ranzato, Paul Barham: "Streaming DiLoCo with overlapping communication: Towards a
Distributed Free Lunch", arXiv:2501.18512.

The flat model is cut into F = ``fragments`` contiguous slices of (nearly) equal length
(parameters in the model's order, so a fragment is a run of consecutive layers; the paper
groups whole transformer blocks, strided). Each fragment p has its own global copy theta_p and
outer momentum, and its own schedule (``harness.schedules.fragment_sync``): outer steps H =
``inner_steps`` apart, the fragments evenly staggered, so at most one fragment's allreduce
starts per iteration and the traffic of an outer round is spread over it. After the step of an
iteration t where fragment p is due::

    Delta_p = q(theta_p - x_{i,p})                # q: rounding to ``precision``
    start the allreduce (mean) of Delta_p         # non-blocking: the progress thread sends it

and after the step of iteration t + tau (tau = ``overlap``; 0: at once, blocking)::

    wait for it; theta_p = OuterNesterov(theta_p, Delta_p)
    x_{i,p} = alpha * x_{i,p} + (1 - alpha) * theta_p      # the merge; alpha = 0 replaces

so tau inner steps run while a fragment is on the wire, and the merge keeps the local progress
made meanwhile with weight ``alpha``. With one fragment, tau = 0 and alpha = 0 this is DiLoCo
step for step (a test checks it bit for bit).

``precision`` (the paper quantizes outer gradients to 4-bit E3M0 floats): ``bfloat16`` or
``float8_e4m3`` rounds each rank's Delta_p to that format (``float8_e4m3`` saturates at
+-448) before the allreduce; the sum and the outer step stay in float32, and the wire still
carries float32, so the emulation shows the rounding's effect on convergence but not the
bandwidth it would save. E3M0 itself is not offered.

``staleness`` is tau at iterations that merge a fragment (its global copy left the other
ranks tau steps ago) and -1 otherwise. ``finish`` completes the fragments in flight and merges
them, then gives every fragment with local steps since its last outer step one more, blocking
(as DiLoCo's ``finish`` does for the whole model).

Example::

    - {name: streaming_diloco, inner_steps: 20, fragments: 4, overlap: 1, alpha: 0.5}
"""

from __future__ import annotations

from typing import Any

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.outer import OuterNesterov
from harness.algorithms.params import StreamingDiLoCoParams
from harness.schedules import fragment_sync

_PRECISION = {"bfloat16": torch.bfloat16, "float8_e4m3": torch.float8_e4m3fn}
_FLOAT8_MAX = 448.0  # the largest finite float8_e4m3fn


def fragment_bounds(count: int, fragments: int) -> list[slice]:
    """``fragments`` contiguous slices covering ``count`` floats, lengths differing by at most one.

    >>> fragment_bounds(10, 3)
    [slice(0, 3, None), slice(3, 6, None), slice(6, 10, None)]
    """
    edges = [p * count // fragments for p in range(fragments + 1)]
    return [slice(edges[p], edges[p + 1]) for p in range(fragments)]


def round_to(delta: Any, precision: str) -> None:
    """Round ``delta`` in place to ``precision`` (values stay float32)."""
    if precision == "float32":
        return
    if precision == "float8_e4m3":
        delta.clamp_(-_FLOAT8_MAX, _FLOAT8_MAX)
    delta.copy_(delta.to(_PRECISION[precision]))


class StreamingDiLoCo(Algorithm):
    name = "streaming_diloco"
    params: StreamingDiLoCoParams

    def __init__(self, params: StreamingDiLoCoParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.parts = fragment_bounds(ctx.params.numel(), params.fragments)
        self.global_model = ctx.params.detach().clone()  # theta, every fragment's
        self.outer = OuterNesterov(params.outer_lr, params.outer_momentum, ctx.params)
        self.pseudo_grad = torch.empty_like(ctx.params)  # fragment p's Delta_p in its own slice
        self.in_flight: dict[int, tuple[Any, int]] = {}  # fragment -> (allreduce handle, iteration due)
        self.started = [-1] * params.fragments  # the iteration of each fragment's last outer step
        self.last_iteration = -1

    def after_step(self, t: int) -> None:
        p = self.params
        self.last_iteration = t
        for fragment in range(p.fragments):
            if fragment_sync(t, fragment, p.fragments, p.inner_steps):
                self.start(fragment, due=t + p.overlap)
                self.started[fragment] = t
        merged = False
        for fragment, (_, due) in list(self.in_flight.items()):
            if due <= t:
                self.merge(fragment)
                merged = True
        self.staleness = p.overlap if merged else -1

    def finish(self) -> None:
        for fragment in list(self.in_flight):
            self.merge(fragment)
        # As DiLoCo's finish: a fragment with local steps since its last outer step gets one more.
        for fragment, started in enumerate(self.started):
            if started != self.last_iteration:
                self.start(fragment, due=self.last_iteration)
                self.merge(fragment)

    def start(self, fragment: int, due: int) -> None:
        """Fragment ``fragment``'s pseudo-gradient, rounded, on its way to every rank."""
        part = self.parts[fragment]
        delta = torch.sub(self.global_model[part], self.ctx.params[part], out=self.pseudo_grad[part])
        round_to(delta, self.params.precision)
        self.in_flight[fragment] = (self.ctx.comm.iallreduce(delta, op="mean"), due)

    def merge(self, fragment: int) -> None:
        """Wait for the fragment's allreduce, take the outer step, merge into the local model."""
        handle, _ = self.in_flight.pop(fragment)
        handle.wait()
        part = self.parts[fragment]
        theta = self.global_model[part]
        self.outer.step(theta, self.pseudo_grad[part], part)
        x = self.ctx.params[part]
        alpha = self.params.alpha
        if alpha == 0.0:
            x.copy_(theta)  # DiLoCo's restart, exactly
        else:
            x.mul_(alpha).add_(theta, alpha=1.0 - alpha)
