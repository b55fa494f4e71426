"""Scoring on real pack tasks: partial credit, placeholders, retried evaluation faults, and
the check of every pack task (reference 1.0, empty workspace 0.0)."""

from __future__ import annotations

import dataclasses
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evoharness.envs.repo import scorer as scorer_mod
from evoharness.envs.repo.sandbox import SandboxError
from evoharness.envs.repo.scorer import score_workspace


def write_reference(task, ws: Path) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    for rel, text in task.reference_files().items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


def starting_workspace(task, ws: Path) -> Path:
    if task.workspace_dir is not None:
        shutil.copytree(task.workspace_dir, ws)
    else:
        ws.mkdir(parents=True)
    return ws


def test_every_pack_task_reference_scores_1_and_empty_scores_0(pack, tmp_path):
    tasks = list(pack.values())

    def check(task):
        ref = score_workspace(task, write_reference(task, tmp_path / task.task_id / "ref"), budget=1)
        (tmp_path / task.task_id / "empty").mkdir()
        empty = score_workspace(task, tmp_path / task.task_id / "empty", budget=1)
        start = (
            score_workspace(task, starting_workspace(task, tmp_path / task.task_id / "start"), budget=1)
            if task.workspace_dir
            else None
        )
        return task, ref, empty, start

    with ThreadPoolExecutor(4) as pool:
        for task, ref, empty, start in pool.map(check, tasks):
            assert (ref.status, ref.reward) == ("scored", 1.0), (task.task_id, ref.detail)
            assert ref.detail["collected"] == task.n_tests, (task.task_id, ref.detail)
            assert (empty.status, empty.reward) == ("placeholder", 0.0), (task.task_id, empty.detail)
            if start is not None:  # a starting workspace (e.g. code with bugs to fix) is scored, below 1
                assert start.status == "scored" and start.reward < 1.0, (task.task_id, start.detail)
    assert len(tasks) >= 20, f"the pack must hold at least 20 tasks, has {len(tasks)}"
    assert {t.difficulty for t in tasks} == {"easy", "medium", "hard"}


def test_partial_credit_counts_only_passing_tests(pack, tmp_path):
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(init.read_text() + "\n\ndef from_roman(s):\n    raise NotImplementedError\n")
    o = score_workspace(task, ws)
    assert o.status == "scored" and 0 < o.reward < 1
    assert o.reward == o.detail["passed"] / task.n_tests and o.detail["collected"] == task.n_tests


def test_agent_cannot_reconfigure_or_fake_the_run(pack, tmp_path):
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    (ws / "pytest.ini").write_text("[pytest]\naddopts = -k nothing_matches\n")
    (ws / "conftest.py").write_text(
        "import pytest\n@pytest.fixture(autouse=True)\ndef boom():\n    raise RuntimeError\n"
    )
    (ws / "results.jsonl").write_text('{"event": "test", "nodeid": "x", "when": "call", "outcome": "passed"}\n')
    (ws / "sitecustomize.py").write_text("import os\nos._exit(0)\n")  # would end python before pytest runs
    (ws / "pytest.py").write_text("raise SystemExit(0)\n")  # would shadow pytest
    assert score_workspace(task, ws).reward == 1.0


