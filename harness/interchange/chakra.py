"""What a torch.distributed script run's records mean in Chakra's terms, and back.

A script run's ``collectives.csv`` (``harness.dist.sequence``) names each operation by the
native layer's name; a Chakra ET node says the same with its node type, ``comm_type`` and
attributes. The mapping (docs/guides/chakra.md has it as a table):

- collectives are ``COMM_COLL_NODE`` with ``comm_type`` (an int64 attribute, the
  ``CollectiveCommType`` number) and ``comm_size`` (int64, bytes). ``comm_size`` follows the
  convention of Chakra's PyTorch converter (the bytes of the operation's input tensors on this
  rank) and of ASTRA-sim's collectives (``Ring``: an all-gather's size is one rank's piece and
  grows ``x n``, a reduce-scatter's is the whole input and shrinks ``/ n``, an all-to-all's is
  everything the rank sends): the same as the harness's ``payload_bytes``, so it is copied as
  is. A root (broadcast, scatter: the source; reduce, gather: the destination) is
  ``comm_src``/``comm_dst`` (int32), which Chakra defines for point-to-point only;
- ``send``/``recv`` are ``COMM_SEND_NODE``/``COMM_RECV_NODE`` with ``comm_size``, ``comm_src``,
  ``comm_dst`` (world ranks) and ``comm_tag`` (the message's number among those from the same
  source to the same destination, so the k-th send matches the k-th receive);
- every operation names its process group by ``pg_name`` (a string); ASTRA-sim reads it as a
  number, ``"0"`` (or none) being all ranks. The groups' ranks are in a ``METADATA_NODE``
  named ``process_group:init`` whose ``inputs.values`` holds them as PyTorch's execution trace
  observer writes them (a Python list of one JSON string: ``[{"pg_name": ..., "ranks": ...}]``,
  which ASTRA-sim reads), and in ASTRA-sim's ``--comm-group-configuration`` file
  (``{"<pg_name>": [ranks]}``, without ``"0"``).

Attributes named ``harness_*`` carry what Chakra has no field for (a step's recorded times, an
operation's exact place and phase); a reader that does not know them ignores them, and an
import without them derives the same from the graph (:mod:`harness.interchange.chakra_import`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.interchange.et_format import COLLECTIVE_COMM_TYPES, COMM_TYPE, NODE_TYPE

PRODUCER = "harness"
PG_INIT_NAME = "process_group:init"  # PyTorch's name of the node that describes the process groups
WORLD_PG = "0"  # ASTRA-sim: pg_name "0" (or none) is the group of all ranks

# The native operations' Chakra form: (node type, comm_type or None).
OP_TO_CHAKRA: dict[str, tuple[str, str | None]] = {
    "allreduce": ("COMM_COLL_NODE", "ALL_REDUCE"),
    "reduce": ("COMM_COLL_NODE", "REDUCE"),
    "allgather": ("COMM_COLL_NODE", "ALL_GATHER"),
    "gather": ("COMM_COLL_NODE", "GATHER"),
    "scatter": ("COMM_COLL_NODE", "SCATTER"),
    "broadcast": ("COMM_COLL_NODE", "BROADCAST"),
    "alltoall": ("COMM_COLL_NODE", "ALL_TO_ALL"),
    "reduce_scatter": ("COMM_COLL_NODE", "REDUCE_SCATTER"),
    "barrier": ("COMM_COLL_NODE", "BARRIER"),
    "send": ("COMM_SEND_NODE", None),
    "recv": ("COMM_RECV_NODE", None),
}
# comm_type number -> native op. REDUCE_SCATTER_BLOCK (equal blocks) is the native reduce-scatter too.
COMM_TYPE_TO_OP = {COMM_TYPE[t]: op for op, (_, t) in OP_TO_CHAKRA.items() if t is not None}
COMM_TYPE_TO_OP[COMM_TYPE["REDUCE_SCATTER_BLOCK"]] = "reduce_scatter"
ROOT_IS_SOURCE = frozenset({"broadcast", "scatter"})  # root in comm_src
ROOT_IS_DESTINATION = frozenset({"reduce", "gather"})  # root in comm_dst
COMM_NODE_TYPES = frozenset(NODE_TYPE[t] for t in ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"))

# Chakra's attribute names (as its feeder reads them) and the harness's own.
COMM_TYPE_ATTR, COMM_SIZE, COMM_SRC, COMM_DST, COMM_TAG, PG_NAME, IS_CPU_OP = (
    "comm_type",
    "comm_size",
    "comm_src",
    "comm_dst",
    "comm_tag",
    "pg_name",
    "is_cpu_op",
)
H_STEP = "harness_step"  # int64: the step (iteration) a node belongs to
H_ROLE = "harness_role"  # string: a COMP_NODE's part of its step (ROLES)
H_SEQ = "harness_seq"  # int64: collectives.csv's seq
H_PHASE = "harness_phase"  # string: before / overlap / after
H_AT = "harness_at"  # double: the place in the step's local work (overlap)
H_WAITED = "harness_waited"  # bool
H_COLUMN = "harness_column:"  # prefix: a collectives.csv column this module does not map (string)
# On a step's end node: steps.csv's values that no duration carries.
H_START, H_BLOCKED, H_BYTES, H_LOSS, H_ACCURACY = (
    "harness_start_s",
    "harness_comm_blocked_s",
    "harness_bytes_sent",
    "harness_loss",
    "harness_accuracy",
)
ROLE_DELAY, ROLE_WORK, ROLE_END = "injected_delay", "local_work", "step_end"
# In GlobalMetadata: the rank's entry of the run's script_structure.json (JSON), which a replay at
# another rank count rescales FSDP's and ZeRO's operations by (harness.sim.script_scaling).
H_STRUCTURE = "harness_script_structure"
# collectives.csv's columns this mapping gives a meaning; any other is carried as H_COLUMN + name.
MAPPED_COLUMNS = ("rank", "iteration", "seq", "op", "group_ranks", "payload_bytes", "peer", "phase", "at", "waited")


class ChakraError(HarnessError, ValueError):
    """A run or trace that cannot be carried across (the message names the file and the node)."""


def a_(word: str) -> str:
    """``word`` with its indefinite article."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def comm_type_name(number: int) -> str:
    return COLLECTIVE_COMM_TYPES[number] if 0 <= number < len(COLLECTIVE_COMM_TYPES) else f"unknown ({number})"


