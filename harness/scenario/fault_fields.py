"""The scenario's ``faults``: kills, hangs and slow starts, and when each strikes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from harness.errors import ParamError
from harness.scenario.ranks import Rank, check_rank
from harness.strict_model import NonNegativeFloat, NonNegativeInt, StrictModel


class FaultSpec(StrictModel):
    """One injected fault of one rank (see docs/guides/faults.md); the simulator ignores faults."""

    kind: str
    """Which fault."""
    rank: Rank
    """The rank it strikes (< ``ranks``)."""

    def check(self, ranks: int) -> None:
        check_rank("rank", self.rank, ranks)


FaultPoint = Literal["iteration", "communication", "evaluation", "finish"]
"""Where in an algorithm's run a ``kill`` or ``hang`` strikes (``IterationFault.during``)."""


def _at_iteration_schema(schema: dict[str, Any]) -> None:
    """``at_iteration`` is required, except with ``during: finish``, where it is left out
    (``IterationFault._iteration_where_it_is_needed``)."""
    schema["if"] = {"properties": {"during": {"const": "finish"}}, "required": ["during"]}
    schema["then"] = {"properties": {"at_iteration": {"type": "null"}}}
    schema["else"] = {"properties": {"at_iteration": {"type": "integer"}}, "required": ["at_iteration"]}


class IterationFault(FaultSpec):
    """A fault that strikes in ``algorithm`` (None: the first algorithm the run trains), at the
    point ``during`` names:

    - ``iteration`` (the default): at the start of iteration ``at_iteration``, before its forward
      pass;
    - ``communication``: just after the rank posts its first communication operation at or after
      the start of iteration ``at_iteration``, while the operation is in flight (its peers wait
      inside it). The algorithm decides what that operation is: a blocking allreduce, a
      wait-avoiding round, a push-sum push, an AD-PSGD pair request (on a passive AD-PSGD rank,
      which posts none, its publish or drain while the active ranks' requests to it are in
      flight), the DiLoCo family's outer step (at a synchronizing iteration);
    - ``evaluation``: at the start of the first evaluation after iteration ``at_iteration``;
    - ``finish``: at the start of the algorithm's ``finish()``, after its last iteration
      (``at_iteration`` is then left out).
    """

    model_config = ConfigDict(json_schema_extra=_at_iteration_schema)

    at_iteration: NonNegativeInt | None = None
    """The iteration it strikes at (< ``workload.iterations``); required unless ``during: finish``,
    where it is left out."""
    algorithm: str | None = None
    """The name of the algorithm entry in whose run it strikes; null: the first algorithm run."""
    during: FaultPoint = "iteration"
    """Where it strikes: ``iteration`` (at the start of iteration ``at_iteration``), ``communication``
    (while the rank's first communication at or after that iteration is in flight),
    ``evaluation`` (at the start of the first evaluation after it) or ``finish`` (at the start of
    the algorithm's finish, after its last iteration)."""

    @model_validator(mode="after")
    def _iteration_where_it_is_needed(self) -> IterationFault:
        if self.during == "finish" and self.at_iteration is not None:
            raise ParamError(
                "at_iteration",
                "must be left out with during: finish (it strikes after the last iteration)",
                self.at_iteration,
            ).to_pydantic()
        if self.during != "finish" and self.at_iteration is None:
            raise ParamError("at_iteration", f"is required with during: {self.during}", None).to_pydantic()
        return self


class KillFault(IterationFault):
    """The rank's process dies (SIGKILL, as an out-of-memory kill or a node failure would)."""

    kind: Literal["kill"]
    """``kill``."""


class HangFault(IterationFault):
    """The rank's training loop stops making progress (its process stays alive)."""

    kind: Literal["hang"]
    """``hang``."""


class SlowStartFault(FaultSpec):
    """The rank starts ``delay_s`` late: it sleeps before it reports in and joins the first barrier."""

    kind: Literal["slow_start"]
    """``slow_start``."""
    delay_s: NonNegativeFloat
    """How late the rank starts, in seconds (one ``slow_start`` per rank)."""


AnyFaultSpec = Annotated[KillFault | HangFault | SlowStartFault, Field(discriminator="kind")]
