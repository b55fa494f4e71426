"""Deterministic list scheduling of prioritised tasks with dependencies on parallel workers."""

import heapq
from typing import NamedTuple

__all__ = ["CycleError", "Run", "Scheduler"]


class CycleError(ValueError):
    def __init__(self, cycle):
        super().__init__("dependency cycle: " + " -> ".join(cycle))
        self.cycle = cycle


class Run(NamedTuple):
    name: str
    worker: int
    start: float
    end: float


class _Task(NamedTuple):
    name: str
    duration: float
    priority: int
    deps: tuple
    seq: int  # insertion order, the tie-breaker


class Scheduler:
    def __init__(self):
        self._tasks = {}
        self._seq = 0

    def add(self, name, duration, priority=0, deps=()):
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration > 0:
            raise ValueError("duration must be a number > 0")
        if name in self._tasks:
            raise ValueError(f"task {name!r} already exists")
        deps = tuple(dict.fromkeys(deps))
        if name in deps:
            raise ValueError(f"task {name!r} depends on itself")
        self._tasks[name] = _Task(name, duration, priority, deps, self._seq)
        self._seq += 1

    def __len__(self):
        return len(self._tasks)

    def __contains__(self, name):
        return name in self._tasks

    def _dependents(self):
        users = {n: [] for n in self._tasks}
        for t in self._tasks.values():
            for d in t.deps:
                if d in users:
                    users[d].append(t.name)
        return users

    def remove(self, name):
        if name not in self._tasks:
            raise KeyError(name)
        users, doomed, todo = self._dependents(), set(), [name]
        while todo:
            n = todo.pop()
            if n not in doomed:
                doomed.add(n)
                todo.extend(users[n])
        for n in doomed:
            del self._tasks[n]
        return sorted(doomed)

    def _validate(self):
        """Raise KeyError for unknown dependencies and CycleError for cycles; return a topological order."""
        for t in self._tasks.values():
            for d in t.deps:
                if d not in self._tasks:
                    raise KeyError(f"task {t.name!r} depends on unknown task {d!r}")
        state, order = {}, []
        for root in sorted(self._tasks, key=lambda n: self._tasks[n].seq):
            if root in state:
                continue
            path, stack = [root], [iter(self._tasks[root].deps)]
            state[root] = 1
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    done = path.pop()
                    state[done] = 2
                    order.append(done)
                    stack.pop()
                elif state.get(nxt) == 1:
                    raise CycleError(path[path.index(nxt):] + [nxt])
                elif nxt not in state:
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(self._tasks[nxt].deps))
        return order

    def run(self, workers=1):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._validate()
        waiting = {n: len(t.deps) for n, t in self._tasks.items()}
        users = self._dependents()
        ready = [(-t.priority, t.seq, n) for n, t in self._tasks.items() if not t.deps]
        heapq.heapify(ready)
        free = list(range(workers))
        running = []  # heap of (end, worker, name)
        now, out = 0, []
        while ready or running:
            while free and ready:
                _, _, name = heapq.heappop(ready)
                worker = heapq.heappop(free)
                end = now + self._tasks[name].duration
                out.append(Run(name, worker, now, end))
                heapq.heappush(running, (end, worker, name))
            now = running[0][0]
            while running and running[0][0] == now:
                _, worker, name = heapq.heappop(running)
                heapq.heappush(free, worker)
                for user in users[name]:
                    waiting[user] -= 1
                    if waiting[user] == 0:
                        t = self._tasks[user]
                        heapq.heappush(ready, (-t.priority, t.seq, user))
        return sorted(out, key=lambda r: (r.start, r.worker))

    def order(self):
        return [r.name for r in self.run(1)]

    def makespan(self, workers=1):
        return max((r.end for r in self.run(workers)), default=0)

    def critical_path(self):
        topo = self._validate()
        if not topo:
            return 0, []
        finish, best_dep = {}, {}
        for n in topo:
            t = self._tasks[n]
            pick = None
            for d in t.deps:
                if pick is None or (finish[d], -self._tasks[d].seq) > (finish[pick], -self._tasks[pick].seq):
                    pick = d
            best_dep[n] = pick
            finish[n] = (finish[pick] if pick else 0) + t.duration
        last = max(topo, key=lambda n: (finish[n], -self._tasks[n].seq))
        chain = [last]
        while best_dep[chain[-1]] is not None:
            chain.append(best_dep[chain[-1]])
        return finish[last], chain[::-1]
