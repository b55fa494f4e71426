"""The gateway over real HTTP on loopback: records, batching, retry, drain, errors, streaming, tools, weights."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
import torch

from evoharness.engines.grammar import GenRequest, action_regex
from evoharness.engines.hf import Engine
from evoharness.models.init import load_model, load_tokenizer, save_model
from evoharness.runtime.backends import Backend, HTTPBackend, LocalBackend
from evoharness.runtime.gateway import Gateway
from evoharness.runtime.wire import parse_tool_calls

MODEL = "micro"


def local(model_dir, name="local", **kw) -> LocalBackend:
    return LocalBackend.from_model_path(model_dir, name=name, **kw)


def chat_body(content: str, **kw) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": "You play ALFWorld."}, {"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0.0,
        "logprobs": True,
        "return_token_ids": True,
        **kw,
    }


def oai_kwargs(content: str, **kw) -> dict:
    """`chat_body` as keyword arguments of the official client (extensions in ``extra_body``)."""
    body = chat_body(content, **kw)
    return {**{k: v for k, v in body.items() if k != "return_token_ids"}, "extra_body": {"return_token_ids": True}}


def test_64_concurrent_executions_get_their_own_records(gw_model_dir, serve):
    backend = local(gw_model_dir)
    srv = serve(Gateway([backend], served_model=MODEL))
    tok = load_tokenizer(gw_model_dir)

    async def execution(client: httpx.AsyncClient, k: int) -> list[dict]:
        msgs = [{"role": "user", "content": f"You are in room {k}. You see a fridge {k % 7 + 1}."}]
        answers = []
        for turn in range(2):  # a second call re-sends the first answer: the tree's prefix case
            r = await client.post(
                f"{srv.url}/chat/completions",
                headers={"X-Execution-Id": f"exec-{k}"},
                json={**chat_body(""), "messages": msgs},
            )
            assert r.status_code == 200, r.text
            answers.append(r.json())
            msgs = msgs + [
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"Nothing happens. (turn {turn})"},
            ]
        return answers

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(execution(client, k) for k in range(64)))

    answers = asyncio.run(main())
    assert backend.batches < 2 * 64  # concurrent calls were gathered into shared engine batches
    store = srv.gateway.records
    assert store.executions() == {f"exec-{k}": 2 for k in range(64)}
    engine = Engine(load_model(gw_model_dir), tok)
    for k in range(64):
        recs = store.read(f"exec-{k}")
        assert [r.call_id for r in recs] == [a["id"] for a in answers[k]]
        for rec, ans in zip(recs, answers[k]):
            assert rec.execution_id == f"exec-{k}" and rec.role == "main" and rec.retries == 0
            rendered = tok.apply_chat_template(rec.messages, add_generation_prompt=True, tokenize=False)
            assert (
                rec.prompt_token_ids == tok(rendered, add_special_tokens=False)["input_ids"] == ans["prompt_token_ids"]
            )
            assert f"room {k}." in rendered and rec.completion_token_ids == ans["choices"][0]["token_ids"]
            assert len(rec.logprobs) == len(rec.completion_token_ids) == ans["usage"]["completion_tokens"]
        # the second prompt extends the first prompt + the first completion's text
        assert recs[1].prompt_token_ids[: len(recs[0].prompt_token_ids)] == recs[0].prompt_token_ids
    # each execution's records fold into its own trajectory tree: the second call's prompt
    # shares the first call's path, only its new suffix is stored, only completions train
    from evoharness.rollout.tree import trees_from_records

    trees = trees_from_records(r for k in range(64) for r in store.read(f"exec-{k}"))
    assert sorted(trees) == sorted(f"exec-{k}" for k in range(64))
    for k in (0, 17, 63):
        tree, recs = trees[f"exec-{k}"], store.read(f"exec-{k}")
        assert tree.execution_id == f"exec-{k}" and len(tree.calls) == 2
        for i, rec in enumerate(recs):
            assert tree.call_sequence(i) == (rec.prompt_token_ids, rec.completion_token_ids)
        assert tree.n_tokens < tree.n_call_tokens()  # the shared prefix is stored once
        assert tree.n_trainable == sum(len(r.completion_token_ids) for r in recs)
    for k in (0, 31, 63):  # the records are the engine's own greedy output and log-probs
        rec = store.read(f"exec-{k}")[0]
        (ref,) = engine.generate([GenRequest(rec.prompt_token_ids)], 8, 0.0)
        assert ref.token_ids == rec.completion_token_ids
        assert torch.allclose(torch.tensor(ref.logprobs), torch.tensor(rec.logprobs), atol=1e-4)


class _Dropper(BaseHTTPRequestHandler):
    """A backend that lists a model, then reads each completion request and hangs up without answering."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        data = json.dumps({"object": "list", "data": [{"id": "flaky", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        self.close_connection = True  # drop: no status line, no body


