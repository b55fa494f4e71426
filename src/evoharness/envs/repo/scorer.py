"""Score a workspace with the task's hidden tests: reward = passed / n_tests (partial scoring).

The hidden suite never exists in the agent's sandbox. At scoring, a fresh
sandbox runs pytest over a *copy* of the workspace (symlinks copied as links,
special files skipped), with the suite mounted read-only at ``/score/tests``
(pack layout; ``-c /score/pytest.ini --rootdir /score``, so the agent's own
``conftest.py``/``pytest.ini`` cannot reconfigure the run) or copied over the
copy at its upstream paths (NL2Repo layout). The workspace root is cwd and on
``sys.path`` (after pytest and the plugin are imported, in isolated mode, so
the agent's ``sitecustomize.py`` or a ``pytest.py`` of its own change nothing).

A small pytest plugin (``evo_score_plugin``) writes one JSON line per test
report to a pipe the host reads as the run goes, so a run that the agent's code
kills half-way still counts the tests that passed before. The agent's code runs
in the same process and may write to that pipe too, so each line is signed with
a per-run key the plugin reads from a second inherited pipe before any of the
agent's code is imported; unsigned lines, and node ids outside the hidden suite,
are ignored. Each phase that runs the agent's code (a module's import, a test's
setup, call and teardown) is bounded by ``per_test_timeout_s``: a hang fails
that item and the run goes on.

Outcomes go through `envs.repo.scoring.score_with_retry`:

- ``NothingToEvaluate`` (placeholder 0): the workspace has no files, or the
  task ships no hidden tests (NL2Repo-Bench's are not public).
- ``EvaluationError`` (retried, then dropped), only for faults the agent's code
  cannot cause: the sandbox failed to start, the whole run hit
  ``test_timeout_s`` (scorer timeout) outside the agent's code (not inside a
  test or module import that never returned, not after the session finished),
  the plugin never started, pytest reported an internal error, or a usage
  error before the session began.
- anything else is scored, a legitimate 0 included (the agent's package fails
  to import, hangs at import, or ends the process: no passes).

Limits: the agent's code shares the process with pytest, so code written to
find the plugin in memory and patch it (or pytest) is not defended against;
in the NL2Repo layout the agent's root ``conftest.py`` is loaded, as upstream.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evoharness.envs.repo.sandbox import Limits, Sandbox, SandboxError
from evoharness.envs.repo.task import RepoTask
from evoharness.envs.repo.scoring import EvaluationError, NothingToEvaluate, ScoreOutcome, score_with_retry

PLUGIN = '''\
"""evoharness scoring plugin: one signed JSON line per report, written to an inherited pipe."""
import json, os, signal, sys, threading
import pytest

# The channel and its key arrive as inherited pipes (fd numbers in the environment, popped at
# once): the agent's code, imported later into this process, can write to the channel but
# has no key to sign with, so it can neither forge a pass nor hide the start of the run.
_OUT = os.fdopen(int(os.environ.pop("EVO_SCORE_FD")), "w", buffering=1)
with os.fdopen(int(os.environ.pop("EVO_SCORE_KEY_FD"))) as _f:
    _KEY = _f.read().strip()
_PER_TEST = float(os.environ.pop("EVO_PER_TEST_TIMEOUT", "0"))


def _emit(rec):
    try:
        _OUT.write(_KEY + " " + json.dumps(rec) + "\\n")
        _OUT.flush()
    except (OSError, ValueError):
        pass  # the agent's code closed the channel: only its own later results are lost


_emit({"event": "start"})  # before any code of the agent's exists in this process


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # only now: pytest has loaded its entry-point plugins, so none comes from the workspace
    sys.path.insert(0, "/workspace")


def pytest_sessionstart(session):
    _emit({"event": "session"})


def pytest_collectreport(report):
    if report.failed:
        _emit({"event": "collect_error", "nodeid": report.nodeid, "detail": str(report.longrepr)[-1500:]})


def pytest_collection_finish(session):
    _emit({"event": "collected", "n": len(session.items)})


def pytest_runtest_logstart(nodeid, location):
    _emit({"event": "enter", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    _emit({"event": "test", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus):
    _emit({"event": "finish", "exitstatus": int(exitstatus)})


class TestTimeout(BaseException):  # not an Exception: the agent's `except Exception` cannot swallow it
    pass


def _bounded():
    if _PER_TEST <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    def on_alarm(signum, frame):
        raise TestTimeout(f"exceeded {_PER_TEST:g} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, _PER_TEST)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# Each phase that runs the agent's code is bounded: importing a module (collection), a test's
# setup, call and teardown. A hang there is the agent's: that item fails, the run goes on.
@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    if isinstance(collector, pytest.Module):
        _emit({"event": "enter", "nodeid": collector.nodeid})
        yield from _bounded()
        _emit({"event": "left", "nodeid": collector.nodeid})
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _bounded()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _bounded()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _bounded()
'''

# Runs as ``python -I -B /score/evo_run.py``: isolated mode keeps the workspace off sys.path
# while the interpreter starts (no sitecustomize/usercustomize of the agent's), while pytest
# and the plugin are imported (no shadowing ``pytest.py``) and while pytest loads entry-point
# plugins; the plugin's ``pytest_configure`` then puts the workspace first on sys.path, where
# the tests import the agent's code from.
RUNNER = '''\
import sys
import pytest
sys.path.insert(0, "/score")
import evo_score_plugin
sys.exit(pytest.main(sys.argv[1:], plugins=[evo_score_plugin]))
'''

_MAX_RECORD = 1 << 16     # bytes of one signed line; longer ones are not the plugin's
_MAX_RECORDS = 200_000    # signed lines kept (a hidden suite reports 3 per test)


class _Channel:
    """Host end of the results pipe: reads it to EOF on a thread and keeps only the
    lines signed with this run's key (the agent's code may write to the pipe too)."""

    def __init__(self) -> None:
        self.key = secrets.token_hex(16)
        self.read_fd, self.write_fd = os.pipe()
        self.key_read_fd, key_write_fd = os.pipe()
        os.write(key_write_fd, self.key.encode())
        os.close(key_write_fd)
        self.records: list[str] = []
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    @property
    def fds(self) -> tuple[int, int]:
        return self.write_fd, self.key_read_fd

    def _pump(self) -> None:
        prefix, buf = (self.key + " ").encode(), b""
        with os.fdopen(self.read_fd, "rb", buffering=0) as f:
            while chunk := f.read(1 << 16):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    if ln.startswith(prefix) and len(self.records) < _MAX_RECORDS:
                        self.records.append(ln[len(prefix):].decode("utf-8", "replace"))
                if len(buf) > _MAX_RECORD:
                    buf = b"\xff"  # an endless line: drop it up to its newline (never a valid prefix)

    def close_child_ends(self) -> None:
        """Close the host's copies of the ends the sandbox inherited (after it started)."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def collect(self, timeout: float = 10.0) -> list[str]:
        """The signed records, once every writer is gone (the sandbox has ended)."""
        self._thread.join(timeout)
        return list(self.records)


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


