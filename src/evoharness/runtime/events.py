"""What crosses the seam between a scheduler and the world it schedules.

*Events* are facts the world reports (the simulator here, the real runtime
later); *commands* are a scheduler's decisions. Neither carries a time: a
scheduler reacts to the order of events only, so nothing in it assumes
simulated time (QwenGyre, arXiv 2609.33848: the scheduler is driven by the
gateway's d/p/f counters and by role-transfer completions).

Identifiers: executions are numbered ``group * group_size + k`` (k-th member of
a GRPO group); groups are numbered across steps (group g belongs to the batch
of step ``g // groups_per_step``); cells are 0..K-1 with 0 the core.
"""

from __future__ import annotations

from dataclasses import dataclass

from evoharness.runtime.cells import Role

# ---- events (world -> scheduler) -------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutionDispatched:
    """The harness accepted an execution; it waits for a cell (d += 1)."""

    execution: int
    group: int


@dataclass(frozen=True, slots=True)
class ExecutionStarted:
    """Its first model call was issued on `cell` (p += 1)."""

    execution: int
    cell: int


@dataclass(frozen=True, slots=True)
class ExecutionFinished:
    """Its last turn ended (f += 1); `tokens`: trajectory tokens to train."""

    execution: int
    cell: int
    tokens: int


@dataclass(frozen=True, slots=True)
class ExecutionOrphaned:
    """Its cell left rollout without moving it (no `Migrate`): it needs a new
    cell. `aborted`: a model call was in flight and the agent turn was lost."""

    execution: int
    cell: int
    aborted: bool


@dataclass(frozen=True, slots=True)
class ModelCallStarted:
    """Sent only to schedulers with ``observes_model_calls = True``."""

    execution: int
    cell: int


@dataclass(frozen=True, slots=True)
class ModelCallFinished:
    """Sent only to schedulers with ``observes_model_calls = True``."""

    execution: int
    cell: int


@dataclass(frozen=True, slots=True)
class MicroBatchDone:
    """`cell` finished forward/backward on `executions`; it is free again."""

    cell: int
    executions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RoleSwitchDone:
    """`cell` now holds `role` (ROLLOUT or TRAIN)."""

    cell: int
    role: Role


@dataclass(frozen=True, slots=True)
class WeightSyncDone:
    """Optimizer step applied and weights of `version` are on every cell named
    in the `SyncWeights` command."""

    version: int


@dataclass(frozen=True, slots=True)
class CellLost:
    """`cell` failed (its process died). Its bound executions follow as
    `ExecutionOrphaned` (not aborted: their calls are re-issued once they are
    bound again), a micro-batch it was training is lost and must be claimed
    again, and a replacement joins later with ``RoleSwitchDone(cell, ROLLOUT)``
    (it loads the newest weights)."""

    cell: int


Event = (
    ExecutionDispatched
    | ExecutionStarted
    | ExecutionFinished
    | ExecutionOrphaned
    | ModelCallStarted
    | ModelCallFinished
    | MicroBatchDone
    | RoleSwitchDone
    | WeightSyncDone
    | CellLost
)

# ---- commands (scheduler -> world) -----------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Start every execution of `group` under policy `version` (its behaviour
    version)."""

    group: int
    version: int


@dataclass(frozen=True, slots=True)
class Bind:
    """Serve a dispatched (or orphaned) execution's model calls on `cell`."""

    execution: int
    cell: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a bound execution to `cell`; a model call in flight is cancelled
    and transparently re-issued there (the harness sees no error; the context
    is re-prefilled). QwenGyre's harness-preserving role transfer."""

    execution: int
    cell: int


@dataclass(frozen=True, slots=True)
class SwitchRole:
    """Transfer `cell` to `role` (ROLLOUT or TRAIN); answered by
    `RoleSwitchDone`. A cell leaving rollout takes no new requests."""

    cell: int
    role: Role


@dataclass(frozen=True, slots=True)
class RunMicroBatch:
    """Forward/backward of `executions` on train cell `cell` with the weights
    of policy `version` (fixed during the step)."""

    cell: int
    executions: tuple[int, ...]
    version: int


@dataclass(frozen=True, slots=True)
class SyncWeights:
    """Optimizer step, then weights of `version` to `cells` (rollout cells
    among them pause generation meanwhile; nothing is aborted)."""

    version: int
    cells: tuple[int, ...]


Command = Dispatch | Bind | Migrate | SwitchRole | RunMicroBatch | SyncWeights