def start_http(handler) -> tuple[ThreadingHTTPServer, str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.posts, srv.bodies = 0, []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"


def test_backend_that_drops_the_connection_is_retried_transparently(gw_model_dir, serve):
    dropper, url = start_http(_Dropper)
    try:
        flaky = HTTPBackend(url, name="flaky")
        srv = serve(Gateway([flaky, local(gw_model_dir)], served_model=MODEL))  # equal load: flaky is tried first
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0)
        resp = client.chat.completions.create(**oai_kwargs("go to fridge 1"), extra_headers={"X-Execution-Id": "e"})
        assert dropper.posts == 1 and resp.choices[0].message.content is not None
        (rec,) = srv.gateway.records.read("e")
        assert [a.backend for a in rec.attempts] == ["flaky", "local"] and rec.retries == 1
        assert "Disconnected" in rec.attempts[0].error or "disconnected" in rec.attempts[0].error
        assert rec.attempts[1].error is None and rec.call_id == resp.id
        assert rec.t_start <= rec.attempts[0].t_start <= rec.attempts[0].t_end <= rec.attempts[1].t_start <= rec.t_end
        assert rec.completion_token_ids and len(rec.logprobs) == len(rec.completion_token_ids)
        assert srv.gateway.stats["retries"] == 1
    finally:
        dropper.shutdown()


class _GatedEngine:
    """The real engine, but `generate` waits for a gate first (holds a call in flight on purpose)."""

    def __init__(self, engine: Engine):
        self.engine, self.gate = engine, threading.Event()
        self.model, self.stop_ids = engine.model, engine.stop_ids

    def grammar(self, *a):
        return self.engine.grammar(*a)

    def generate(self, *a, **kw):
        self.gate.wait(60)
        return self.engine.generate(*a, **kw)


def test_drain_mid_request_retries_elsewhere_and_resume(gw_model_dir, serve):
    tok = load_tokenizer(gw_model_dir)
    gated = _GatedEngine(Engine(load_model(gw_model_dir), tok))
    a, b = LocalBackend(gated, tok, name="a"), local(gw_model_dir, name="b")
    srv = serve(Gateway([a, b], served_model=MODEL))
    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault(
            "r", httpx.post(f"{srv.url}/chat/completions", json=chat_body("open fridge 1", user="u1"), timeout=60)
        )
    )
    t.start()
    deadline = time.monotonic() + 30
    while a.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.in_flight == 1  # the call sits on backend a
    r = httpx.post(f"{srv.url.removesuffix('/v1')}/admin/backends/a/drain", json={"cancel_inflight": True})
    assert r.status_code == 200 and r.json()["state"] == "draining"
    t.join(30)
    gated.gate.set()
    assert box["r"].status_code == 200
    (rec,) = srv.gateway.records.read("u1")  # execution from the `user` field
    assert [x.backend for x in rec.attempts] == ["a", "b"] and "drained" in rec.attempts[0].error
    assert box["r"].json()["choices"][0]["token_ids"] == rec.completion_token_ids
    # while draining nothing new goes to a; after resume it takes calls again
    for _ in range(2):
        assert httpx.post(f"{srv.url}/chat/completions", json=chat_body("look"), timeout=60).status_code == 200
    assert a.served == 0
    assert httpx.post(f"{srv.url.removesuffix('/v1')}/admin/backends/a/resume", json={}).json()["state"] == "active"
    assert srv.gateway.pick(set()) is a  # least loaded: a has served nothing


