"""Cells, their roles, and the dispatch counters of QwenGyre's elastic runtime.

QwenGyre (arXiv 2609.33848, "elastic cells"): the accelerators are grouped into
K identical *cells* that share one training layout. Cell 0 is the *core* (it
holds the authoritative weights and the only optimizer state); the others are
satellites. At any moment a cell holds exactly one role: rollout, train, or is
in transfer between the two.

Counters (QwenGyre): executions dispatched d(t), started p(t), finished f(t);
outstanding work w(t) = d(t) - f(t). Capacities are in *executions* (agent
sessions a cell hosts at once, each holding its KV cache), so the rollout
capacity C_R(t) is the sum of the capacities of the cells now in rollout.

This module is the scheduler's own view of the cluster. It knows nothing about
time: the same objects drive the simulator and (later) the real runtime.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import IntEnum


class Role(IntEnum):
    """What a cell does now. ``TO_TRAIN`` / ``TO_ROLLOUT``: in transfer."""

    ROLLOUT = 0
    TRAIN = 1
    TO_TRAIN = 2
    TO_ROLLOUT = 3


@dataclass(slots=True)
class Cell:
    """One cell as the scheduler sees it.

    Attributes:
        id: 0..K-1; 0 is the core.
        capacity: executions it can host at once in rollout.
        role: current role.
        bound: executions whose model calls it serves (rollout only).
    """

    id: int
    capacity: int
    role: Role = Role.ROLLOUT
    bound: set[int] = field(default_factory=set)

    @property
    def core(self) -> bool:
        return self.id == 0

    @property
    def load(self) -> int:
        return len(self.bound)


@dataclass(slots=True)
class Counters:
    """QwenGyre's d(t), p(t), f(t) and w(t) = d(t) - f(t), in executions."""

    dispatched: int = 0
    started: int = 0
    finished: int = 0

    @property
    def outstanding(self) -> int:
        return self.dispatched - self.finished


class CellPool:
    """The K cells, where each execution is bound, and least-loaded routing.

    Routing keeps a lazy min-heap of (load, cell id) over rollout cells, so a
    placement costs O(log K) (no scan of all cells): 1,024 cells x 10,000
    executions stay cheap.
    """

    def __init__(self, capacity: int, roles: list[Role]):
        self.cells = [Cell(i, capacity, r) for i, r in enumerate(roles)]
        self.cell_of: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self.rollout_capacity = 0
        for c in self.cells:
            if c.role == Role.ROLLOUT:
                self.rollout_capacity += c.capacity
                heapq.heappush(self._heap, (0, c.id))

    def __len__(self) -> int:
        return len(self.cells)

    def _touch(self, c: Cell) -> None:
        if c.role == Role.ROLLOUT:
            heapq.heappush(self._heap, (c.load, c.id))

    def least_loaded(self, need_free: bool = True) -> Cell | None:
        """The rollout cell with the fewest bound executions (lowest id on
        ties); None if there is none, or (need_free) if even it is full."""
        h, cells = self._heap, self.cells
        while h:
            load, i = h[0]
            c = cells[i]
            if c.role != Role.ROLLOUT or c.load != load:
                heapq.heappop(h)
                continue
            if need_free and load >= c.capacity:
                return None
            return c
        return None

    def bind(self, execution: int, cell: Cell) -> None:
        cell.bound.add(execution)
        self.cell_of[execution] = cell.id
        self._touch(cell)

    def unbind(self, execution: int) -> Cell | None:
        i = self.cell_of.pop(execution, None)
        if i is None:
            return None
        c = self.cells[i]
        c.bound.discard(execution)
        self._touch(c)
        return c

    def set_role(self, cell: Cell, role: Role) -> None:
        if cell.role == Role.ROLLOUT and role != Role.ROLLOUT:
            self.rollout_capacity -= cell.capacity
        elif cell.role != Role.ROLLOUT and role == Role.ROLLOUT:
            self.rollout_capacity += cell.capacity
        cell.role = role
        self._touch(cell)

    def with_role(self, role: Role) -> list[Cell]:
        return [c for c in self.cells if c.role == role]
