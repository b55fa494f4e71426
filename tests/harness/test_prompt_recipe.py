"""One prompt recipe (issue 10 fault 4): the same state gives the same prompt tokens on every
path (collect -> SFT, eval, RL, the main job), and a prompt over its budget drops history first
and never loses the system prompt or the OBJECTIVE. Real games, the real teacher, a real
tokenizer and a micro Qwen3 model trained/built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness.config.eval import EvalConfig
from evoharness.config.harness import HarnessConfig
from evoharness.config.rl import RLConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.eval.evaluate import evaluate
from evoharness.files import read_jsonl
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.harness.factory import make_harness
from evoharness.harness.prompt import PromptTooLong, chat_ids, drop_oldest_history, fit_prompt_ids
from evoharness.harness.react import ReActHarness
from evoharness.models.init import init_model, load_tokenizer
from evoharness.models.tokenizer import build_tokenizer
from evoharness.pipeline import RunConfig, eval_config, model_policy, rl_config
from evoharness.policies.base import Completion, PolicyRequest
from evoharness.policies.local import LocalHFPolicy
from evoharness.policies.teacher import TeacherPolicy
from evoharness.rollout.collect import bpe_harness_factory, collect_traces, traces_to_sft
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.distill import distill, parse_log
from evoharness.train.sft import tokenize_examples

MICRO = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
RECIPE = HarnessConfig(kind="bpe", history_window=3, system_prompt="compact")  # not the defaults: it must flow


@pytest.fixture(scope="module")
def task():
    """The first valid_seen pick-two game: a long teacher episode (history to drop)."""
    return next(t for t in discover_games("valid_seen") if t.task_type == "pick_two_obj_and_place")


@pytest.fixture(scope="module")
def collected(task, tmp_path_factory):
    """The teacher's episode collected with RECIPE, and its SFT examples."""
    d = tmp_path_factory.mktemp("recipe")
    collect_traces(
        [task],
        TeacherPolicy(),
        bpe_harness_factory(RECIPE),
        lambda t: make_env(t, engine="fast"),
        d / "traces.jsonl",
        progress=False,
    )
    (traj,) = read_jsonl(d / "traces.jsonl")
    assert traj["won"] and len(traj["turns"]) >= 10
    return traj, traces_to_sft([traj])


@pytest.fixture(scope="module")
def model_dir(collected, tmp_path_factory):
    traj, _ = collected
    corpus = [m["content"] for t in traj["turns"] for m in t["messages"]] + [t["completion"] for t in traj["turns"]]
    d = tmp_path_factory.mktemp("micro")
    init_model(MICRO, build_tokenizer(corpus * 4, d, vocab_size=1024), out_dir=d, seed=0)
    return d


