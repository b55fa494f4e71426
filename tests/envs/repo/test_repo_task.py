"""Task loading: the pack format, NL2Repo-Bench's layout, and clear errors for bad tasks."""

from __future__ import annotations

import pytest

from evoharness.envs.repo.task import TaskFormatError, load_task, load_tasks

TOML = """id = "t1"
title = "A task"
difficulty = "easy"
n_tests = 3
max_tool_calls = 10
wall_time_s = 60
test_timeout_s = 30
"""


def make_task(d, toml=TOML, spec="# T\n"):
    d.mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    if spec is not None:
        (d / "spec.md").write_text(spec)
    return d


def test_pack_loads_with_specs_references_and_tests(pack):
    for t in pack.values():
        assert t.layout == "pack" and t.spec.strip() and t.n_tests > 0
        assert t.reference_files() and t.has_tests


def test_pack_task_fields(tmp_path):
    d = make_task(tmp_path / "t1")
    (d / "reference" / "pkg").mkdir(parents=True)
    (d / "reference" / "pkg" / "__init__.py").write_text("X = 1\n")
    t = load_task(d)
    assert (t.task_id, t.n_tests, t.max_tool_calls, t.wall_time_s, t.test_timeout_s) == ("t1", 3, 10, 60.0, 30.0)
    assert t.reference_files() == {"pkg/__init__.py": "X = 1\n"} and not t.has_tests
    assert [x.task_id for x in load_tasks(tmp_path)] == ["t1"] and load_tasks(d)[0].task_id == "t1"


@pytest.mark.parametrize(
    "toml,spec,match",
    [
        (TOML.replace("n_tests = 3", 'n_tests = "3"'), "# T", "'n_tests' must be int"),
        (TOML.replace("n_tests = 3\n", ""), "# T", "missing key 'n_tests'"),
        (TOML.replace('"easy"', '"trivial"'), "# T", "difficulty must be one of"),
        (TOML.replace("n_tests = 3", "n_tests = 0"), "# T", "'n_tests' must be > 0"),
        (TOML + "oops = [", "# T", "not valid TOML"),
        (TOML, None, "spec.md missing"),
    ],
)
def test_bad_pack_tasks_are_named_errors(tmp_path, toml, spec, match):
    with pytest.raises(TaskFormatError, match=match):
        load_task(make_task(tmp_path / "t", toml, spec))


def test_paths_without_tasks_and_duplicates(tmp_path):
    with pytest.raises(TaskFormatError, match="not found"):
        load_tasks(tmp_path / "missing")
    with pytest.raises(TaskFormatError, match="no task directories"):
        load_tasks(tmp_path)
    make_task(tmp_path / "a")
    make_task(tmp_path / "b")
    with pytest.raises(TaskFormatError, match="duplicate task ids"):
        load_tasks(tmp_path)


def test_nl2repo_layout_errors(tmp_path):
    d = tmp_path / "lib"
    d.mkdir()
    (d / "start.md").write_text("# lib\n")
    (d / "test_case_count.txt").write_text("12")
    (d / "test_files.json").write_text('["../outside"]')
    with pytest.raises(TaskFormatError, match="relative to the workspace root"):
        load_task(d)
    (d / "test_files.json").write_text('["tests"]')
    t = load_task(d)
    assert (t.layout, t.n_tests, t.has_tests, t.difficulty) == ("nl2repo", 12, False, "nl2repo")
