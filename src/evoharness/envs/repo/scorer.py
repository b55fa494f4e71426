"""Score a workspace with the task's hidden tests: reward = passed / n_tests (partial scoring).

The hidden suite never exists in the agent's sandbox. At scoring, a fresh
sandbox runs pytest over a *copy* of the workspace, made by `sandbox.copy_tree`
(links copied as links and never followed, special files skipped, bounded by
apparent size and entry count, iterative at any depth) onto a kernel-bounded
tmpfs (`sandbox.WorkspaceFS`, as root). The suite is mounted read-only: at
``/score/tests`` (pack layout; ``-c /score/pytest.ini --rootdir /score``, so the
agent's own ``conftest.py``/``pytest.ini`` cannot reconfigure the run) or over
the copy at its upstream paths (NL2Repo layout; every component of those paths
is made a real directory of the copy first, through directory descriptors, so
no link the agent planted leads a host operation or a mount out of the copy).
Nothing of the hidden suite can be patched on disk before it is collected. The
workspace root is cwd and on ``sys.path`` (after pytest and the plugin are
imported, in isolated mode, so the agent's ``sitecustomize.py`` or a
``pytest.py`` of its own change nothing).

A small pytest plugin (``evo_score_plugin``) writes one JSON line per event to
a pipe the host reads as the run goes, so a run that the agent's code kills
half-way still counts the tests that passed before. The agent's code runs in
the same process and may write to that pipe too, so each line is signed with a
per-run key the plugin reads from a second inherited pipe before any of the
agent's code is imported; unsigned lines are ignored. Only passes of node ids
that the plugin saw pytest collect from the hidden files count: a test
function whose code object comes from a hidden file (file name, name and line
of a ``def`` there). Before each test the plugin checks that the test's code
object, pytest's own run-and-report functions, and the set of plugins
implementing the hooks that decide an outcome are still those it saw before
the agent's code ran; a change (a test function emptied, ``pytest_pyfunc_call``
or ``pytest_runtest_makereport`` implemented by a workspace ``conftest.py``)
marks the run tampered, and a tampered run scores no pass. Each phase that runs
the agent's code (a module's import, a test's setup, call and teardown) is
bounded by ``per_test_timeout_s``: a hang fails that item and the run goes on.

Outcomes go through `envs.repo.scoring.score_with_retry`:

- ``NothingToEvaluate`` (placeholder 0): the workspace has no regular file, or
  the task ships no hidden tests (NL2Repo-Bench's are not public).
- ``EvaluationError`` (retried, then dropped) only on evidence of a scorer-side
  fault: the sandbox failed to start, or the plugin never started (it starts
  before any of the agent's code exists in the process), or the run ended
  abnormally (a timeout, a kill, pytest's internal or usage error, no session,
  no finish, ``pytest.exit``) *and* a control run of the same harness over an
  empty workspace fails too. When the control run is healthy, the abnormal
  end was the workspace's doing and the run is scored on what passed before it:
  a legitimate 0 or partial score, never a drop.
- anything else is scored, a legitimate 0 included (the agent's package fails
  to import, hangs at import, or ends the process: no passes).

Limits: the agent's code shares the process with pytest; code written to find
the run's key in memory, or to patch pytest in ways the checks above do not
look at, is not defended against (the checks make the cheap forgeries fail).
In the NL2Repo layout the agent's root ``conftest.py`` and ini file are loaded,
as upstream does; a broken one is a legitimate 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evoharness.envs.repo.sandbox import (
    WORKSPACE,
    Limits,
    Sandbox,
    SandboxError,
    WorkspaceFS,
    copy_tree,
    has_regular_file,
)
from evoharness.envs.repo.scoring import EvaluationError, NothingToEvaluate, ScoreOutcome, score_with_retry
from evoharness.envs.repo.task import PACK_DIR, RepoTask

PLUGIN = '''\
"""evoharness scoring plugin: one signed JSON line per event, written to an inherited pipe."""
import ast, inspect, json, os, signal, sys, threading
import pytest
import _pytest.python, _pytest.reports, _pytest.runner

# The channel and its key arrive as inherited pipes (fd numbers in the environment, popped at
# once): the agent's code, imported later into this process, can write to the channel but
# has no key to sign with, so it can neither forge a pass nor hide the start of the run.
_OUT = os.fdopen(int(os.environ.pop("EVO_SCORE_FD")), "w", buffering=1)
with os.fdopen(int(os.environ.pop("EVO_SCORE_KEY_FD"))) as _f:
    _KEY = _f.read().strip()
_PER_TEST = float(os.environ.pop("EVO_PER_TEST_TIMEOUT", "0"))
_SUITE = [p.rstrip("/") for p in json.loads(os.environ.pop("EVO_SUITE", "[]"))]
# Code that may decide outcomes: only these places are trusted (read-only mounts of the
# interpreter, the harness and the hidden suite), never the workspace.
_TRUSTED = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)} | {"/usr", "/score"})
_OUTCOME_HOOKS = ("pytest_pyfunc_call", "pytest_runtest_makereport", "pytest_runtest_call", "pytest_runtest_protocol",
                  "pytest_runtest_logreport", "pytest_report_teststatus")
# pytest's own run-and-report functions, as they are before any code of the agent's exists here
_INTERNALS = ((pytest.Function, "runtest"), (_pytest.python, "pytest_pyfunc_call"),
              (_pytest.runner, "call_and_report"), (_pytest.runner, "runtestprotocol"),
              (_pytest.runner.CallInfo, "from_call"), (_pytest.reports.TestReport, "from_item_and_call"),
              (_pytest.reports.BaseReport, "passed"))
_ORIGINAL = [inspect.getattr_static(o, n) for o, n in _INTERNALS]
_CODE = {}          # nodeid -> (function, its code object) at collection
_HOOK_IMPLS = None  # outcome hook -> implementations, once collection is done
_TAMPERED = []


def _emit(rec):
    try:
        _OUT.write(_KEY + " " + json.dumps(rec) + "\\n")
        _OUT.flush()
    except (OSError, ValueError):
        pass  # the agent's code closed the channel: only its own later results are lost


_emit({"event": "start"})  # before any code of the agent's exists in this process


def _under(path, roots):
    return any(path == r or path.startswith(r + "/") for r in roots)


_DEFS = {}


def _defs(path):
    """(name, line) of every def in a hidden file (the def's line and its decorators' lines)."""
    if path not in _DEFS:
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read())
            funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            _DEFS[path] = {(n.name, ln) for n in funcs for ln in (n.lineno, *(d.lineno for d in n.decorator_list))}
        except (OSError, SyntaxError, ValueError):
            _DEFS[path] = set()
    return _DEFS[path]


def _genuine(item):
    """The test function of `item` if pytest collected it from a hidden file, else None."""
    if not isinstance(item, pytest.Function) or not _under(str(getattr(item, "path", "")), _SUITE):
        return None
    fn = getattr(item, "function", None)
    code = getattr(fn, "__code__", None)
    if code is None or not _under(code.co_filename, _SUITE):
        return None
    return fn if (code.co_name, code.co_firstlineno) in _defs(code.co_filename) else None


def _impls(config):
    out = {}
    for name in _OUTCOME_HOOKS:
        impls = getattr(config.pluginmanager.hook, name).get_hookimpls()
        out[name] = tuple(getattr(i, "function", None) for i in impls)
    return out


def _foreign(fn):
    code = getattr(fn, "__code__", None)
    return code is None or not _under(os.path.realpath(code.co_filename), _TRUSTED + _SUITE)


def _check(item=None):
    """Record (once) why this run can no longer be trusted, if it cannot."""
    why = []
    for (o, n), orig in zip(_INTERNALS, _ORIGINAL):
        if inspect.getattr_static(o, n) is not orig:
            why.append(f"{getattr(o, '__name__', o)}.{n} replaced")
    if _HOOK_IMPLS is not None and item is not None:
        now = _impls(item.config)
        for name, fns in now.items():
            bad = [f for f in fns if _foreign(f)]
            if fns != _HOOK_IMPLS[name] or bad:
                why.append(f"{name} implemented outside the harness" if bad else f"{name} implementations changed")
    if item is not None and item.nodeid in _CODE:
        fn, code = _CODE[item.nodeid]
        if getattr(item, "function", None) is not fn or fn.__code__ is not code:
            why.append(f"test {item.nodeid} replaced")
    if why and not _TAMPERED:
        _TAMPERED.extend(why)
        _emit({"event": "tampered", "why": why[:5]})


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # only now: pytest has loaded its entry-point plugins, so none comes from the workspace
    sys.path.insert(0, "/workspace")


def pytest_sessionstart(session):
    _emit({"event": "session"})


def pytest_collectreport(report):
    if report.failed:
        _emit({"event": "collect_error", "nodeid": report.nodeid, "detail": str(report.longrepr)[-1500:]})


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    global _HOOK_IMPLS
    ids = []
    for item in session.items:
        fn = _genuine(item)
        if fn is not None and item.nodeid not in _CODE:
            _CODE[item.nodeid] = (fn, fn.__code__)
            ids.append(item.nodeid)
    _HOOK_IMPLS = _impls(session.config)
    for name, fns in _HOOK_IMPLS.items():
        if any(_foreign(f) for f in fns):
            _TAMPERED.append(f"{name} implemented outside the harness")
    if _TAMPERED:
        _emit({"event": "tampered", "why": _TAMPERED[:5]})
    _emit({"event": "collected", "n": len(ids), "items": len(session.items), "ids": ids})


def pytest_runtest_logstart(nodeid, location):
    _emit({"event": "enter", "nodeid": nodeid})


@pytest.hookimpl(tryfirst=True)
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


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    _check(item)
    yield from _bounded()
    _check(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _bounded()
    _check(item)
'''

# Runs as ``python -I -B /score/evo_run.py``: isolated mode keeps the workspace off sys.path
# while the interpreter starts (no sitecustomize/usercustomize of the agent's), while pytest
# and the plugin are imported (no shadowing ``pytest.py``) and while pytest loads entry-point
# plugins; the plugin's ``pytest_configure`` then puts the workspace first on sys.path, where
# the tests import the agent's code from.
RUNNER = """\
import sys
import pytest
sys.path.insert(0, "/score")
import evo_score_plugin
sys.exit(pytest.main(sys.argv[1:], plugins=[evo_score_plugin]))
"""


# `real()` of the pack's hidden suites (exact, genuine values; issue 49), placed beside each pack suite
STRICT_HELPER = PACK_DIR / "_strict.py"
_MAX_RECORD = 1 << 20  # bytes of one signed line (the collected ids of a big suite); longer ones are not the plugin's
_MAX_RECORDS = 200_000  # signed lines kept (a hidden suite reports 3 per test)
_ABNORMAL_CONTROL_S = 120.0  # a control run is bounded like the hidden run, at most this


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
                        self.records.append(ln[len(prefix) :].decode("utf-8", "replace"))
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


def has_artifact(workspace: Path) -> bool:
    """True when `workspace` holds at least one regular file (caches aside); links are not
    followed and any depth of nesting is walked (iteratively)."""
    return Path(workspace).is_dir() and has_regular_file(Path(workspace))


def copy_workspace(src: Path, dst: Path, limits: Limits | None = None) -> dict[str, Any]:
    """Copy a workspace for scoring (`sandbox.copy_tree`): links as links, special files
    skipped, at most ``limits.disk_mb`` MiB of apparent size and ``limits.max_files``
    entries, 64 levels deep; what is left out is the agent's loss, not a scorer failure.

    Returns:
        ``{"bytes", "entries", "skipped", "skipped_examples"}`` (bytes: apparent sizes).
    """
    lim = limits or Limits()
    Path(dst).mkdir(parents=True, exist_ok=True)
    rep = copy_tree(Path(src), Path(dst), lim.disk_mb << 20, lim.max_files, max_depth=64)
    return {"bytes": rep.bytes, "entries": rep.entries, "skipped": rep.skipped, "skipped_examples": rep.examples}


def place_mount_point(root: Path, rel: str, is_dir: bool) -> None:
    """Make ``root/rel`` an empty file or directory to mount a hidden test path on.

    Every existing component is opened with ``O_NOFOLLOW`` relative to its parent's
    descriptor; one that is not a real directory (a link the agent planted, a file)
    is removed and replaced, and whatever is at the last component is removed
    (``shutil.rmtree`` by descriptor, which never follows links). Nothing outside
    `root` is touched.

    Raises:
        ValueError: `rel` is absolute, empty, or has ``..`` / ``.`` components.
    """
    parts = [p for p in rel.split("/") if p]
    if rel.startswith("/") or not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"hidden test path {rel!r} must be relative, without '.' or '..'")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and (last or not (st.st_mode & 0o170000) == 0o040000):
                if (st.st_mode & 0o170000) == 0o040000:
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
                st = None
            if last:
                if is_dir:
                    os.mkdir(name, 0o755, dir_fd=fd)
                else:
                    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd))
                return
            if st is None:
                os.mkdir(name, 0o755, dir_fd=fd)
            nfd = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)


def tally(records: Iterable[str], n_tests: int, suite: Iterable[str] = ()) -> dict[str, Any]:
    """Count passed tests from the plugin's signed records (JSON texts, key stripped).

    A test passes when its call phase passed and no phase failed, and its node id
    is one the plugin saw pytest collect from the hidden files (the ``collected``
    record's ``ids``); a run marked ``tampered`` passes nothing. With `suite`
    (paths relative to pytest's rootdir), only node ids under those paths count.
    """
    started = finished = False
    collected = None
    genuine: set[str] | None = None
    exitstatus = None
    phases: dict[str, dict[str, str]] = {}
    collect_errors: list[str] = []
    session = False
    tampered: list[str] = []
    inside: str | None = None  # the test or module whose code was running when the records end
    prefixes = [p.rstrip("/") for p in suite]
    for line in records:
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
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
        elif ev == "collected" and genuine is None:
            collected = rec.get("n")
            genuine = {str(i) for i in rec.get("ids") or ()}
        elif ev == "collect_error":
            collect_errors.append(str(rec.get("nodeid")))
        elif ev == "tampered":
            tampered.extend(str(w) for w in rec.get("why") or ["unknown"])
        elif ev == "test":
            nodeid = str(rec.get("nodeid"))
            path = nodeid.split("::")[0]
            if prefixes and not any(path == p or path.startswith(p + "/") for p in prefixes):
                continue
            phases.setdefault(nodeid, {})[str(rec.get("when"))] = str(rec.get("outcome"))
        elif ev == "finish":
            finished, exitstatus = True, rec.get("exitstatus")
    ok = genuine or set()
    passed = (
        0
        if tampered
        else sum(
            1 for nid, p in phases.items() if nid in ok and p.get("call") == "passed" and "failed" not in p.values()
        )
    )
    return {
        "started": started,
        "session": session,
        "finished": finished,
        "exitstatus": exitstatus,
        "inside": inside,
        "collected": collected,
        "passed": passed,
        "failed": len(phases) - passed,
        "collect_errors": collect_errors[:20],
        "tampered": tampered[:5],
        "n_tests": n_tests,
    }


def _run_suite(task: RepoTask, workspace: Path | None, lim: Limits, tmp: Path) -> tuple[Any, dict[str, Any], dict]:
    """One confined pytest run of the hidden suite over a copy of `workspace` (None: an
    empty workspace, the control run) in `tmp`. Returns (RunResult, tally, copy report).

    Raises:
        EvaluationError: the sandbox failed to start.
    """
    ws, score = tmp / "workspace", tmp / "score"
    ws.mkdir()
    fs = WorkspaceFS(ws, lim.disk_mb + 16, lim.max_files + 1000) if WorkspaceFS.available() else None
    if fs is not None:
        fs.mount()
    try:
        copied = copy_workspace(workspace, ws, lim) if workspace is not None else {}
        score.mkdir()
        (score / "evo_score_plugin.py").write_text(PLUGIN)
        (score / "evo_run.py").write_text(RUNNER)
        (score / "pytest.ini").write_text("[pytest]\n")
        args = [
            "python",
            "-I",
            "-B",
            "/score/evo_run.py",
            "-q",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "-o",
            "addopts=",
            "--color=no",
        ]
        overlays: dict[str, str] = {}
        if task.layout == "pack":
            shutil.copytree(task.tests_dir, score / "tests", ignore=shutil.ignore_patterns("__pycache__"))
            if STRICT_HELPER.is_file() and not (score / "tests" / STRICT_HELPER.name).exists():
                shutil.copy(STRICT_HELPER, score / "tests" / STRICT_HELPER.name)
            args += ["-c", "/score/pytest.ini", "--rootdir", "/score", "/score/tests"]
            suite: tuple[str, ...] = ("tests",)
            suite_abs = ["/score/tests"]
        else:
            for p in task.test_paths:
                src = task.tests_dir / p
                place_mount_point(ws, p, src.is_dir())
                overlays[str(src)] = f"{WORKSPACE}/{p.strip('/')}"
            args += ["--rootdir", WORKSPACE, *task.test_paths]
            suite = task.test_paths
            suite_abs = list(overlays.values())
        sandbox = Sandbox(ws, limits=lim, hidden=[str(task.root)])
        channel = _Channel()
        try:
            try:
                r = sandbox.run(
                    args,
                    extra_ro={str(score): "/score"},
                    ro_overlays=overlays,
                    pass_fds=channel.fds,
                    env={
                        "EVO_SCORE_FD": str(channel.write_fd),
                        "EVO_SCORE_KEY_FD": str(channel.key_read_fd),
                        "EVO_PER_TEST_TIMEOUT": str(task.per_test_timeout_s),
                        "EVO_SUITE": json.dumps(suite_abs),
                    },
                )
            except SandboxError as e:
                raise EvaluationError(f"sandbox failed: {e}") from e
            finally:
                channel.close_child_ends()
        finally:
            sandbox.close()
        return r, tally(channel.collect(), task.n_tests, suite), copied
    finally:
        if fs is not None:
            fs.unmount()


def _abnormal(r, t: dict[str, Any]) -> str | None:
    """Why a run did not end as a pytest run ends on its own (None: it did)."""
    if r.killed:
        return f"killed ({r.killed})"
    if not t["session"]:
        return f"no session (exit {r.exit_code})"
    if not t["finished"]:
        return f"no finish (exit {r.exit_code})"
    if t["exitstatus"] not in (0, 1) or r.exit_code not in (0, 1):
        return f"exit status {t['exitstatus']} (process exit {r.exit_code})"
    return None


def run_hidden_tests(task: RepoTask, workspace: Path, limits: Limits | None = None) -> dict[str, Any]:
    """One confined run of the hidden suite over a copy of `workspace`.

    Returns:
        The tally (``passed``, ``collected``, ``collect_errors``, ``tampered``, ...)
        plus ``reward`` = passed / ``denominator``: n_tests (pack: max(n_tests,
        collected), never fewer than the task declares nor than ran), ``copy``
        (what the copy left out), and ``abnormal`` (why the run ended abnormally,
        with a healthy control run, else None).

    Raises:
        NothingToEvaluate: no hidden tests, or an empty workspace.
        EvaluationError: evidence of a scorer-side fault (see the module docstring).
    """
    if not task.has_tests:
        raise NothingToEvaluate(f"task {task.task_id} ships no hidden tests")
    if not has_artifact(Path(workspace)):
        raise NothingToEvaluate("the workspace holds no files")
    lim = limits or Limits(wall_s=task.test_timeout_s, cpu_s=int(task.test_timeout_s) + 5, output_bytes=8000)
    tmp = Path(tempfile.mkdtemp(prefix=f"evo-score-{task.task_id}-"))
    try:
        (tmp / "run").mkdir()
        r, t, copied = _run_suite(task, Path(workspace), lim, tmp / "run")
        # The plugin starts before any of the agent's code is imported: without its first record,
        # the harness itself failed.
        if not t["started"]:
            raise EvaluationError(f"the scoring plugin never started (exit {r.exit_code}): {r.output[-1500:]}")
        why = _abnormal(r, t)
        if why is not None:
            # Anything the agent's code does (pytest.exit, os._exit, a signal handler spinning between
            # tests, a broken conftest or ini) ends a run abnormally, and so does a broken harness. The
            # evidence: the same harness over an empty workspace. Healthy, the abnormal end was the
            # workspace's: scored on what passed. Broken too, the scorer is at fault.
            (tmp / "control").mkdir()
            clim = dataclasses.replace(lim, wall_s=min(lim.wall_s, _ABNORMAL_CONTROL_S))
            rc, tc, _ = _run_suite(task, None, clim, tmp / "control")
            healthy = (
                tc["started"] and tc["session"] and tc["finished"] and not rc.killed and rc.exit_code not in (3, 4)
            )
            if not healthy:
                kind = "scorer timeout" if r.timed_out else "pytest failed to run"
                raise EvaluationError(
                    f"{kind}: {why}; the control run over an empty workspace failed too "
                    f"({_abnormal(rc, tc)}, exit {rc.exit_code}): {r.output[-1000:]}"
                )
        # n_tests is the denominator (a collection error must not shrink it). In the pack, a suite
        # that collects more than task.toml declares grows it, so a stale n_tests cannot give 1.0
        # early; NL2Repo keeps upstream's pass rate over test_case_count.txt.
        collected = t["collected"] if isinstance(t["collected"], int) and task.layout == "pack" else 0
        denominator = max(task.n_tests, collected)
        t.update(
            reward=min(t["passed"], denominator) / denominator,
            denominator=denominator,
            exit_code=r.exit_code,
            killed=r.killed,
            wall_s=r.wall_s,
            abnormal=why,
            copy=copied,
        )
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