def tally(records: Iterable[str], n_tests: int, suite: Iterable[str] = ()) -> dict[str, Any]:
    """Count passed tests from the plugin's signed records (JSON texts, key stripped).

    A test passes when its call phase passed and no phase failed. With `suite`
    (paths relative to pytest's rootdir), only node ids under those paths count.
    """
    started = finished = False
    collected = None
    exitstatus = None
    phases: dict[str, dict[str, str]] = {}
    collect_errors: list[str] = []
    session = False
    inside: str | None = None  # the test or module whose code was running when the records end
    prefixes = [p.rstrip("/") for p in suite]
    for line in records:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        ev = rec.get("event")
        if ev == "enter":
            inside = str(rec.get("nodeid"))
        elif ev == "left" or (ev == "test" and rec.get("when") == "teardown"):
            inside = None
        if ev == "start":
            started = True
        elif ev == "session":
            session = True
        elif ev == "collected":
            collected = rec.get("n")
        elif ev == "collect_error":
            collect_errors.append(str(rec.get("nodeid")))
        elif ev == "test":
            nodeid = str(rec.get("nodeid"))
            path = nodeid.split("::")[0]
            if prefixes and not any(path == p or path.startswith(p + "/") for p in prefixes):
                continue
            phases.setdefault(nodeid, {})[str(rec.get("when"))] = str(rec.get("outcome"))
        elif ev == "finish":
            finished, exitstatus = True, rec.get("exitstatus")
    passed = sum(1 for p in phases.values() if p.get("call") == "passed" and "failed" not in p.values())
    return {"started": started, "session": session, "finished": finished, "exitstatus": exitstatus,
            "inside": inside,
            "collected": collected,
            "passed": passed, "failed": len(phases) - passed, "collect_errors": collect_errors[:20],
            "n_tests": n_tests}


