"""The agent loop end to end: a real OpenAI-compatible server on loopback driving the tools,
context compaction, budgets and stop reasons, an agent that sabotages itself, the trace the
simulator replays, and the CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.config.env import AgentConfig
from evoharness.envs.repo.policies import ChatReply, EmptyPolicy, OpenAIChatPolicy, ReferencePolicy, ToolCall
from evoharness.envs.repo.scaffold import run_repo_episode
from evoharness.envs.repo.trace import TraceWriter
from evoharness.runtime.workload import load_trace


class ScriptPolicy:
    """Replies with the i-th step's tool calls (i = assistant messages so far); the last step repeats."""

    name = "script"

    def __init__(self, steps):
        self.steps = steps

    def complete(self, messages, tools, *, execution_id, role, task):
        i = sum(m["role"] == "assistant" for m in messages)
        calls = self.steps[min(i, len(self.steps) - 1)]
        return ChatReply(
            tool_calls=[
                ToolCall(f"c{i}_{j}", n, a if isinstance(a, str) else json.dumps(a)) for j, (n, a) in enumerate(calls)
            ],
            prompt_tokens=100,
            completion_tokens=10,
        )

    def close(self):
        pass


def reference_steps(task):
    return [[("write_file", {"path": p, "content": c})] for p, c in task.reference_files().items()]


