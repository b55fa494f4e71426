"""Repository-building tasks: a spec in, a repository out, a hidden test suite to score it.

Two on-disk layouts load into the same `RepoTask`:

The project's pack (``src/evoharness/data/repo_tasks/<task_id>/``)::

    task.toml      id, title, difficulty (easy|medium|hard), n_tests (the hidden suite's
                   test count: the score's denominator), max_tool_calls, wall_time_s,
                   test_timeout_s (the whole hidden run); optional per_test_timeout_s
    spec.md        the Markdown spec the agent gets
    reference/     the reference solution, paths relative to the workspace root
    tests/         the hidden pytest suite, run with the workspace root as cwd and on sys.path
    workspace/     optional starting workspace

NL2Repo-Bench's own layout (``start.md``, ``test_case_count.txt``,
``test_commands.json``, ``test_files.json``): the spec is ``start.md``, n_tests
the count file, and the hidden tests - not public upstream - are looked up under
``hidden/<path>`` for each path of ``test_files.json`` (placed at the same path
in the scored copy of the workspace, as upstream does). Without them the task
is playable but scores only a placeholder.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

PACK_DIR = Path(__file__).resolve().parents[2] / "data" / "repo_tasks"
DIFFICULTIES = ("easy", "medium", "hard")
_REQUIRED = {
    "id": str,
    "title": str,
    "difficulty": str,
    "n_tests": int,
    "max_tool_calls": int,
    "wall_time_s": int,
    "test_timeout_s": int,
}


class TaskFormatError(ValueError):
    """A task directory that cannot be loaded; the message names the file and the field."""


@dataclass(frozen=True)
class RepoTask:
    """One repository-building task.

    Attributes:
        task_id / title / difficulty: identity (difficulty ``nl2repo`` for that layout).
        spec: the Markdown specification shown to the agent.
        n_tests: hidden tests in the suite (reward = passed / n_tests).
        max_tool_calls / wall_time_s: the agent's budgets (calls, seconds).
        test_timeout_s: wall-clock bound of one hidden-suite run (seconds).
        per_test_timeout_s: bound of one test's call phase (seconds).
        root: the task directory.
        layout: ``pack`` or ``nl2repo``.
        reference_dir / workspace_dir: reference solution and starting workspace (None if absent).
        tests_dir: the hidden suite (pack: mounted apart from the workspace; nl2repo: the
            ``hidden/`` directory whose ``test_paths`` are copied into the workspace).
        test_paths: nl2repo only: the paths of ``test_files.json`` (pytest's arguments).
    """

    task_id: str
    title: str
    difficulty: str
    spec: str
    n_tests: int
    max_tool_calls: int
    wall_time_s: float
    test_timeout_s: float
    root: Path
    layout: Literal["pack", "nl2repo"] = "pack"
    per_test_timeout_s: float = 20.0
    reference_dir: Path | None = None
    workspace_dir: Path | None = None
    tests_dir: Path | None = None
    test_paths: tuple[str, ...] = field(default_factory=tuple)

    @property
    def has_tests(self) -> bool:
        """The hidden suite is present (pack: a ``test*.py`` under ``tests/``; nl2repo:
        every path of ``test_files.json`` under ``hidden/``); without it only a placeholder scores."""
        if self.tests_dir is None or not self.tests_dir.is_dir():
            return False
        if self.layout == "nl2repo":
            return all((self.tests_dir / p).exists() for p in self.test_paths)
        return any(self.tests_dir.rglob("test*.py"))

    def reference_files(self) -> dict[str, str]:
        """The reference solution: relative path -> text, in path order (empty if none)."""
        if self.reference_dir is None:
            return {}
        return {
            p.relative_to(self.reference_dir).as_posix(): p.read_text()
            for p in sorted(self.reference_dir.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }


def _opt_dir(p: Path) -> Path | None:
    return p if p.is_dir() else None


def _load_pack_task(d: Path) -> RepoTask:
    toml = d / "task.toml"
    try:
        meta = tomllib.loads(toml.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(f"{toml}: not valid TOML: {e}") from None
    for key, typ in _REQUIRED.items():
        if key not in meta:
            raise TaskFormatError(f"{toml}: missing key {key!r}")
        if not isinstance(meta[key], typ) or isinstance(meta[key], bool):
            raise TaskFormatError(f"{toml}: {key!r} must be {typ.__name__}, got {meta[key]!r}")
    if meta["difficulty"] not in DIFFICULTIES:
        raise TaskFormatError(f"{toml}: difficulty must be one of {DIFFICULTIES}, got {meta['difficulty']!r}")
    for key in ("n_tests", "max_tool_calls", "wall_time_s", "test_timeout_s"):
        if meta[key] <= 0:
            raise TaskFormatError(f"{toml}: {key!r} must be > 0")
    spec = d / "spec.md"
    if not spec.is_file():
        raise TaskFormatError(f"{d}: spec.md missing")
    return RepoTask(
        task_id=meta["id"],
        title=meta["title"],
        difficulty=meta["difficulty"],
        spec=spec.read_text(),
        n_tests=meta["n_tests"],
        max_tool_calls=meta["max_tool_calls"],
        wall_time_s=float(meta["wall_time_s"]),
        test_timeout_s=float(meta["test_timeout_s"]),
        root=d,
        layout="pack",
        per_test_timeout_s=float(meta.get("per_test_timeout_s", min(20.0, meta["test_timeout_s"]))),
        reference_dir=_opt_dir(d / "reference"),
        workspace_dir=_opt_dir(d / "workspace"),
        tests_dir=_opt_dir(d / "tests"),
    )


def _load_nl2repo_task(
    d: Path, max_tool_calls: int = 300, wall_time_s: float = 4 * 3600.0, test_timeout_s: float = 900.0
) -> RepoTask:
    try:
        n_tests = int((d / "test_case_count.txt").read_text().strip())
        test_paths = json.loads((d / "test_files.json").read_text())
    except (ValueError, OSError) as e:
        raise TaskFormatError(f"{d}: bad NL2Repo task files: {e}") from None
    if n_tests <= 0 or not isinstance(test_paths, list) or not all(isinstance(p, str) for p in test_paths):
        raise TaskFormatError(f"{d}: test_case_count.txt must be > 0 and test_files.json a list of paths")
    for p in test_paths:
        if p.startswith("/") or ".." in Path(p).parts:
            raise TaskFormatError(f"{d}: test path {p!r} must be relative to the workspace root")
    spec = (d / "start.md").read_text()
    m = re.search(r"^#+\s*(.+)$", spec, re.M)
    return RepoTask(
        task_id=d.name,
        title=m.group(1).strip() if m else d.name,
        difficulty="nl2repo",
        spec=spec,
        n_tests=n_tests,
        max_tool_calls=max_tool_calls,
        wall_time_s=wall_time_s,
        test_timeout_s=test_timeout_s,
        root=d,
        layout="nl2repo",
        per_test_timeout_s=60.0,
        workspace_dir=_opt_dir(d / "workspace"),
        tests_dir=_opt_dir(d / "hidden"),
        test_paths=tuple(test_paths),
    )


def is_task_dir(d: Path) -> bool:
    """`d` holds a task of either layout (``task.toml``, or ``start.md`` + ``test_case_count.txt``)."""
    return (d / "task.toml").is_file() or ((d / "start.md").is_file() and (d / "test_case_count.txt").is_file())


def load_task(path: str | Path) -> RepoTask:
    """Load one task directory of either layout.

    Raises:
        TaskFormatError: not a task directory, or a malformed one.
    """
    d = Path(path).resolve()
    if (d / "task.toml").is_file():
        return _load_pack_task(d)
    if (d / "start.md").is_file() and (d / "test_case_count.txt").is_file():
        return _load_nl2repo_task(d)
    raise TaskFormatError(f"{d}: not a task directory (needs task.toml, or start.md + test_case_count.txt)")


def load_tasks(where: str | Path = "pack") -> list[RepoTask]:
    """Tasks from ``pack`` (the bundled pack), a task directory, or a directory of
    task directories (sorted by directory name).

    Raises:
        TaskFormatError: nothing loadable there, a malformed task, or duplicate ids.
    """
    root = PACK_DIR if str(where) == "pack" else Path(where)
    if not root.is_dir():
        raise TaskFormatError(f"task path not found: {root}")
    if is_task_dir(root):
        return [load_task(root)]
    tasks = [load_task(d) for d in sorted(root.iterdir()) if d.is_dir() and is_task_dir(d)]
    if not tasks:
        raise TaskFormatError(f"{root}: no task directories inside")
    ids = [t.task_id for t in tasks]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise TaskFormatError(f"{root}: duplicate task ids {dup}")
    return tasks