def test_n_choices_are_independent_samples_each_recorded(gw_model_dir, serve):
    """``n > 1`` (GRPO-style groups from one prompt): n choices, one record each (a branch of the
    execution's tree), seeds seed+i; streamed too, through the official client."""
    srv = serve(Gateway([local(gw_model_dir)], served_model=MODEL))
    client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0)
    kw = oai_kwargs("go to fridge 1", temperature=1.0, max_tokens=12)
    r = client.chat.completions.create(**kw, n=4, seed=7, extra_headers={"X-Execution-Id": "g"})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    recs = srv.gateway.records.read("g")
    assert [x.call_id for x in recs] == [f"{r.id}-{i}" for i in range(4)]
    ids = [c.model_extra["token_ids"] for c in r.choices]
    assert [x.completion_token_ids for x in recs] == ids and len({tuple(t) for t in ids}) > 1
    assert all(x.prompt_token_ids == r.model_extra["prompt_token_ids"] for x in recs)
    assert all([lp.logprob for lp in c.logprobs.content] == x.logprobs for c, x in zip(r.choices, recs))
    assert r.usage.completion_tokens == sum(map(len, ids))
    single = client.chat.completions.create(**kw, seed=9)  # choice i is the n=1 sample with seed 7+i
    assert single.choices[0].model_extra["token_ids"] == ids[2]
    text = {0: "", 1: ""}
    for ch in client.chat.completions.create(**kw, n=2, seed=7, stream=True, extra_headers={"X-Execution-Id": "s"}):
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
    assert [text[0], text[1]] == [c.message.content for c in r.choices[:2]]
    assert len(srv.gateway.records.read("s")) == 2


def test_client_that_disconnects_mid_call_cancels_it_and_leaves_no_record(gw_model_dir, serve):
    """As vLLM aborts a request whose client went away: the agent never saw the answer, so no
    record (a phantom branch in its tree); streaming and not."""
    tok = load_tokenizer(gw_model_dir)
    gated = _GatedEngine(Engine(load_model(gw_model_dir), tok))
    backend = LocalBackend(gated, tok, name="a")
    srv = serve(Gateway([backend], served_model=MODEL))
    for i, stream in enumerate((False, True)):
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream(
                "POST",
                f"{srv.url}/chat/completions",
                json=chat_body("open fridge 1", stream=stream),
                headers={"X-Execution-Id": f"gone{i}"},
                timeout=0.5,
            ) as r:
                r.read()
        deadline = time.monotonic() + 30
        while srv.gateway.stats["cancelled"] < i + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.gateway.stats["cancelled"] == i + 1 and backend.in_flight == 0
    gated.gate.set()  # the batch that was generating finishes; its answers go nowhere
    r = httpx.post(
        f"{srv.url}/chat/completions", json=chat_body("look"), headers={"X-Execution-Id": "here"}, timeout=60
    )
    assert r.status_code == 200
    assert srv.gateway.records.executions() == {"here": 1} and srv.gateway.stats["calls"] == 1


class _SlowAbortBackend(Backend):
    """Never answers; a cancelled call takes 0.1 s x its order to unwind (an HTTP backend's abort
    round trip to its server)."""

    def __init__(self):
        super().__init__("slow")
        self.calls = 0

    async def _generate(self, params):
        self.calls += 1
        unwind_s = 0.1 * self.calls
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(unwind_s)
            raise


