"""The repository agent through the project's gateway (just a base URL): every model call,
summaries included, is recorded under its execution with its role, ready for trajectory trees."""

from __future__ import annotations

import json

from evoharness.config.env import AgentConfig
from evoharness.envs.repo.policies import OpenAIChatPolicy
from evoharness.envs.repo.scaffold import run_repo_episode
from evoharness.runtime.backends import HTTPBackend
from evoharness.runtime.gateway import Gateway, GatewayServer


def test_episode_through_the_gateway_records_main_and_summary_calls(pack, tool_server, tmp_path):
    task = pack["roman_numerals"]
    path, text = next(iter(task.reference_files().items()))

    def reply(body, headers):
        last = body["messages"][-1]["content"] or ""
        if "Write a summary" in last:
            return {"content": "SUMMARY: nothing built yet"}
        if "SUMMARY:" in body["messages"][1]["content"]:
            return {"tool_calls": [("write_file", json.dumps({"path": path, "content": text})), ("finish", "{}")]}
        return {"tool_calls": [("run_shell", json.dumps({"command": "seq 1 3000"}))]}

    backend_url, backend_calls = tool_server(reply)
    srv = GatewayServer(Gateway([HTTPBackend(backend_url, name="vllm")], served_model="agent")).start()
    try:
        policy = OpenAIChatPolicy(srv.url, "agent", max_retries=0)
        cfg = AgentConfig(context_window=2048, compact_at=0.5, output_chars=1500)
        ep = run_repo_episode(task, policy, tmp_path, cfg, execution_id="repo-exec-1")
        assert ep.stop_reason == "finish" and ep.compactions == 1 and ep.reward == 1.0
        records = srv.gateway.records.read("repo-exec-1")
        assert len(records) == ep.model_calls == len(backend_calls)
        roles = [r.role for r in records]
        assert roles.count("summary") == 1 and roles[-1] == "main"
        assert all(r.completion_token_ids == [7] * 20 and r.logprobs == [-0.5] * 20 for r in records)
        assert records[-1].tool_calls[0]["function"]["name"] == "write_file"
    finally:
        srv.stop()