def run_hidden_tests(task: RepoTask, workspace: Path, limits: Limits | None = None) -> dict[str, Any]:
    """One confined run of the hidden suite over a copy of `workspace`.

    Returns:
        The tally (``passed``, ``collected``, ``collect_errors``, ...) plus
        ``reward`` = passed / ``denominator``: n_tests (pack: max(n_tests,
        collected), never fewer than the task declares nor than ran).

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
        ws, score = tmp / "workspace", tmp / "score"
        copy_workspace(Path(workspace), ws)
        score.mkdir()
        (score / "evo_score_plugin.py").write_text(PLUGIN)
        (score / "evo_run.py").write_text(RUNNER)
        (score / "pytest.ini").write_text("[pytest]\n")
        args = ["python", "-I", "-B", "/score/evo_run.py", "-q", "-p", "no:cacheprovider",
                "--continue-on-collection-errors", "-o", "addopts=", "--color=no"]
        if task.layout == "pack":
            shutil.copytree(task.tests_dir, score / "tests", ignore=shutil.ignore_patterns("__pycache__"))
            args += ["-c", "/score/pytest.ini", "--rootdir", "/score", "/score/tests"]
            suite: tuple[str, ...] = ("tests",)
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
            suite = task.test_paths
        lim = limits or Limits(wall_s=task.test_timeout_s, cpu_s=int(task.test_timeout_s) + 5, output_bytes=8000)
        sandbox = Sandbox(ws, limits=lim, hidden=[str(task.root)])
        channel = _Channel()
        try:
            try:
                r = sandbox.run(args, extra_ro={str(score): "/score"}, pass_fds=channel.fds,
                                env={"EVO_SCORE_FD": str(channel.write_fd), "EVO_SCORE_KEY_FD": str(channel.key_read_fd),
                                     "EVO_PER_TEST_TIMEOUT": str(task.per_test_timeout_s)})
            except SandboxError as e:
                raise EvaluationError(f"sandbox failed: {e}") from e
            finally:
                channel.close_child_ends()
        finally:
            sandbox.close()
        records = channel.collect()
        t = tally(records, task.n_tests, suite)
        # A run past test_timeout_s is the scorer's failure unless the agent's code held it: the
        # session had finished (a thread of the agent's kept the process alive), or the records
        # end inside a test or a module import (a hang no alarm broke: SIGALRM blocked, a C
        # loop). Those are scored on what passed.
        if r.timed_out and not (t["finished"] or t["inside"]):
            raise EvaluationError(f"scorer timeout: hidden suite ran past {lim.wall_s:g} s")
        # Only faults the agent's code cannot cause are evaluation errors: the plugin never
        # started (it starts before any of the agent's code is imported), pytest reported an
        # internal error, or a usage error before the session (the harness's arguments).
        # Anything the agent's code does - even os._exit(3) - is scored on what passed.
        if (not t["started"] or (t["finished"] and t["exitstatus"] == 3)
                or (r.exit_code == 4 and not t["session"])):
            raise EvaluationError(f"pytest failed to run (exit {r.exit_code}): {r.output[-1500:]}")
        # n_tests is the denominator (a collection error must not shrink it). In the pack, a suite
        # that collects more than task.toml declares grows it, so a stale n_tests cannot give 1.0
        # early; NL2Repo keeps upstream's pass rate over test_case_count.txt.
        collected = t["collected"] if isinstance(t["collected"], int) and task.layout == "pack" else 0
        denominator = max(task.n_tests, collected)
        t.update(reward=min(t["passed"], denominator) / denominator, denominator=denominator, exit_code=r.exit_code,
                 killed=r.killed, wall_s=r.wall_s)
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
