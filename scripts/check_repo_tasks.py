"""Check the repository task pack: every reference solution passes its hidden suite in full,
``n_tests`` in task.toml equals what pytest collects, an empty workspace scores 0 and a
starting workspace (where a task has one) scores below 1.

Plain pytest in temporary directories, no sandbox: this checks the *tasks*, not the
environment. Usage::

    python scripts/check_repo_tasks.py [PACK_DIR] [--task ID ...] [--jobs N]

Prints one row per task and exits 1 if any task fails a check.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PACK = Path(__file__).resolve().parents[1] / "src" / "evoharness" / "data" / "repo_tasks"
REQUIRED = {
    "id": str,
    "title": str,
    "difficulty": str,
    "n_tests": int,
    "max_tool_calls": int,
    "wall_time_s": int,
    "test_timeout_s": int,
}
DIFFICULTIES = ("easy", "medium", "hard")
HIDDEN_DIR = "_hidden_tests"  # where the suite goes inside the scored copy of the workspace


@dataclass
class RunResult:
    collected: int  # test cases in the report (passed + failed + errors + skipped)
    passed: int


def run_suite(workspace: Path, tests: Path, timeout_s: float) -> RunResult:
    """Copy ``tests`` into ``workspace/_hidden_tests`` and run pytest there, the workspace as cwd.

    ``python -m pytest`` puts the cwd (the workspace root) first on sys.path, so the suite imports
    the package by name. Workspace configuration is ignored (``--noconftest``, an empty ini file
    outside the workspace, ``--import-mode=importlib``), as a scorer must: the suites need none
    of it. Counts come from the JUnit XML report, so a module that fails to import counts as one
    error and no passes.
    """
    shutil.copytree(tests, workspace / HIDDEN_DIR)
    report, ini = workspace.parent / "report.xml", workspace.parent / "pytest.ini"
    ini.write_text("[pytest]\n")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-c",
        str(ini),
        "--rootdir",
        str(workspace),
        "--noconftest",
        "--import-mode=importlib",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        f"--junitxml={report}",
        HIDDEN_DIR,
    ]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True, timeout=timeout_s)
    if not report.exists():
        raise RuntimeError(
            f"pytest wrote no report (rc={proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    total = int(suite.get("tests", 0))
    bad = sum(int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    report.unlink()
    return RunResult(collected=total, passed=total - bad)


def score_dir(src: Path | None, tests: Path, timeout_s: float) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="repo_task_") as tmp:
        ws = Path(tmp) / "ws"
        if src is not None and src.is_dir():
            shutil.copytree(src, ws)
        else:
            ws.mkdir()
        return run_suite(ws, tests, timeout_s)


def check_task(task_dir: Path) -> dict:
    """All checks for one task directory; returns a table row with an ``ok`` flag and ``problems``."""
    problems: list[str] = []
    meta = tomllib.loads((task_dir / "task.toml").read_text())
    for key, typ in REQUIRED.items():
        if not isinstance(meta.get(key), typ):
            problems.append(f"task.toml: {key} missing or not {typ.__name__}")
    if meta.get("id") != task_dir.name:
        problems.append(f"id {meta.get('id')!r} != directory {task_dir.name!r}")
    if meta.get("difficulty") not in DIFFICULTIES:
        problems.append(f"difficulty {meta.get('difficulty')!r} not in {DIFFICULTIES}")
    for part in ("spec.md", "reference", "tests"):
        if not (task_dir / part).exists():
            problems.append(f"missing {part}")
    row = {"task": task_dir.name, "difficulty": meta.get("difficulty", "?"), "n_tests": meta.get("n_tests", 0)}
    if problems:
        return {**row, "ok": False, "problems": problems}
    timeout = float(meta["test_timeout_s"]) * 2
    ref_lines = sum(len(p.read_text().splitlines()) for p in (task_dir / "reference").rglob("*.py"))
    ref = score_dir(task_dir / "reference", task_dir / "tests", timeout)
    empty = score_dir(None, task_dir / "tests", timeout)
    start = (
        score_dir(task_dir / "workspace", task_dir / "tests", timeout) if (task_dir / "workspace").is_dir() else None
    )
    row.update(
        ref_lines=ref_lines,
        collected=ref.collected,
        ref=ref.passed / max(ref.collected, 1),
        empty=empty.passed / max(meta["n_tests"], 1),
        start=None if start is None else start.passed / max(meta["n_tests"], 1),
    )
    if ref.collected != meta["n_tests"]:
        problems.append(f"n_tests={meta['n_tests']} but pytest collects {ref.collected}")
    if not 10 <= ref.collected <= 60:
        problems.append(f"{ref.collected} tests, outside 10-60")
    if ref.passed != ref.collected:
        problems.append(f"reference passes {ref.passed}/{ref.collected}")
    if empty.passed != 0:
        problems.append(f"empty workspace passes {empty.passed}")
    if start is not None and start.passed >= meta["n_tests"]:
        problems.append("starting workspace already passes every test")
    return {**row, "ok": not problems, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pack", nargs="?", type=Path, default=PACK)
    ap.add_argument("--task", action="append", default=[], help="check only these task ids")
    ap.add_argument("--jobs", type=int, default=2, help="tasks checked in parallel")
    args = ap.parse_args(argv)
    dirs = sorted(d for d in args.pack.iterdir() if (d / "task.toml").exists())
    if args.task:
        dirs = [d for d in dirs if d.name in args.task]
    if not dirs:
        print(f"no tasks under {args.pack}", file=sys.stderr)
        return 1
    print("| task | difficulty | ref lines | n_tests | collected | reference | empty | start | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = 0
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        rows = list(pool.map(check_task, dirs))
    for r in rows:
        failed += not r["ok"]
        start = "-" if r.get("start") is None else f"{r['start']:.2f}"
        print(
            f"| {r['task']} | {r['difficulty']} | {r.get('ref_lines', '?')} | {r['n_tests']} | "
            f"{r.get('collected', '?')} "
            f"| {r.get('ref', 0):.2f} | {r.get('empty', 0):.2f} | {start} | {'yes' if r['ok'] else 'NO'} |",
            flush=True,
        )
        for p in r["problems"]:
            print(f"    {r['task']}: {p}", file=sys.stderr)
    counts = {
        k: sum(1 for d in dirs if tomllib.loads((d / "task.toml").read_text()).get("difficulty") == k)
        for k in DIFFICULTIES
    }
    print(
        f"\n{len(dirs)} tasks ({', '.join(f'{v} {k}' for k, v in counts.items())}); "
        f"{len(dirs) - failed} pass every check"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