def test_openai_endpoint_episode_builds_the_repo_through_tool_calls(pack, tool_server, tmp_path):
    task = pack["roman_numerals"]
    script = [
        [("write_file", json.dumps({"path": p, "content": c})) for p, c in task.reference_files().items()],
        [("run_shell", json.dumps({"command": "python -c 'import romans; print(romans.to_roman(14))'"}))],
        [("finish", json.dumps({"summary": "done"}))],
    ]

    def reply(body, headers):
        i = sum(m["role"] == "assistant" for m in body["messages"])
        return {"content": f"step {i}", "tool_calls": script[i]}

    url, calls = tool_server(reply)
    policy = OpenAIChatPolicy(url, "m", max_retries=0)
    ep = run_repo_episode(task, policy, tmp_path, AgentConfig(), TraceWriter(tmp_path / "trace.jsonl"), "xid-1")
    assert (ep.stop_reason, ep.reward, ep.score_status, ep.passed) == ("finish", 1.0, "scored", task.n_tests)
    assert ep.model_calls == 3 and ep.tool_calls == len(script[0]) + 2 and ep.finish_summary == "done"
    assert all(h["x-execution-id"] == "xid-1" and h["x-agent-role"] == "main" for h, _ in calls)
    first, last = calls[0][1], calls[-1][1]
    assert [t["function"]["name"] for t in first["tools"]] == [
        "run_shell",
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "finish",
    ]
    assert first["messages"][0]["role"] == "system" and "roman" in first["messages"][1]["content"].lower()
    shell_out = [m for m in last["messages"] if m["role"] == "tool"][-1]["content"]
    assert shell_out == "exit code: 0\nXIV\n"
    assert ep.prompt_tokens == sum(sum(len(json.dumps(m)) for m in b["messages"]) // 4 for _, b in calls)
    execs = load_trace(tmp_path / "trace.jsonl")
    assert len(execs) == 1 and len(execs[0].prompt) == 3 and execs[0].tool_s[1] > 0


def test_compaction_summarises_and_continues(pack, tool_server, tmp_path):
    task = pack["roman_numerals"]
    ref = next(iter(task.reference_files().items()))

    def reply(body, headers):
        if headers["x-agent-role"] == "summary":
            assert "tools" not in body and "summary" in body["messages"][-1]["content"].lower()
            return {"content": f"SUMMARY-{sum(h['x-agent-role'] == 'summary' for h, _ in calls)}: wrote romans"}
        if "SUMMARY-2" in body["messages"][1]["content"]:
            return {"tool_calls": [("write_file", json.dumps({"path": ref[0], "content": ref[1]})), ("finish", "{}")]}
        return {"tool_calls": [("run_shell", json.dumps({"command": "seq 1 2000"}))]}

    url, calls = tool_server(reply)
    cfg = AgentConfig(context_window=2048, compact_at=0.5, output_chars=1500)
    ep = run_repo_episode(
        task, OpenAIChatPolicy(url, "m", max_retries=0), tmp_path, cfg, TraceWriter(tmp_path / "t.jsonl"), "xid-2"
    )
    assert ep.stop_reason == "finish" and ep.compactions == 2 and ep.reward == 1.0
    roles = [h["x-agent-role"] for h, _ in calls]
    assert roles.count("summary") == 2 and all(h["x-execution-id"] == "xid-2" for h, _ in calls)
    after = calls[roles.index("summary") + 1][1]["messages"]  # a fresh context: system + spec + summary
    assert len(after) == 2 and "SUMMARY-1" in after[1]["content"] and "# Specification" in after[1]["content"]
    assert [json.loads(x)["role"] for x in (tmp_path / "t.jsonl").read_text().splitlines()].count("summary") == 2
    segments = json.loads((tmp_path / "transcript.json").read_text())["segments"]
    assert [g["role"] for g in segments] == ["main", "summary", "main", "summary", "main"]
    assert segments[1]["content"].startswith("SUMMARY-1") and segments[-1]["messages"][-1]["role"] == "tool"


def test_context_length_error_triggers_compaction(pack, tool_server, tmp_path):
    task = pack["roman_numerals"]

    def reply(body, headers):
        if headers["x-agent-role"] == "summary":
            return {"content": "summary"}
        if len(body["messages"]) > 4:
            return (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.")
        if "summary" in body["messages"][1]["content"] and len(body["messages"]) == 2:
            return {"tool_calls": [("finish", "{}")]}
        return {"tool_calls": [("list_dir", "{}")]}

    url, calls = tool_server(reply)
    ep = run_repo_episode(task, OpenAIChatPolicy(url, "m", max_retries=0), tmp_path, AgentConfig())
    assert ep.stop_reason == "finish" and ep.compactions == 1


def test_endpoint_failure_is_a_stop_reason_not_a_crash(pack, tool_server, tmp_path):
    url, calls = tool_server(lambda body, headers: (500, "boom"))
    ep = run_repo_episode(pack["roman_numerals"], OpenAIChatPolicy(url, "m", max_retries=0), tmp_path)
    assert ep.stop_reason == "model_error" and "InternalServerError" in ep.error and len(calls) == 1
    assert (ep.score_status, ep.reward) == ("placeholder", 0.0)


def test_tool_budget_and_partial_score_at_the_limit(pack, tmp_path):
    task = pack["roman_numerals"]
    steps = reference_steps(task) + [[("run_shell", {"command": "true"}), ("run_shell", {"command": "true"})]]
    ep = run_repo_episode(task, ScriptPolicy(steps), tmp_path, AgentConfig(max_tool_calls=5))
    assert ep.stop_reason == "tool_budget" and ep.tool_calls == 5 and ep.reward == 1.0


def test_wall_time_budget(pack, tmp_path):
    task = pack["roman_numerals"]
    ep = run_repo_episode(
        task, ScriptPolicy([[("run_shell", {"command": "sleep 0.5"})]]), tmp_path, AgentConfig(wall_time_s=1.5)
    )
    assert ep.stop_reason == "wall_time" and 2 <= ep.tool_calls <= 4 and ep.wall_s < 10


def test_replies_without_tool_calls_end_the_episode(pack, tmp_path):
    class Chatty(ScriptPolicy):
        def complete(self, messages, tools, **kw):
            return ChatReply(content="I think I will write the code now.")

    ep = run_repo_episode(pack["roman_numerals"], Chatty([]), tmp_path, AgentConfig(max_no_tool_replies=3))
    assert ep.stop_reason == "no_tool_call" and ep.model_calls == 3 and ep.tool_calls == 0


def test_finish_before_any_work_scores_a_placeholder(pack, tmp_path):
    ep = run_repo_episode(pack["roman_numerals"], EmptyPolicy(), tmp_path)
    assert (ep.stop_reason, ep.tool_calls, ep.score_status, ep.reward) == ("finish", 1, "placeholder", 0.0)


def test_agent_deleting_its_own_workspace_is_contained_and_scored(pack, tmp_path):
    task = pack["roman_numerals"]
    (tmp_path / "neighbour.txt").write_text("keep me")
    steps = reference_steps(task) + [
        [
            (
                "run_shell",
                {
                    "command": "rm -rf /workspace/* /workspace/.[!.]* /workspace; rm -rf / 2>/dev/null; "
                    "ls -A /workspace | wc -l"
                },
            )
        ],
        [("list_dir", {}), ("write_file", {"path": "notes.txt", "content": "started over"})],
        [("finish", {})],
    ]
    ep = run_repo_episode(task, ScriptPolicy(steps), tmp_path, AgentConfig(keep_workspace=True))
    assert ep.stop_reason == "finish" and ep.tool_errors == 0
    assert (tmp_path / "neighbour.txt").read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "workspace").iterdir()) == ["notes.txt"]
    assert (ep.score_status, ep.reward) == ("scored", 0.0)  # evaluated: the tests cannot import romans


def test_reference_policy_replays_the_solution(pack, tmp_path):
    ep = run_repo_episode(pack["stats_fix"], ReferencePolicy(), tmp_path)
    assert ep.stop_reason == "finish" and ep.reward == 1.0 and ep.tool_counts["write_file"] >= 1