@dataclass(frozen=True)
class ProcessGroups:
    """The process groups of a trace: ``pg_name`` -> world ranks (ascending)."""

    ranks_of: Mapping[str, tuple[int, ...]]
    world: int

    @classmethod
    def of_members(cls, groups: Iterable[str], world: int) -> ProcessGroups:
        """Names for the groups of collectives.csv (``group_ranks``, space-separated world ranks):
        ``"0"`` for all ranks, then ``"1"``, ``"2"``... in the order of their ranks, so every
        rank's file names a group alike."""
        everyone = tuple(range(world))
        members = sorted({tuple(sorted(int(m) for m in str(g).split())) for g in groups} - {everyone})
        table = {WORLD_PG: everyone}
        table.update({str(i): m for i, m in enumerate(members, start=1)})
        return cls(table, world)

    def name_of(self, group_ranks: str) -> str:
        wanted = tuple(sorted(int(m) for m in str(group_ranks).split()))
        for name, members in self.ranks_of.items():
            if members == wanted:
                return name
        raise KeyError(group_ranks)

    def members(self, pg_name: str) -> tuple[int, ...] | None:
        """The group's ranks; all ranks for ``""`` (no pg_name) or ``"0"`` unless described; None if unknown."""
        if pg_name in self.ranks_of:
            return self.ranks_of[pg_name]
        if pg_name in ("", WORLD_PG):
            return tuple(range(self.world))
        return None

    def pytorch_values(self) -> str:
        """``inputs.values`` of a ``process_group:init`` node, as PyTorch writes it."""
        described = [
            {
                "pg_name": name,
                "pg_desc": "default_pg" if name == WORLD_PG else "",
                "ranks": list(members),
                "group_size": len(members),
            }
            for name, members in self.ranks_of.items()
        ]
        return repr([json.dumps(described)])

    def comm_group_configuration(self) -> dict[str, list[int]]:
        """ASTRA-sim's ``--comm-group-configuration`` (its group 0 is implicit: all ranks)."""
        return {name: list(m) for name, m in self.ranks_of.items() if name != WORLD_PG}


def parse_pytorch_groups(values: str, world: int, where: str) -> dict[str, tuple[int, ...]]:
    """The groups a ``process_group:init`` node's ``inputs.values`` describes (empty ranks: all)."""
    text = values.strip()
    try:
        parsed = ast.literal_eval(text) if text.startswith("[") and not text.startswith("[{") else json.loads(text)
        if isinstance(parsed, list) and len(parsed) == 1 and isinstance(parsed[0], str):
            parsed = json.loads(parsed[0])
        out = {}
        for entry in parsed:
            ranks = tuple(sorted(int(r) for r in entry.get("ranks") or range(world)))
            out[str(entry["pg_name"])] = ranks
        return out
    except (ValueError, SyntaxError, TypeError, KeyError, AttributeError) as exc:
        raise ChakraError(
            f"{where}: its process groups (inputs.values) do not read as PyTorch's list of {{pg_name, ranks}}: {exc}"
        ) from None


def read_comm_group_configuration(path) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's ``--comm-group-configuration`` file: ``{"<pg_name>": [ranks]}``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {str(k): tuple(sorted(int(r) for r in v)) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ChakraError(f'{path}: not a communicator group file ({{"<pg_name>": [ranks]}}): {exc}') from None
