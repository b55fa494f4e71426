"""Deterministic topological sorting (Kahn + min-heap), levels, reachability, cycles."""

import heapq

__all__ = ["CycleError", "toposort", "layers", "dependencies", "dependents", "find_cycle", "reverse"]


class CycleError(ValueError):
    def __init__(self, cycle):
        self.cycle = list(cycle)
        super().__init__("dependency cycle: " + " -> ".join(map(str, self.cycle)))


def _normalise(graph):
    """node -> set of dependencies, with dependency-only nodes added."""
    deps = {node: set(ds) for node, ds in graph.items()}
    for ds in list(deps.values()):
        for d in ds:
            deps.setdefault(d, set())
    return deps


def reverse(graph):
    return _reverse(_normalise(graph))


def _reverse(deps):
    rev = {node: [] for node in deps}
    for node, ds in deps.items():
        for d in ds:
            rev[d].append(node)
    return {node: sorted(users) for node, users in rev.items()}


def find_cycle(graph):
    return _find_cycle(_normalise(graph))


def _find_cycle(deps):
    state = {}  # node -> 1 on the current path, 2 done
    for root in sorted(deps):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(deps[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(deps[nxt])))
    return None


def toposort(graph):
    return _toposort(_normalise(graph))


def _toposort(deps):
    rev = _reverse(deps)
    missing = {node: len(ds) for node, ds in deps.items()}
    ready = [node for node, n in missing.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for user in rev[node]:
            missing[user] -= 1
            if missing[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(deps):
        raise CycleError(_find_cycle(deps))
    return order


def layers(graph):
    deps = _normalise(graph)
    level = {}
    for node in _toposort(deps):
        level[node] = 1 + max((level[d] for d in deps[node]), default=-1)
    out = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for node in sorted(level):
        out[level[node]].append(node)
    return out


def _reach(adjacency, node):
    if node not in adjacency:
        raise KeyError(node)
    seen, todo = set(), list(adjacency[node])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(adjacency[n])
    return seen


def dependencies(graph, node):
    return _reach(_normalise(graph), node)


def dependents(graph, node):
    return _reach(_reverse(_normalise(graph)), node)