@pytest.mark.parametrize("n", [1, 3])
def test_a_cancelled_call_counts_only_once_every_sample_has_unwound(serve, n):
    """The gateway's ``cancelled`` count and the backends' ``in_flight`` agree at every instant,
    however long a backend takes to abort, for each of `n` samples."""
    backend = _SlowAbortBackend()
    srv = serve(Gateway([backend], served_model=MODEL))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{srv.url}/chat/completions", json=chat_body("look", n=n, temperature=1.0), timeout=0.5)
    deadline = time.monotonic() + 30
    while srv.gateway.stats["cancelled"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert srv.gateway.stats["cancelled"] == 1 and backend.calls == n and backend.in_flight == 0


def test_malformed_requests_get_openai_4xx_and_no_record(gw_model_dir, serve):
    backend = local(gw_model_dir)
    srv = serve(Gateway([backend], served_model=MODEL, max_body_bytes=4096))
    url = f"{srv.url}/chat/completions"

    def post(**kw):
        r = httpx.post(url, timeout=30, **kw)
        return r.status_code, r.json()["error"]

    ok = chat_body("x")
    cases = [
        (
            dict(content=b'{"model": "micro", "messages": [', headers={"Content-Type": "application/json"}),
            400,
            "invalid_json",
        ),
        (dict(content=b"\xff\xfe not json"), 400, "invalid_json"),
        (dict(json=[1, 2]), 400, "invalid_request"),
        (dict(json={**ok, "model": "gpt-9"}), 404, "model_not_found"),
        (dict(json={**ok, "messages": []}), 400, "invalid_value"),
        (dict(json={**ok, "messages": [{"role": "robot", "content": "hi"}]}), 400, "invalid_value"),
        (dict(json={**ok, "temperature": "hot"}), 400, "invalid_value"),
        (dict(json={**ok, "max_tokens": 0}), 400, "invalid_value"),
        (dict(json={**ok, "n": 129}), 400, "invalid_value"),
        (dict(json={k: v for k, v in ok.items() if k != "model"}), 400, "invalid_value"),
        (dict(json={**ok, "messages": [{"role": "user", "content": "x" * 5000}]}), 413, "request_too_large"),
        (
            dict(
                content=iter([b'{"model": "micro", "messages": [{"role": "user", "content": "', b"y" * 5000, b'"}]}'])
            ),
            413,
            "request_too_large",
        ),  # chunked: no Content-Length to check up front
        (dict(json=ok, headers={"X-Agent-Role": "boss"}), 400, "invalid_value"),
        (dict(json={**ok, "max_tokens": 5000}), 400, "context_length_exceeded"),  # rejected by the engine
        # streamed: still the error status, not a 200 stream carrying an error event
        (dict(json={**ok, "max_tokens": 5000, "stream": True}), 400, "context_length_exceeded"),
        (dict(json={**ok, "seed": 2**64}), 400, "invalid_value"),  # was a 503 after 5 engine failures
        # settings the engine cannot honour are refused, not silently ignored
        (dict(json={**ok, "logit_bias": {"5": 100}}), 400, "unsupported_parameter"),
        (dict(json={**ok, "presence_penalty": 1.5}), 400, "unsupported_parameter"),
        (dict(json={**ok, "response_format": {"type": "json_object"}}), 400, "unsupported_parameter"),
        (dict(json={**ok, "top_logprobs": 3}), 400, "unsupported_parameter"),
        (
            dict(
                json={
                    **ok,
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                        }
                    ],
                }
            ),
            400,
            None,
        ),
    ]
    for kw, status, code in cases:
        got_status, err = post(**kw)
        assert (got_status, err["code"]) == (status, code), (kw, err)
        assert err["message"] and err["type"] == "invalid_request_error"
    assert srv.gateway.records.executions() == {} and backend.served == 0
    assert httpx.post(url, json=ok).status_code == 200  # and the server still serves
    # the same settings at their "off" values, and text content parts, are fine
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "go to "}, {"type": "text", "text": "desk 1"}]}]
    r = httpx.post(
        url,
        json={
            **ok,
            "presence_penalty": 0,
            "logit_bias": {},
            "response_format": {"type": "text"},
            "top_logprobs": 0,
            "messages": text_parts,
        },
    )
    assert r.status_code == 200, r.text


def test_streaming_with_the_openai_client(gw_model_dir, serve):
    srv = serve(Gateway([local(gw_model_dir)], served_model=MODEL))
    client = openai.OpenAI(base_url=srv.url, api_key="x")
    body = oai_kwargs("take apple 1 from countertop 2", max_tokens=12)
    full = client.chat.completions.create(**body, extra_headers={"X-Execution-Id": "plain"})
    stream = client.chat.completions.create(
        **body, stream=True, stream_options={"include_usage": True}, extra_headers={"X-Execution-Id": "streamed"}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content  # greedy: the same answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    ids = [i for c in chunks if c.choices for i in ((c.choices[0].model_extra or {}).get("token_ids") or [])]
    (rec,) = srv.gateway.records.read("streamed")
    assert ids == rec.completion_token_ids == full.choices[0].model_extra["token_ids"]


class _ToolServer(BaseHTTPRequestHandler):
    """A vLLM-like backend: returns a tool call with token ids and log-probs, and logs request bodies."""

    def log_message(self, *a):
        pass

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        call = {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "run_tests", "arguments": '{"path":  "tests/",   "verbose": true}'},
        }
        self._send(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "prompt_token_ids": [1, 2, 3],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "token_ids": [7, 8, 9],
                        "logprobs": {
                            "content": [{"token": t, "logprob": -0.5, "bytes": [], "top_logprobs": []} for t in "abc"]
                        },
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            }
        )


