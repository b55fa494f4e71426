"""Tools: schemas, file round trips, errors the agent sees, paths that try to leave."""

from __future__ import annotations

import json

from evoharness.envs.repo.tools import TOOLS, tool_schemas


def test_schemas_are_openai_function_tools():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOLS)
    ws = next(s for s in schemas if s["function"]["name"] == "write_file")["function"]
    assert ws["parameters"]["required"] == ["path", "content"] and ws["parameters"]["additionalProperties"] is False
    json.dumps(schemas)


def test_write_read_edit_list_and_shell_see_the_same_files(toolbox):
    assert not toolbox.call("write_file", {"path": "pkg/mod.py", "content": "X = 1\nY = 2\n"}).is_error
    r = toolbox.call("read_file", json.dumps({"path": "/workspace/pkg/mod.py"}))
    assert r.content == "     1\tX = 1\n     2\tY = 2"
    assert not toolbox.call("edit_file", {"path": "pkg/mod.py", "old_str": "Y = 2", "new_str": "Y = 3"}).is_error
    r = toolbox.call("run_shell", {"command": "cd /workspace && python -c 'import pkg.mod as m; print(m.X + m.Y)'"})
    assert r.exit_code == 0 and r.content.endswith("4\n")
    r = toolbox.call("run_shell", {"command": "echo 'Z = 5' >> pkg/mod.py"})  # the sandbox may edit host-written files
    assert r.exit_code == 0, r.content
    assert "Z = 5" in toolbox.call("read_file", {"path": "pkg/mod.py"}).content
    assert toolbox.call("list_dir", {}).content == "pkg/\n  mod.py  (18 B)"


def test_edit_needs_exactly_one_occurrence(toolbox):
    toolbox.call("write_file", {"path": "a.py", "content": "x = 1\nx = 1\n"})
    assert "occurs 2 times" in toolbox.call("edit_file", {"path": "a.py", "old_str": "x = 1", "new_str": "y"}).content
    assert "occurs 0 times" in toolbox.call("edit_file", {"path": "a.py", "old_str": "zz", "new_str": "y"}).content


def test_malformed_arguments_are_tool_errors_not_crashes(toolbox):
    cases = [
        ("write_file", '{"path": "a.py", "content": '),
        ("write_file", '{"path": "a.py"}'),
        ("read_file", '{"path": 3}'),
        ("read_file", '["a.py"]'),
        ("list_dir", '{"depth": 99}'),
        ("run_shell", '{"command": "ls", "sudo": true}'),
        ("rm_rf", "{}"),
        ("read_file", None),
        ("read_file", '{"path": ""}'),
        ("read_file", '{"path": "nope.py"}'),
        ("list_dir", '{"path": "nope"}'),
    ]
    for name, args in cases:
        r = toolbox.call(name, args)
        assert r.is_error and r.content.startswith("error: "), (name, args, r.content)
    assert "not valid JSON" in toolbox.call("write_file", '{"path": ').content
    assert "unknown tool 'rm_rf'" in toolbox.call("rm_rf", "{}").content


def test_paths_and_symlinks_cannot_lead_out(toolbox, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    # a value no path can contain (pytest's tmp directories are numbered: "pytest-422" held "42")
    (secret / "answer.txt").write_text("SECRET-c0ffee")
    r = toolbox.call("run_shell", {"command": f"ln -s {secret} s && ln -s /etc/passwd p && ln -s .. up && ls"})
    assert r.exit_code == 0
    for path in (
        "s/answer.txt",
        "p",
        "up/secret/answer.txt",
        "../secret/answer.txt",
        str(secret / "answer.txt"),
        "/etc/passwd",
    ):
        r = toolbox.call("read_file", {"path": path})
        assert r.is_error and "SECRET-c0ffee" not in r.content and "root:" not in r.content, path
    r = toolbox.call("write_file", {"path": "s/answer.txt", "content": "pwned"})
    assert r.is_error and (secret / "answer.txt").read_text() == "SECRET-c0ffee"
    assert "s -> " in toolbox.call("list_dir", {}).content


def test_long_outputs_carry_a_visible_marker(toolbox):
    toolbox.call("write_file", {"path": "big.txt", "content": "\n".join(f"line {i}" for i in range(5000))})
    r = toolbox.call("read_file", {"path": "big.txt", "limit": 5000})
    assert "characters truncated" in r.content and len(r.content) < 2200
    r = toolbox.call("read_file", {"path": "big.txt", "offset": 4999, "limit": 1})
    assert r.content == "  4999\tline 4998\n[... 1 more lines; read with offset=5000 ...]"
    r = toolbox.call("run_shell", {"command": "seq 1 100000"})
    assert "truncated" in r.content and r.content.rstrip().endswith("100000")


def test_shell_timeout_is_reported(toolbox):
    r = toolbox.call("run_shell", {"command": "sleep 30", "timeout_s": 1})
    assert "[killed: wall-time limit of 1 s]" in r.content and r.seconds < 10


def test_writing_to_a_fifo_the_agent_made_does_not_block_the_host(toolbox):
    import threading

    assert toolbox.call("run_shell", {"command": "mkfifo pipe"}).exit_code == 0
    out = {}
    for name, args in (
        ("write_file", {"path": "pipe", "content": "x"}),
        ("edit_file", {"path": "pipe", "old_str": "x", "new_str": "y"}),
        ("read_file", {"path": "pipe"}),
    ):
        t = threading.Thread(target=lambda n=name, a=args: out.update({n: toolbox.call(n, a)}), daemon=True)
        t.start()
        t.join(10)
        assert name in out, f"{name} on a FIFO blocked"
        assert out[name].is_error and "not a regular file" in out[name].content


def test_write_file_respects_the_workspace_bounds(tmp_path):
    """The file tools write on the host, outside any watchdog: they check the bounds themselves."""
    from evoharness.envs.repo.sandbox import Limits, Sandbox
    from evoharness.envs.repo.tools import ToolBox

    with Sandbox(tmp_path / "ws", limits=Limits(disk_mb=1, max_files=5)) as sb:
        tb = ToolBox(sb)
        for i in range(4):
            assert not tb.call("write_file", {"path": f"f{i}", "content": "x"}).is_error
        r = tb.call("write_file", {"path": "d/e/f", "content": "x"})  # 3 new entries: 7 > 5
        assert r.is_error and "limit of 5 entries" in r.content
        assert not tb.call("write_file", {"path": "f4", "content": "x"}).is_error
        for path in ("f5", "d/e/f"):
            r = tb.call("write_file", {"path": path, "content": "x"})
            assert r.is_error and "limit of 5 entries" in r.content
        assert sorted(q.name for q in sb.workspace.iterdir()) == [f"f{i}" for i in range(5)]
        assert not tb.call("write_file", {"path": "f0", "content": "y" * 1_000_000}).is_error  # rewriting is fine
        r = tb.call("write_file", {"path": "f1", "content": "z" * 100_000})
        assert r.is_error and "disk limit" in r.content and (sb.workspace / "f1").read_text() == "x"
        r = tb.call("edit_file", {"path": "f1", "old_str": "x", "new_str": "z" * 100_000})
        assert r.is_error and "disk limit" in r.content and (sb.workspace / "f1").read_text() == "x"
