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
    trajs = run_episodes([EpisodeSpec(one_per_type[0], "e#0"), EpisodeSpec(one_per_type[1], "e#1")], make_env,
                         ReActHarness, policy, max_steps=3)
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
    req = PolicyRequest(messages=[{"role": "user", "content": "ADMISSIBLE COMMANDS: look"}], episode_id="e", turn=0,
                        admissible_commands=["look"])
    (c,) = policy.act([req])
    assert c.error and "500" in c.error and c.text == ""
    assert len(calls) == 2  # one try + one bounded retry


def test_unreachable_endpoint():
    policy = OpenAIPolicy(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0, timeout_s=2)
    req = PolicyRequest(messages=[{"role": "user", "content": "hi"}], episode_id="e", turn=0, admissible_commands=[])
    (c,) = policy.act([req])
    assert c.error and c.finish_reason == "error"