def test_cli_eval_repo_writes_report_plot_trace_and_resumes(pack, tmp_path):
    out = tmp_path / "out"
    args = [
        "eval",
        "--env",
        "repo",
        "--tasks",
        str(pack["roman_numerals"].root),
        "--policy",
        "reference",
        "--out",
        str(out),
        "--workers",
        "1",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "| roman_numerals | easy | 1.000 |" in r.output and "report:" in r.output
    for f in ("report.md", "scores.png", "summary.json", "episodes.jsonl", "trace.jsonl"):
        assert (out / f).stat().st_size > 0, f
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["mean_score"] == 1.0 and summary["scoring"]["score/scored"] == 1
    n_trace = len((out / "trace.jsonl").read_text().splitlines())
    assert len(load_trace(out / "trace.jsonl")) == 1
    r = CliRunner().invoke(app, ["simulate", "--workload", str(out / "trace.jsonl"), "--policies", "colocate"])
    assert r.exit_code == 0 and "| colocate |" in r.output, r.output
    r = CliRunner().invoke(app, args)  # resumes: nothing replayed
    assert r.exit_code == 0 and len((out / "trace.jsonl").read_text().splitlines()) == n_trace
    r = CliRunner().invoke(app, ["eval", "--env", "repo", "--split", "valid_seen"])
    assert r.exit_code == 2 and "only for --env alfworld" in r.output
    r = CliRunner().invoke(app, ["eval", "--env", "repo", "--tasks", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "task path not found" in r.output


def test_undecodable_names_and_lone_surrogates_do_not_end_the_episode(pack, tool_server, tmp_path):
    """A file name that is not UTF-8 (made in the shell) reaches the model through list_dir
    and the post-compaction file list; a lone surrogate in the model's JSON arguments reaches
    the tools. Either used to raise (the episode ended as model_error, or the eval crashed)."""
    task = pack["roman_numerals"]
    script = [
        [("run_shell", json.dumps({"command": "touch $'bad\\xff.py'"}))],
        [
            ("list_dir", json.dumps({})),
            ("write_file", '{"path": "a.py", "content": "x = \\"\\ud800\\""}'),
            ("run_shell", '{"command": "echo \\udcff"}'),
        ],
        [("finish", json.dumps({"summary": "done"}))],
    ]

    def reply(body, headers):
        i = sum(m["role"] == "assistant" for m in body["messages"])
        return {"content": None, "tool_calls": script[min(i, 2)]}

    url, calls = tool_server(reply)
    ep = run_repo_episode(task, OpenAIChatPolicy(url, "m", max_retries=0), tmp_path / "run", AgentConfig())
    assert (ep.stop_reason, ep.error, ep.model_calls) == ("finish", None, 3)
    results = [m["content"] for m in calls[-1][1]["messages"] if m["role"] == "tool"]
    assert "bad\ufffd.py" in results[1] and "not valid Unicode" in results[2] and "not valid Unicode" in results[3]


def test_a_shell_command_does_not_outlast_the_episode_wall_budget(pack, tmp_path):
    task = pack["roman_numerals"]
    policy = ScriptPolicy([[("run_shell", {"command": "sleep 60"})]])
    ep = run_repo_episode(task, policy, tmp_path, AgentConfig(wall_time_s=3, shell_timeout_s=120))
    assert ep.stop_reason == "wall_time" and ep.tool_calls == 1 and ep.wall_s < 10, (ep.stop_reason, ep.wall_s)


def test_one_execution_raising_loses_none_of_the_others(pack, tmp_path, monkeypatch):
    """A harness fault in one execution used to abort the loop at once while the pool ran the
    rest to completion and threw their results away; now they are saved, the error names the
    failed task, and a rerun retries only it."""
    import pytest

    from evoharness.eval import repo_eval as ev

    real = ev.run_repo_episode

    def flaky(task, *a, **kw):
        if task.task_id == "crockford_base32":
            raise OSError("disk full")
        return real(task, *a, **kw)

    monkeypatch.setattr(ev, "run_repo_episode", flaky)
    cfg = ev.RepoEvalConfig(
        repo={"tasks": "pack", "task_ids": ["argument_parser", "crockford_base32", "csv_dialect"]},
        workers=1,
        out_dir=str(tmp_path / "out"),
    )
    with pytest.raises(ev.RepoEvalError, match="1 of 3 executions failed.*crockford_base32: OSError: disk full"):
        ev.evaluate_repo(cfg, progress=False)
    saved = [json.loads(ln)["task_id"] for ln in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert saved == ["argument_parser", "csv_dialect"]
    monkeypatch.setattr(ev, "run_repo_episode", real)
    summary = ev.evaluate_repo(cfg, progress=False)
    assert [t["task_id"] for t in summary["tasks"]] == ["argument_parser", "crockford_base32", "csv_dialect"]
    assert summary["overall"]["mean_score"] == 1.0