def test_tool_calls_pass_through_and_raw_payloads_are_restored(serve):
    vllm, url = start_http(_ToolServer)
    try:
        srv = serve(Gateway([HTTPBackend(url, name="vllm")], served_model=MODEL))
        client = openai.OpenAI(base_url=srv.url, api_key="x")
        tools = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]
        msgs = [{"role": "user", "content": "run the tests"}]
        r = client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            tools=tools,
            seed=11,
            extra_headers={"X-Execution-Id": "repo-1", "X-Agent-Role": "subagent"},
            extra_body={"action_grammar": {"commands": ["look"], "meta_verbs": ["note"]}},
        )
        tc = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and tc.id == "call_abc" and tc.function.name == "run_tests"
        sent = vllm.bodies[0]
        assert sent["model"] == "Qwen/Qwen3-8B" and sent["tools"] == tools and sent["seed"] == 11
        assert sent["logprobs"] is True and sent["return_token_ids"] is True and "action_grammar" not in sent
        assert sent["structured_outputs"] == {"regex": action_regex(["look"], ["note"])}
        (rec,) = srv.gateway.records.read("repo-1")
        assert rec.role == "subagent" and rec.prompt_token_ids == [1, 2, 3] and rec.completion_token_ids == [7, 8, 9]
        assert (
            rec.logprobs == [-0.5] * 3 and rec.finish_reason == "tool_calls" and rec.tool_calls[0]["id"] == "call_abc"
        )
        # the harness re-serialises the arguments; the gateway sends the model its own payload back
        history = msgs + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "run_tests", "arguments": json.dumps(json.loads(tc.function.arguments))},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_abc", "content": "3 passed"},
        ]
        client.chat.completions.create(
            model=MODEL, messages=history, tools=tools, extra_headers={"X-Execution-Id": "repo-1"}
        )
        replay = vllm.bodies[1]["messages"][1]["tool_calls"][0]["function"]["arguments"]
        assert replay == '{"path":  "tests/",   "verbose": true}'
    finally:
        vllm.shutdown()


def test_action_grammar_is_recorded_and_reaches_vllm_as_xargs(gw_model_dir, serve):
    """The constraint a call was sampled under is in its record (the trainer replays it); a vLLM
    backend with ``grammar="xargs"`` gets it as the `engines.vllm_grammar` processor's flat keys."""
    vllm, url = start_http(_ToolServer)
    grammar = {"commands": ["look", "go to fridge 1"], "meta_verbs": ["note"]}
    try:
        srv = serve(Gateway([HTTPBackend(url, name="vllm", grammar="xargs")], served_model=MODEL))
        httpx.post(
            f"{srv.url}/chat/completions",
            json=chat_body("x", user="v", action_grammar=grammar, max_tokens=12),
            timeout=30,
        ).raise_for_status()
        sent = vllm.bodies[0]
        assert "structured_outputs" not in sent and "action_grammar" not in sent
        assert sent["vllm_xargs"] == {
            "action_grammar_commands": grammar["commands"],
            "action_grammar_meta_verbs": ["note"],
            "action_grammar_max_new_tokens": 12,
        }
        assert srv.gateway.records.read("v")[0].constraint == {**grammar, "max_new_tokens": 12}
    finally:
        vllm.shutdown()
    srv = serve(Gateway([local(gw_model_dir)], served_model=MODEL))
    r = httpx.post(
        f"{srv.url}/chat/completions",
        json=chat_body("x", user="l", action_grammar=grammar, temperature=1.0, seed=3, max_tokens=40),
        timeout=60,
    )
    (rec,) = srv.gateway.records.read("l")
    assert rec.constraint == {**grammar, "max_new_tokens": 40}
    assert r.json()["choices"][0]["message"]["content"].startswith("<think>")
    httpx.post(f"{srv.url}/chat/completions", json=chat_body("x", user="u"), timeout=60).raise_for_status()
    assert srv.gateway.records.read("u")[0].constraint is None


