"""Stand-in buffers: what an algorithm's flat model looks like inside the simulator.

The simulator runs the algorithms' own hook code, which does its arithmetic with torch on the
flat model (``x.mul_(0.5)``, ``torch.add(z, u, alpha=-lr, out=y)``, ``x[:n].copy_(...)``). A
simulated rank of a 25.6M-parameter model must not hold or compute 100 MB, and thousands of
them must not spend microseconds per tensor operation either. A :class:`StandIn` is an object
with a length and no values: every tensor method and every ``torch.*`` function applied to it
returns a stand-in of the right length at once (``torch`` routes calls to it through
``__torch_function__``), so the hooks run unchanged, their communication calls see the true
sizes (``numel()``: the bytes the simulated network carries), and nothing else happens.

(With ``simulate --train`` the simulated ranks hold real tensors instead: ``harness.sim.training``.)

Rules an algorithm must follow to run in the simulator without values (the built-in ones do; a
test runs every registered algorithm there; ``harness.sim.value_check`` checks an algorithm of
the user's before ``simulate`` predicts it):

- derive buffers from the model: ``torch.empty_like(x)``, ``x.new_empty(n + 1)``,
  ``x.clone()``, slicing; never ``torch.empty(n)`` (that would allocate the full size);
- never let *communication* depend on the model's values (which operation to post, to whom,
  when to wait). Values read from a stand-in (``float(x[n])``, ``x.item()``) are 0.0.

Length rules: element-wise operations take the longest stand-in argument's length (a scalar
broadcasts), ``out=`` returns ``out``, ``torch.cat`` adds lengths, reductions give length 1,
indexing and slicing follow Python's slice arithmetic.
"""

from __future__ import annotations

from typing import Any

import torch

_REDUCTIONS = frozenset({"sum", "mean", "norm", "dot", "max", "min", "amax", "amin", "prod", "vdot", "std", "var"})
_SHAPE_FREE = frozenset({"numel", "size", "dim", "nelement"})


class StandIn:
    """A flat float32 buffer of ``n`` elements that holds no values (see the module docstring)."""

    __slots__ = ("n",)
    dtype = torch.float32
    device = torch.device("cpu")
    is_cuda = False
    requires_grad = False

    def __init__(self, n: int) -> None:
        self.n = int(n)

    # -- identity and shape -------------------------------------------------------------------
    def numel(self) -> int:
        return self.n

    nelement = numel

    def dim(self) -> int:
        return 1

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.n])

    def size(self, dim: int | None = None):
        return self.n if dim is not None else torch.Size([self.n])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"StandIn({self.n})"

    # -- values: none ---------------------------------------------------------------------------
    def __float__(self) -> float:
        return 0.0

    def item(self) -> float:
        return 0.0

    def __bool__(self) -> bool:
        raise TypeError("a simulated buffer has no values: communication must not depend on the model's values")

    # -- indexing -------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> StandIn:
        if index.__class__ is not slice:
            return _ELEMENT
        start, stop = index.start or 0, index.stop
        if index.step is None and start >= 0 and stop is not None and stop >= 0:  # x[a:b], the common case
            # max(0, min(stop, n) - min(start, n)) without the builtins' calls, and one object per
            # length (as _ELEMENT): the push-sum methods slice their buffers every iteration
            n = self.n
            length = (stop if stop < n else n) - (start if start < n else n)
            if length < 0:
                length = 0
            view = _VIEWS.get(length)
            if view is None:
                view = StandIn(length)
                if len(_VIEWS) < 1024:  # a model's few part lengths; a bound for any odd use
                    _VIEWS[length] = view
            return view
        return StandIn(len(range(*index.indices(self.n))))

    def __setitem__(self, index: Any, value: Any) -> None:
        pass

    # -- new buffers ------------------------------------------------------------------------------
    def new_empty(self, size, *args: Any, **kwargs: Any) -> StandIn:
        return StandIn(_length(size))

    new_zeros = new_ones = new_full = new_empty

    def clone(self, *args: Any, **kwargs: Any) -> StandIn:
        return StandIn(self.n)

    def detach(self) -> StandIn:
        return self

    def to(self, *args: Any, **kwargs: Any) -> StandIn:
        return self

    contiguous = cpu = float = view_as = to

    # -- arithmetic: in place returns self, out of place a fresh stand-in ---------------------------
    def __getattr__(self, name: str):
        if name.endswith("_") and not name.startswith("_"):
            return self._in_place
        if name in _REDUCTIONS:
            return _reduction
        raise AttributeError(f"a simulated buffer (StandIn) has no attribute {name!r}; see harness.sim.standin")

    def _in_place(self, *args: Any, **kwargs: Any) -> StandIn:
        return self

    # The in-place methods algorithms use most, spelled out: found without the __getattr__ detour.
    add_ = sub_ = mul_ = div_ = copy_ = zero_ = fill_ = addcmul_ = addcdiv_ = lerp_ = clamp_ = _in_place
    neg_ = sqrt_ = pow_ = abs_ = sign_ = _in_place

    def _elementwise(self, other: Any) -> StandIn:
        return StandIn(max(self.n, other.n) if isinstance(other, StandIn) else self.n)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _elementwise
    __truediv__ = __rtruediv__ = __pow__ = __matmul__ = _elementwise

    def __neg__(self) -> StandIn:
        return StandIn(self.n)

    def _augmented(self, other: Any) -> StandIn:
        return self

    __iadd__ = __isub__ = __imul__ = __itruediv__ = _augmented

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = kwargs.get("out")
        if out is not None:
            return out
        name = getattr(func, "__name__", "")
        if name == "cat":
            return StandIn(sum(x.n for x in args[0]))
        if name in _REDUCTIONS:
            return StandIn(1)
        lengths = [a.n for a in args if isinstance(a, StandIn)]
        lengths += [a.n for v in args if isinstance(v, (list, tuple)) for a in v if isinstance(a, StandIn)]
        return StandIn(max(lengths) if lengths else 1)


_ELEMENT = StandIn(1)  # x[i]: one element (stand-ins hold no state, so one object serves all)
_VIEWS: dict[int, StandIn] = {}  # x[a:b] by length, for the same reason


def _reduction(*args: Any, **kwargs: Any) -> StandIn:
    return StandIn(1)


def _length(size: Any) -> int:
    if isinstance(size, (tuple, list, torch.Size)):
        total = 1
        for s in size:
            total *= int(s)
        return total
    return int(size)