def test_hanging_test_fails_alone_and_the_run_goes_on(pack, tmp_path):
    task = dataclasses.replace(pack["roman_numerals"], per_test_timeout_s=0.5)
    ws = write_reference(task, tmp_path / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(init.read_text() + "\n\ndef is_roman(s):\n    while True:\n        pass\n")
    o = score_workspace(task, ws)
    assert o.status == "scored" and 0.5 < o.reward < 1 and o.detail["collected"] == task.n_tests


def test_agent_code_killing_pytest_keeps_earlier_passes(pack, tmp_path):
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(init.read_text() + "\n\ndef is_roman(s):\n    import os\n    os._exit(0)\n")
    o = score_workspace(task, ws)
    assert o.status == "scored" and 0 < o.reward < 1


def test_broken_package_is_a_legitimate_zero(pack, tmp_path):
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    next(ws.rglob("__init__.py")).write_text("syntax error here (\n")
    o = score_workspace(task, ws)
    assert (o.status, o.reward, o.attempts) == ("scored", 0.0, 1) and o.detail["collect_errors"]


def test_scorer_timeout_is_retried_then_dropped(pack, tmp_path, monkeypatch):
    """The harness itself stalls (its runner, before pytest starts): a scorer timeout."""
    task = dataclasses.replace(pack["roman_numerals"], test_timeout_s=2.0)
    ws = write_reference(task, tmp_path / "ws")
    monkeypatch.setattr(
        scorer_mod, "RUNNER", scorer_mod.RUNNER.replace("sys.exit(", "import time\ntime.sleep(60)\nsys.exit(")
    )
    o = score_workspace(task, ws, budget=2)
    assert (o.status, o.reward, o.attempts) == ("dropped", None, 2)
    assert all("scorer timeout" in e for e in o.detail["errors"])


def test_run_timeout_held_by_the_agents_code_is_scored_not_dropped(pack, tmp_path):
    """Past test_timeout_s because of the agent's code: a test stuck where no alarm reaches it
    (SIGALRM blocked), or a thread of its own keeping the process alive after the session
    finished. Both are scored on what passed, at the first attempt."""
    task = dataclasses.replace(pack["roman_numerals"], per_test_timeout_s=1.0, test_timeout_s=6.0)
    ws = write_reference(task, tmp_path / "blocked")
    init = next(ws.rglob("__init__.py"))
    init.write_text(
        init.read_text() + "\n\ndef is_roman(s):\n    import signal, time\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n    time.sleep(600)\n"
    )
    o = score_workspace(task, ws, budget=2)
    assert (o.status, o.attempts, o.detail["killed"]) == ("scored", 1, "wall_time") and o.reward < 1, o.detail
    ws = write_reference(task, tmp_path / "thread")
    init = next(ws.rglob("__init__.py"))
    init.write_text(
        init.read_text() + "\n\nimport threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\n"
    )
    o = score_workspace(task, ws, budget=2)
    assert (o.status, o.reward, o.attempts, o.detail["killed"]) == ("scored", 1.0, 1, "wall_time"), o.detail


def test_harness_fault_retried_within_budget(pack, tmp_path, monkeypatch):
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    real_run, fails = scorer_mod.Sandbox.run, []

    def flaky_run(self, *a, **kw):
        if not fails:
            fails.append(1)
            raise SandboxError("bwrap: Creating new namespace failed")
        return real_run(self, *a, **kw)

    monkeypatch.setattr(scorer_mod.Sandbox, "run", flaky_run)
    o = score_workspace(task, ws, budget=3)
    assert (o.status, o.reward, o.attempts) == ("scored", 1.0, 2)
    assert "sandbox failed" in o.detail["errors"][0]


def test_special_files_and_symlinks_in_workspace_do_not_hang_or_leak(pack, tmp_path):
    import os

    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    os.mkfifo(ws / "fifo")
    (ws / "leak").symlink_to(task.tests_dir)
    assert score_workspace(task, ws).reward == 1.0
    assert (ws / "leak").is_symlink()  # the agent's workspace itself is untouched


@pytest.fixture()
def nl2repo_task(tmp_path):
    """A task in NL2Repo-Bench's layout, with hidden tests under hidden/."""
    d = tmp_path / "tinylib"
    (d / "hidden" / "tests").mkdir(parents=True)
    (d / "start.md").write_text("## Introduction of tinylib\n\nBuild `tinylib` with add(a, b) and sub(a, b).\n")
    (d / "test_case_count.txt").write_text("3")
    (d / "test_commands.json").write_text('["pip install -e .", "pytest --continue-on-collection-errors tests"]')
    (d / "test_files.json").write_text('["tests"]')
    (d / "hidden" / "tests" / "test_tiny.py").write_text(
        "from tinylib import add, sub\n\ndef test_add():\n    assert add(1, 2) == 3\n\n"
        "def test_add_neg():\n    assert add(-1, -2) == -3\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
    )
    return d


def test_nl2repo_layout_scores_with_tests_and_placeholder_without(nl2repo_task, tmp_path):
    from evoharness.envs.repo.task import load_task

    task = load_task(nl2repo_task)
    assert (task.layout, task.n_tests, task.test_paths, task.title) == (
        "nl2repo",
        3,
        ("tests",),
        "Introduction of tinylib",
    )
    ws = tmp_path / "ws"
    (ws / "tinylib").mkdir(parents=True)
    (ws / "tinylib" / "__init__.py").write_text(
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a + b\n"
    )
    (ws / "tests").mkdir()
    (ws / "tests" / "test_mine.py").write_text("def test_fake():\n    pass\n")  # replaced by the hidden suite
    o = score_workspace(task, ws)
    assert o.status == "scored" and o.reward == pytest.approx(2 / 3)
    shutil.rmtree(nl2repo_task / "hidden")
    o = score_workspace(load_task(nl2repo_task), ws)
    assert o.status == "placeholder" and o.reward == 0.0 and "no hidden tests" in o.detail["reason"]


BROKEN_FROM_ROMAN = "\n\ndef from_roman(s):\n    raise NotImplementedError\n"


def test_agent_code_cannot_forge_passes_through_the_results_channel(pack, tmp_path):
    """The agent's package, imported into the scorer's process, writes well-formed pass
    records (hidden-suite node ids) to every fd it holds, the plugin's channel included:
    only the plugin's signed records count, so the score is that of the honest code."""
    task = pack["roman_numerals"]
    honest = write_reference(task, tmp_path / "honest")
    init = next(honest.rglob("__init__.py"))
    init.write_text(init.read_text() + BROKEN_FROM_ROMAN)
    expected = score_workspace(task, honest, budget=1)
    assert expected.status == "scored" and 0 < expected.reward < 1
    forger = write_reference(task, tmp_path / "forger")
    init = next(forger.rglob("__init__.py"))
    init.write_text(
        init.read_text()
        + BROKEN_FROM_ROMAN
        + (
            "\nimport json, os\n"
            "lines = ''.join(json.dumps({'event': 'test', 'nodeid': f'tests/test_romans.py::t{i}', 'when': 'call',\n"
            "                            'outcome': 'passed'}) + '\\n' for i in range(100)).encode()\n"
            "for fd in map(int, os.listdir('/proc/self/fd')):\n"
            "    try:\n"
            "        os.write(fd, lines)\n"
            "    except OSError:\n"
            "        pass\n"
        )
    )
    o = score_workspace(task, forger, budget=1)
    assert (o.status, o.reward, o.detail["passed"]) == ("scored", expected.reward, expected.detail["passed"])


def test_workspace_pytest_entry_point_plugin_is_not_loaded(pack, tmp_path):
    """A pytest11 entry point shipped in the workspace would turn every report into a pass."""
    task = pack["roman_numerals"]
    ws = write_reference(task, tmp_path / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(init.read_text() + BROKEN_FROM_ROMAN)
    dist = ws / "evil-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nevil = evil_plugin\n")
    (ws / "evil_plugin.py").write_text(
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    out = yield\n    out.get_result().outcome = 'passed'\n"
    )
    o = score_workspace(task, ws, budget=1)
    assert o.status == "scored" and 0 < o.reward < 1


def test_agent_code_cannot_turn_its_score_into_a_dropped_evaluation(pack, tmp_path):
    """Dropped executions leave the batch unpunished, so nothing the agent's code does may
    produce one: exiting with pytest's internal-error code, or hanging at import (a module
    import is bounded like a test), is a legitimate 0, scored at the first attempt."""
    task = dataclasses.replace(pack["roman_numerals"], per_test_timeout_s=1.0, test_timeout_s=60.0)
    for name, code in (("exit3", "import os\nos._exit(3)\n"), ("hang", "while True:\n    pass\n")):
        ws = write_reference(task, tmp_path / name)
        next(ws.rglob("__init__.py")).write_text(code)
        o = score_workspace(task, ws, budget=2)
        assert (o.status, o.reward, o.attempts) == ("scored", 0.0, 1), (name, o.detail)


def test_hang_that_swallows_exceptions_still_fails_alone(pack, tmp_path):
    task = dataclasses.replace(pack["roman_numerals"], per_test_timeout_s=1.0)
    ws = write_reference(task, tmp_path / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(
        init.read_text() + "\n\ndef is_roman(s):\n    import time\n    while True:\n        try:\n"
        "            time.sleep(10)\n        except Exception:\n            pass\n"
    )
    o = score_workspace(task, ws, budget=1)
    assert o.status == "scored" and 0.5 < o.reward < 1 and o.detail["collected"] == task.n_tests


def test_understated_n_tests_cannot_inflate_the_score(pack, tmp_path):
    """A task.toml whose n_tests is below what the suite collects would let 5 passes of 53
    score 1.0; the collected count grows the denominator."""
    task = dataclasses.replace(pack["roman_numerals"], n_tests=5)
    ws = write_reference(task, tmp_path / "ws")
    init = next(ws.rglob("__init__.py"))
    init.write_text(init.read_text() + BROKEN_FROM_ROMAN)
    o = score_workspace(task, ws, budget=1)
    n = pack["roman_numerals"].n_tests
    assert o.detail["collected"] == n and o.reward == pytest.approx(o.detail["passed"] / n) and o.reward < 1