def test_parse_tool_calls_qwen_format():
    text = 'Let me check.<tool_call>\n{"name": "ls", "arguments": {"dir": "src"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check." and calls[0]["function"] == {"name": "ls", "arguments": '{"dir": "src"}'}
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_weight_reload_bumps_version_and_changes_answers(gw_model_dir, serve, tmp_path):
    srv = serve(Gateway([local(gw_model_dir)], served_model=MODEL))
    root = srv.url.removesuffix("/v1")
    before = httpx.post(f"{srv.url}/chat/completions", json=chat_body("look", user="w")).json()
    model, tok = load_model(gw_model_dir), load_tokenizer(gw_model_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    save_model(model, tok, tmp_path / "new")
    r = httpx.post(f"{root}/admin/backends/local/weights", json={"path": str(tmp_path / "new")})
    assert r.status_code == 200 and r.json()["policy_version"] == 1
    assert httpx.get(f"{srv.url}/models").json()["data"][0]["policy_version"] == 1
    after = httpx.post(f"{srv.url}/chat/completions", json=chat_body("look", user="w")).json()
    assert after["policy_version"] == 1 and before["policy_version"] == 0
    assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
    recs = srv.gateway.records.read("w")
    assert [r.policy_version for r in recs] == [0, 1]
    assert httpx.post(f"{root}/admin/weights", json={"path": str(tmp_path / "new"), "version": 9}).json()["data"] == [
        {"name": "local", "policy_version": 9}
    ]
    bad = httpx.post(f"{root}/admin/backends/local/weights", json={"path": str(tmp_path / "missing")})
    assert bad.status_code == 400 and "safetensors" in bad.json()["error"]["message"]


def test_records_over_http_and_backends_admin(gw_model_dir, serve, tmp_path):
    inner = serve(Gateway([local(gw_model_dir)], served_model="inner", records=False))
    outer = serve(Gateway([], served_model=MODEL, records=tmp_path / "records", wait_for_backend_s=0.2))
    root = outer.url.removesuffix("/v1")
    assert httpx.get(f"{root}/health").status_code == 503
    r = httpx.post(f"{outer.url}/chat/completions", json=chat_body("look"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "backend_unavailable"
    added = httpx.post(f"{root}/admin/backends", json={"url": inner.url, "name": "cell-0"}).json()
    assert added["name"] == "cell-0" and added["evoharness"] and added["model"] == "inner"
    assert httpx.get(f"{root}/health").json() == {"status": "ok", "backends": 1, "routable": 1}
    eid = "pick_and_place/trial_T2019#u0g3"  # slashes and '#' survive file names and URLs
    for _ in range(2):
        r = httpx.post(f"{outer.url}/chat/completions", json=chat_body("look"), headers={"X-Execution-Id": eid})
        assert r.status_code == 200
    r = httpx.post(f"{root}/x/prefixed-exec/v1/chat/completions", json=chat_body("look"))
    assert r.status_code == 200
    got = httpx.get(f"{outer.url}/executions/{eid.replace('#', '%23')}/records").json()
    assert got["execution_id"] == eid and len(got["data"]) == 2
    assert got["data"][0]["attempts"][0]["backend"] == "cell-0" and got["data"][0]["prompt_token_ids"]
    assert len(httpx.get(f"{outer.url}/executions/prefixed-exec/records", params={"offset": 0}).json()["data"]) == 1
    assert (
        len(httpx.get(f"{outer.url}/executions/{eid.replace('#', '%23')}/records", params={"offset": 1}).json()["data"])
        == 1
    )
    listed = {e["id"]: e["records"] for e in httpx.get(f"{outer.url}/executions").json()["data"]}
    assert listed == {eid: 2, "prefixed-exec": 1}
    lines = [
        json.loads(ln) for f in sorted((tmp_path / "records").glob("*.jsonl")) for ln in f.read_text().splitlines()
    ]
    assert sorted(x["execution_id"] for x in lines) == sorted([eid, eid, "prefixed-exec"])
    assert httpx.delete(f"{root}/admin/backends/cell-0").json() == {"removed": "cell-0"}
    assert httpx.get(f"{root}/admin/backends").json() == {"data": []}
    assert httpx.post(f"{root}/admin/backends", json={"url": "http://127.0.0.1:9/v1"}).status_code == 502


def test_serve_cli_needs_a_backend():
    from typer.testing import CliRunner

    from evoharness.cli import app

    res = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert res.exit_code == 2 and "--model-path and/or --backend" in res.output
    res = CliRunner().invoke(app, ["serve", "--workers", "2"])
    assert res.exit_code == 2 and "--workers needs --model-path" in res.output
    # an unreachable --backend: one clear line after the wait (was an 80-line lifespan traceback)
    res = CliRunner().invoke(
        app, ["serve", "--backend", "http://127.0.0.1:9/v1", "--wait-backends", "1", "--port", "0"]
    )
    assert res.exit_code == 2 and "http://127.0.0.1:9/v1 did not answer /models within 1 s" in res.output, res.output
    assert "Traceback" not in res.output
