"""The package layering of src/evoharness, read from every import statement (function-level ones
included): no cycle between packages, configs import nothing else of the project, the runtime knows
nothing of losses and the trainer nothing of cells."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "evoharness"


def _package(module: str) -> str:
    """``evoharness.train.grpo`` -> ``train``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def import_graph() -> dict[str, set[str]]:
    """Package -> the packages its modules import."""
    edges: dict[str, set[str]] = defaultdict(set)
    for f in SRC.rglob("*.py"):
        if "data" in f.relative_to(SRC).parts:  # bundled task repositories, not the product
            continue
        module = ".".join(f.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("evoharness.") and _package(name) != _package(module):
                    edges[_package(module)].add(_package(name))
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path, or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n, [n])):
            return found
    return None


def test_no_import_cycle_between_packages():
    edges = import_graph()
    assert edges["recipes"] >= {"runtime", "train"}  # the graph is read (not empty)
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_layers():
    edges = import_graph()
    assert edges.get("config", set()) == set(), "configs import nothing else of the project"
    assert not edges["runtime"] & {"train", "recipes", "eval"}, "the runtime knows nothing of losses or recipes"
    assert not edges["train"] & {"runtime", "recipes", "eval"}, "training knows nothing of cells or recipes"
    assert not edges["envs"] & {"eval", "rollout", "policies", "runtime", "train", "recipes"}


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_untyped_configs():
    offenders = [
        f"{f.relative_to(SRC)}:{i}"
        for f in SRC.rglob("*.py")
        if "data" not in f.relative_to(SRC).parts
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if "cfg: Any" in line
    ]
    assert offenders == []