def _budget(tok, examples) -> int:
    """A budget that the longer half of the prompts exceed."""
    lengths = sorted(len(chat_ids(tok, ex["messages"])) for ex in examples)
    return lengths[len(lengths) // 2]


class ReplayPolicy:
    """Replays the teacher's completions while the local policy renders each prompt
    exactly as it would to decode it (`LocalHFPolicy._prompt_ids`)."""

    name = "replay"

    def __init__(self, completions: list[str], local: LocalHFPolicy) -> None:
        self.completions, self.local, self.prompt_ids = completions, local, []

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        (req,) = requests
        self.prompt_ids.append(self.local._prompt_ids(req))
        return [Completion(text=self.completions[req.turn])]

    def close(self) -> None:
        pass


def test_same_state_same_prompt_tokens_on_every_path(collected, model_dir, task, tmp_path):
    traj, examples = collected
    tok = load_tokenizer(model_dir)
    budget = _budget(tok, examples)
    stats: dict[str, int] = {}
    sft_prompts = [ids[:n] for ids, n in tokenize_examples(tok, examples, budget, 64, stats)]
    assert len(sft_prompts) == len(traj["turns"]) and stats["prompts_fitted"] > 0 and stats["history_dropped"] > 0
    completions = [t["completion"] for t in traj["turns"]]

    # eval and rl build their harness from their config's `harness`; the main job hands every stage its own
    run = RunConfig(harness=RECIPE, sft={"max_prompt_tokens": budget}, rl={"max_prompt_tokens": budget})
    stage_harness = [
        rl_config(run, tmp_path).harness,
        eval_config(run, tmp_path, "sft", model_policy(run, tmp_path), tmp_path).harness,
    ]
    assert all(h.model_copy(update={"experience_path": None}) == RECIPE for h in stage_harness)
    assert rl_config(run, tmp_path).max_prompt_tokens == model_policy(run, tmp_path).max_prompt_tokens == budget
    factories = {
        "eval": lambda: make_harness(EvalConfig(harness=RECIPE).harness),
        "rl": lambda: make_harness(RLConfig(harness=RECIPE).harness, experience=_frozen()),
    }
    local = LocalHFPolicy(model_dir, max_prompt_tokens=budget)
    for name, factory in factories.items():
        replay = ReplayPolicy(completions, local)
        (played,) = run_episodes(
            [EpisodeSpec(task, f"{task.task_id}#0")],
            lambda t: make_env(t, engine="fast"),
            factory,
            replay,
            max_steps=50,
        )
        assert played.won and [t.action for t in played.turns] == [t["action"] for t in traj["turns"]], name
        assert replay.prompt_ids == sft_prompts, name

    # the real `evaluate` path with the local model: its first turn's recorded prompt ids
    cfg = EvalConfig(
        split="valid_seen",
        task_types=[task.task_type],
        limit=1,
        max_steps=1,
        out_dir=str(tmp_path / "ev"),
        harness=RECIPE,
        policy={"kind": "hf", "model_path": str(model_dir), "max_prompt_tokens": budget},
    )
    evaluate(cfg, progress=False)
    (ep,) = [json.loads(x) for x in (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()]
    assert ep["task_id"] == task.task_id and ep["turns"][0]["prompt_token_ids"] == sft_prompts[0]


def _frozen() -> ExperienceStore:
    store = ExperienceStore()
    store.freeze()
    return store


def test_collect_and_distill_render_with_the_configured_recipe(collected, task):
    traj, examples = collected
    compact = make_harness(RECIPE, experience=ExperienceStore()).system_prompt
    assert all(ex["messages"][0]["content"] == compact for ex in examples)
    log = {**traj, "turns": [t for t in traj["turns"] if t["kind"] == "env"]}
    trajs, stats = distill(
        [parse_log(log)],
        make_env=lambda t, w: make_env(t, engine="fast", wording=w),
        tasks={task.task_id: task},
        harness=RECIPE,
    )
    assert stats.distilled == 1
    for t in trajs[0].turns:
        user = t.messages[-1]["content"]
        assert t.messages[0]["content"] == compact
        assert user.split("PREVIOUS ACTIONS:\n")[1].split("\n\n")[0].count("\n> ") <= RECIPE.history_window - 1


def _play(task, harness_cls, n_turns: int = 40):
    """Yield the harness after each turn of the teacher's episode (its env actions replayed for ReAct)."""
    env = make_env(task, engine="fast")
    first = env.reset()
    teacher, bpe = TeacherPolicy(), BPEHarness(ExperienceStore(), history_window=8)
    h = bpe if harness_cls is BPEHarness else harness_cls(history_window=8)
    bpe.reset(task, first)
    if h is not bpe:
        h.reset(task, first)
    for turn in range(n_turns):
        comp = teacher.act([PolicyRequest(bpe.messages(), "e", turn, list(bpe.admissible), harness=bpe)])[0]
        p = bpe.parse(comp.text)
        if p.kind == "env":
            r = env.step(p.command)
            bpe.after_env_step(p, r)
            if h is not bpe:
                h.after_env_step(h.parse(comp.text), r)
            yield h
            if r.done:
                break
        else:
            bpe.run_meta(p)
            if h is bpe:
                yield h
    env.close()


@pytest.mark.parametrize("harness_cls", [BPEHarness, ReActHarness])
def test_dropping_the_oldest_entry_renders_a_shorter_window(task, harness_cls):
    checked = 0
    for h in _play(task, harness_cls):
        history = h.history if harness_cls is BPEHarness else h._history
        for w in range(1, 9):
            if len(history) < w:
                break
            h.history_window = w
            longer = h.messages()
            h.history_window = w - 1
            assert drop_oldest_history(longer) == h.messages()
            checked += 1
        h.history_window = 0
        assert drop_oldest_history(h.messages()) is None
        h.history_window = 8
    assert checked > 30


def test_fit_drops_history_first_then_cuts_after_the_objective(collected, model_dir):
    traj, _ = collected
    tok = load_tokenizer(model_dir)
    h_msgs = max((t["messages"] for t in traj["turns"]), key=lambda m: len(chat_ids(tok, m)))
    full = chat_ids(tok, h_msgs)
    ids, fit = fit_prompt_ids(tok, h_msgs, len(full))
    assert ids == full and not fit.fitted
    # one token over: the oldest history entry goes, nothing else changes
    ids, fit = fit_prompt_ids(tok, h_msgs, len(full) - 1)
    assert (fit.history_dropped, fit.tokens_cut) == (1, 0) and ids == chat_ids(tok, drop_oldest_history(h_msgs))
    # no history left and still too long: cut after the OBJECTIVE, keep the end of the prompt
    bare = h_msgs
    while (shorter := drop_oldest_history(bare)) is not None:
        bare = shorter
    no_history = chat_ids(tok, bare)
    budget = len(no_history) - 40
    ids, fit = fit_prompt_ids(tok, h_msgs, budget)
    assert len(ids) == budget and fit.history_dropped >= 1 and fit.tokens_cut == 40
    text = tok.decode(ids)
    objective = next(line for line in bare[-1]["content"].splitlines() if line.startswith("OBJECTIVE:"))
    assert text.startswith(f"<|im_start|>system\n{bare[0]['content']}<|im_end|>\n<|im_start|>user\n{objective}")
    assert ids[-20:] == no_history[-20:] and text.endswith("<|im_start|>assistant\n")
    # the protected part alone does not fit: a clear error, not a silent left cut
    head = len(tok(f"<|im_start|>system\n{bare[0]['content']}<|im_end|>\n", add_special_tokens=False)["input_ids"])
    with pytest.raises(PromptTooLong, match="OBJECTIVE"):
        fit_prompt_ids(tok, h_msgs, head)


def test_local_policy_reports_a_fitted_prompt_and_the_report_counts_it(collected, model_dir, task, tmp_path):
    traj, examples = collected
    tok = load_tokenizer(model_dir)
    budget = _budget(tok, examples)
    cfg = EvalConfig(
        split="valid_seen",
        task_types=[task.task_type],
        limit=1,
        max_steps=6,
        out_dir=str(tmp_path),
        harness=RECIPE,
        policy={"kind": "hf", "model_path": str(model_dir), "max_prompt_tokens": budget // 2, "constrained": True},
    )
    summary = evaluate(cfg, progress=False)
    (ep,) = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    fitted = ep["info"].get("prompt_fit", {})
    assert all(len(t["prompt_token_ids"]) <= budget // 2 for t in ep["turns"])
    assert fitted.get("turns", 0) >= 1 and summary["overall"]["prompt_fit"] == fitted
    assert "Prompts over the policy's token budget" in (tmp_path / "report.md").read_text()
    assert Path(tmp_path / "summary.json").is_file()
