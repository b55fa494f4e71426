"""The OpenAI-compatible policy against a real HTTP server on loopback."""

from evoharness.envs.alfworld import make_env
from evoharness.harness.react import ReActHarness
from evoharness.policies.base import PolicyRequest
from evoharness.policies.openai_policy import OpenAIPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes


def act_first_admissible(body) -> str:
    user = body["messages"][-1]["content"]
    line = next(ln for ln in user.splitlines() if ln.startswith("ADMISSIBLE COMMANDS:"))
    return f"<think>try</think><action>{line.split(':', 1)[1].split(',')[0].strip()}</action>"


def test_episode_through_endpoint(chat_server, one_per_type, monkeypatch):
    server, calls = chat_server(act_first_admissible)
    monkeypatch.setenv("MY_KEY", "sk-test")
    policy = OpenAIPolicy(base_url=server, model="my-model", api_key_env="MY_KEY", max_tokens=64, concurrency=4)
    trajs = run_episodes(
        [EpisodeSpec(one_per_type[0], "e#0"), EpisodeSpec(one_per_type[1], "e#1")],
        make_env,
        ReActHarness,
        policy,
        max_steps=3,
    )
    for t in trajs:
        assert t.steps == 3 and t.invalid_actions == 0 and t.env_steps == 3
        assert t.prompt_tokens == 3 * 123 and t.completion_tokens == 3 * 9
    path, auth, body = calls[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body["model"] == "my-model" and body["max_tokens"] == 64 and body["messages"][0]["role"] == "system"
    assert len(calls) == 6


def test_server_errors_are_recorded_not_raised(chat_server):
    server, calls = chat_server(lambda body: 500)
    policy = OpenAIPolicy(base_url=server, model="m", max_retries=1, timeout_s=5)
    req = PolicyRequest(
        messages=[{"role": "user", "content": "ADMISSIBLE COMMANDS: look"}],
        episode_id="e",
        turn=0,
        admissible_commands=["look"],
    )
    (c,) = policy.act([req])
    assert c.error and "500" in c.error and c.text == ""
    assert len(calls) == 2  # one try + one bounded retry


def test_unreachable_endpoint():
    policy = OpenAIPolicy(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0, timeout_s=2)
    req = PolicyRequest(messages=[{"role": "user", "content": "hi"}], episode_id="e", turn=0, admissible_commands=[])
    (c,) = policy.act([req])
    assert c.error and c.finish_reason == "error"


def test_token_ids_logprobs_seed_and_grammar_requested(chat_server):
    from evoharness.policies.local import request_seed

    server, calls = chat_server(lambda body: "<think>x</think><action>look</action>")
    policy = OpenAIPolicy(base_url=server, model="m", seed=5, constrained=True, max_prompt_tokens=100)
    req = PolicyRequest(
        messages=[{"role": "user", "content": "hi"}],
        episode_id="game#3",
        turn=2,
        admissible_commands=["look", "go to fridge 1"],
    )
    (c,) = policy.act([req])
    body = calls[0][2]
    assert body["seed"] == request_seed(5, "game#3", 2) == c.extra["seed"]  # the in-process derivation
    assert body["logprobs"] is True and body["return_token_ids"] is True and body["truncate_prompt_tokens"] == 100
    assert body["action_grammar"] == {
        "commands": ["look", "go to fridge 1"],
        "meta_verbs": ["track", "commit", "recall", "note"],
    }
    assert c.extra["constraint"]["commands"] == ["look", "go to fridge 1"]
    # this endpoint offers no token ids: the completion is text-only, not an error
    assert c.error is None and c.text.endswith("</action>") and c.completion_token_ids is None and c.logprobs is None

    vllm = OpenAIPolicy(base_url=server, model="m", constrained=True, constraint_format="vllm", max_prompt_tokens=100)
    vllm.act([req])
    assert "action_grammar" not in calls[1][2] and calls[1][2]["structured_outputs"]["regex"].startswith("<think>")
    # vLLM's truncate_prompt_tokens keeps the last N tokens, cutting the system prompt and OBJECTIVE
    # first (issue 10 fault 4): only the gateway, which fits prompts the harness's way, is asked to truncate
    assert "truncate_prompt_tokens" not in calls[1][2]
    # a vLLM server running the project's grammar processor gets the grammar itself (exact masks)
    OpenAIPolicy(
        base_url=server,
        model="m",
        constrained=True,
        constraint_format="vllm_xargs",
        max_tokens=30,
        max_prompt_tokens=100,
    ).act([req])
    assert calls[2][2]["vllm_xargs"] == {
        "action_grammar_commands": ["look", "go to fridge 1"],
        "action_grammar_meta_verbs": ["track", "commit", "recall", "note"],
        "action_grammar_max_new_tokens": 30,
    }
    assert not {"structured_outputs", "action_grammar", "truncate_prompt_tokens"} & set(calls[2][2])


def test_endpoint_rejecting_extensions_falls_back_to_text_only(chat_server):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = []

    class Strict(BaseHTTPRequestHandler):  # a hosted API: unknown arguments are a 400
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if "return_token_ids" in body:
                data, status = {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}}, 400
            else:
                data, status = (
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "m",
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
                        ],
                    },
                    200,
                )
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Strict)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        policy = OpenAIPolicy(base_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", model="m", max_retries=0)
        req = PolicyRequest(
            messages=[{"role": "user", "content": "hi"}], episode_id="e", turn=0, admissible_commands=[]
        )
        assert [c.text for c in policy.act([req, req])] == ["ok", "ok"]
        assert policy.extensions is False and "return_token_ids" not in bodies[-1] and "logprobs" not in bodies[-1]
    finally:
        srv.shutdown()


def test_thinking_switch_reaches_the_request_body(chat_server, one_per_type):
    """``policy.thinking`` is sent as chat_template_kwargs (vLLM / SGLang apply it to Qwen3's template),
    and a thinking model gets a completion budget that lets it reach its action."""
    from evoharness.config.base import load_config
    from evoharness.config.policy import PolicyConfig
    from evoharness.policies.factory import make_policy

    server, calls = chat_server(act_first_admissible)
    for overrides, kwargs, cap in (
        (["thinking=true"], {"enable_thinking": True}, 4096),
        (["thinking=false", "max_tokens=40"], {"enable_thinking": False}, 40),
        (["chat_template_kwargs={ reasoning_effort = 'low' }"], {"reasoning_effort": "low"}, 256),
    ):
        calls.clear()
        cfg = load_config(PolicyConfig, None, ["kind=openai", f"base_url='{server}'", "model=m", *overrides])
        policy = make_policy(cfg)
        try:
            run_episodes([EpisodeSpec(one_per_type[0], "e#0")], make_env, ReActHarness, policy, max_steps=1)
        finally:
            policy.close()
        body = calls[0][2]
        assert body["chat_template_kwargs"] == kwargs and body["max_tokens"] == cap
    calls.clear()
    policy = make_policy(load_config(PolicyConfig, None, ["kind=openai", f"base_url='{server}'", "model=m"]))
    run_episodes([EpisodeSpec(one_per_type[0], "e#0")], make_env, ReActHarness, policy, max_steps=1)
    policy.close()
    assert "chat_template_kwargs" not in calls[0][2]  # unset: the template's own default, nothing sent
