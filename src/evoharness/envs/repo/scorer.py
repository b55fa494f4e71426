"""Score a workspace with the task's hidden tests: reward = passed / n_tests (partial scoring).

The hidden suite never exists in the agent's sandbox. At scoring, a fresh
sandbox runs pytest over a *copy* of the workspace (symlinks copied as links,
special files skipped), with the suite mounted read-only at ``/score/tests``
(pack layout; ``-c /score/pytest.ini --rootdir /score``, so the agent's own
``conftest.py``/``pytest.ini`` cannot reconfigure the run) or copied over the
copy at its upstream paths (NL2Repo layout). The workspace root is cwd and on
``sys.path`` (after pytest and the plugin are imported, in isolated mode, so
the agent's ``sitecustomize.py`` or a ``pytest.py`` of its own change nothing).

A small pytest plugin (``evo_score_plugin``) appends one JSON line per test
report to a results file as the run goes, so a run that the agent's code kills
half-way still counts the tests that passed before, and bounds each test's
call phase (``per_test_timeout_s``: a hanging test fails, the run goes on).

Outcomes go through `rollout.scoring.score_with_retry`:

- ``NothingToEvaluate`` (placeholder 0): the workspace has no files, or the
  task ships no hidden tests (NL2Repo-Bench's are not public).
- ``EvaluationError`` (retried, then dropped): the sandbox failed to start,
  the whole run hit ``test_timeout_s`` (scorer timeout), pytest reported an
  internal or usage error (exit 3/4), or the plugin never started.
- anything else is scored, a legitimate 0 included (the agent's package fails
  to import: collection errors, no passes).

The plugin runs inside the same process as the agent's code; a policy that
tampers with pytest itself is outside what this scorer defends against.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from evoharness.envs.repo.sandbox import Limits, Sandbox, SandboxError
from evoharness.envs.repo.task import RepoTask
from evoharness.rollout.scoring import EvaluationError, NothingToEvaluate, ScoreOutcome, score_with_retry

PLUGIN = '''\
"""evoharness scoring plugin: one JSON line per report, flushed as the run goes."""
import json, os, signal, threading
import pytest

_OUT = open(os.environ["EVO_SCORE_RESULTS"], "a", buffering=1)
_PER_TEST = float(os.environ.get("EVO_PER_TEST_TIMEOUT", "0"))


def _emit(rec):
    _OUT.write(json.dumps(rec) + "\\n")
    _OUT.flush()


def pytest_sessionstart(session):
    _emit({"event": "start"})


def pytest_collectreport(report):
    if report.failed:
        _emit({"event": "collect_error", "nodeid": report.nodeid, "detail": str(report.longrepr)[-1500:]})


def pytest_collection_finish(session):
    _emit({"event": "collected", "n": len(session.items)})


def pytest_runtest_logreport(report):
    _emit({"event": "test", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus):
    _emit({"event": "finish", "exitstatus": int(exitstatus)})


class TestTimeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _PER_TEST <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    def on_alarm(signum, frame):
        raise TestTimeout(f"test exceeded {_PER_TEST:g} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, _PER_TEST)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
'''

# Runs as ``python -I -B /score/evo_run.py``: isolated mode keeps the workspace off sys.path
# while the interpreter starts (no sitecustomize/usercustomize of the agent's) and while
# pytest and the plugin are imported (no shadowing ``pytest.py``); then the workspace goes
# first on sys.path, where the tests import the agent's code from.
RUNNER = '''\
import sys
import pytest
sys.path.insert(0, "/score")
import evo_score_plugin
sys.path.insert(0, "/workspace")
sys.exit(pytest.main(sys.argv[1:], plugins=[evo_score_plugin]))
'''

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".git"}


def has_artifact(workspace: Path) -> bool:
    """True when `workspace` holds at least one regular file (caches aside)."""
    if not workspace.is_dir():
        return False
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        if any(os.path.isfile(os.path.join(dirpath, f)) and not os.path.islink(os.path.join(dirpath, f))
               for f in filenames):
            return True
    return False


def copy_workspace(src: Path, dst: Path) -> None:
    """Copy a workspace: symlinks as links (never followed), FIFOs/sockets/devices skipped."""
    def ignore(d: str, names: list[str]) -> set[str]:
        out = set()
        for n in names:
            try:
                mode = os.lstat(os.path.join(d, n)).st_mode
            except OSError:
                out.add(n)
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)) or n in _SKIP_DIRS:
                out.add(n)
        return out

    try:
        shutil.copytree(src, dst, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    except shutil.Error:
        pass  # unreadable entries are the agent's loss, not a scorer failure


def tally(results: Path, n_tests: int) -> dict[str, Any]:
    """Count passed tests from the plugin's JSONL (a test passes when its call
    phase passed and no phase failed)."""
    started = finished = False
    collected = None
    exitstatus = None
    phases: dict[str, dict[str, str]] = {}
    collect_errors: list[str] = []
    if results.is_file():
        for line in results.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run
            ev = rec.get("event")
            if ev == "start":
                started = True
            elif ev == "collected":
                collected = rec.get("n")
            elif ev == "collect_error":
                collect_errors.append(str(rec.get("nodeid")))
            elif ev == "test":
                phases.setdefault(str(rec.get("nodeid")), {})[str(rec.get("when"))] = str(rec.get("outcome"))
            elif ev == "finish":
                finished, exitstatus = True, rec.get("exitstatus")
    passed = sum(1 for p in phases.values() if p.get("call") == "passed" and "failed" not in p.values())
    return {"started": started, "finished": finished, "exitstatus": exitstatus, "collected": collected,
            "passed": passed, "failed": len(phases) - passed, "collect_errors": collect_errors[:20],
            "n_tests": n_tests}


def run_hidden_tests(task: RepoTask, workspace: Path, limits: Limits | None = None) -> dict[str, Any]:
    """One confined run of the hidden suite over a copy of `workspace`.

    Returns:
        The tally (``passed``, ``collected``, ``collect_errors``, ...) plus
        ``reward`` = min(passed, n_tests) / n_tests.

    Raises:
        NothingToEvaluate: no hidden tests, or an empty workspace.
        EvaluationError: sandbox failure, scorer timeout, pytest internal/usage error.
    """
    if not task.has_tests:
        raise NothingToEvaluate(f"task {task.task_id} ships no hidden tests")
    if not has_artifact(Path(workspace)):
        raise NothingToEvaluate("the workspace holds no files")
    tmp = Path(tempfile.mkdtemp(prefix=f"evo-score-{task.task_id}-"))
    try:
        ws, score, out = tmp / "workspace", tmp / "score", tmp / "out"
        copy_workspace(Path(workspace), ws)
        score.mkdir()
        out.mkdir()
        (score / "evo_score_plugin.py").write_text(PLUGIN)
        (score / "evo_run.py").write_text(RUNNER)
        (score / "pytest.ini").write_text("[pytest]\n")
        args = ["python", "-I", "-B", "/score/evo_run.py", "-q", "-p", "no:cacheprovider",
                "--continue-on-collection-errors", "-o", "addopts=", "--color=no"]
        if task.layout == "pack":
            shutil.copytree(task.tests_dir, score / "tests", ignore=shutil.ignore_patterns("__pycache__"))
            args += ["-c", "/score/pytest.ini", "--rootdir", "/score", "/score/tests"]
        else:
            for p in task.test_paths:
                dst = ws / p
                if dst.is_dir() and not dst.is_symlink():
                    shutil.rmtree(dst)
                elif dst.exists() or dst.is_symlink():
                    dst.unlink()
                dst.parent.mkdir(parents=True, exist_ok=True)
                src = task.tests_dir / p
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
            args += ["--rootdir", "/workspace", *task.test_paths]
        lim = limits or Limits(wall_s=task.test_timeout_s, cpu_s=int(task.test_timeout_s) + 5, output_bytes=8000)
        sandbox = Sandbox(ws, limits=lim, hidden=[str(task.root)])
        try:
            sandbox.own_tree(out)
            try:
                r = sandbox.run(args, extra_ro={str(score): "/score"}, extra_rw={str(out): "/out"},
                                env={"EVO_SCORE_RESULTS": "/out/results.jsonl",
                                     "EVO_PER_TEST_TIMEOUT": str(task.per_test_timeout_s)})
            except SandboxError as e:
                raise EvaluationError(f"sandbox failed: {e}") from e
        finally:
            sandbox.close()
        if r.timed_out:
            raise EvaluationError(f"scorer timeout: hidden suite ran past {lim.wall_s:g} s")
        t = tally(out / "results.jsonl", task.n_tests)
        if r.exit_code in (3, 4) or not t["started"]:
            raise EvaluationError(f"pytest failed to run (exit {r.exit_code}): {r.output[-1500:]}")
        t.update(reward=min(t["passed"], task.n_tests) / task.n_tests, exit_code=r.exit_code, killed=r.killed,
                 wall_s=r.wall_s)
        return t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def score_workspace(task: RepoTask, workspace: Path, budget: int = 3, limits: Limits | None = None) -> ScoreOutcome:
    """Partial score of `workspace` (see module docstring); the last run's tally is in ``detail``."""
    last: dict[str, Any] = {}

    def evaluate() -> float:
        last.clear()
        last.update(run_hidden_tests(task, workspace, limits))
        return last["reward"]

    outcome = score_with_retry(evaluate, budget)
    outcome.detail.update(last)
    return outcome
