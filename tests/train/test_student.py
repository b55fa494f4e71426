"""The student (issue 11): DAgger labels, early stopping of repeated-state loops, and a short
deterministic SFT + DAgger run that measurably improves on its initial checkpoint."""

from __future__ import annotations

import torch

from evoharness.config.harness import HarnessConfig
from evoharness.config.policy import PolicyConfig
from evoharness.config.sft import SFTConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.base import split_completion
from evoharness.harness.bpe import ExperienceStore
from evoharness.harness.factory import make_harness
from evoharness.models.init import load_model, load_tokenizer
from evoharness.policies.base import Completion
from evoharness.policies.factory import make_policy
from evoharness.policies.teacher import TeacherPolicy, teacher_completion
from evoharness.rollout.collect import collect_traces, traces_to_sft
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.dagger import dagger_round
from evoharness.train.sft import collate, tokenize_examples, train_sft

HARNESS = HarnessConfig(kind="bpe", system_prompt="compact")


def _game(task):
    return make_env(task, engine="fast")


def _tasks(n: int) -> list:
    """The first `n` train games of the pick-and-place and look types (short episodes)."""
    types = ("pick_and_place_simple", "look_at_obj_in_light")
    return [t for t in discover_games("train") if t.task_type in types][:n]


class Repeat:
    """Always answers `text` (a looping policy)."""

    name = "repeat"

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, requests):
        return [Completion(text=self.text) for _ in requests]

    def close(self) -> None:
        pass


def test_repeated_state_loops_stop_early_and_the_teacher_is_never_stopped():
    tasks = _tasks(4)
    specs = [EpisodeSpec(t, t.task_id) for t in tasks]
    store = ExperienceStore()
    store.freeze()
    harness = lambda: make_harness(HARNESS, experience=store)  # noqa: E731
    # "look" twice in a row gives the same observation: from the 2nd turn the prompt repeats
    looped = run_episodes(
        specs, _game, harness, Repeat("<think>x</think><action>look</action>"), max_steps=50, stop_repeats=3
    )
    assert all(t.stop_reason == "hopeless" and not t.won for t in looped)
    # the PREVIOUS ACTIONS window (4) fills with "look" first; then the prompt repeats 3 times
    assert all(len(t.turns) <= 4 + 3 + 1 for t in looped), [len(t.turns) for t in looped]
    full = run_episodes(specs, _game, harness, Repeat("<think>x</think><action>look</action>"), max_steps=12)
    assert all(t.stop_reason == "max_steps" and len(t.turns) == 12 for t in full)
    # the teacher wins every game with or without the rule, in the same number of steps
    a = run_episodes(specs, _game, harness, TeacherPolicy(), max_steps=50, stop_repeats=3)
    b = run_episodes(specs, _game, harness, TeacherPolicy(), max_steps=50)
    assert [t.won for t in a] == [t.won for t in b] == [True] * len(tasks)
    assert [len(t.turns) for t in a] == [len(t.turns) for t in b]


def test_dagger_labels_every_state_with_the_teachers_whole_completion(model_dir, tmp_path):
    tasks = _tasks(3)
    store = ExperienceStore()
    store.freeze()
    student = make_policy(
        PolicyConfig(kind="hf", model_path=str(model_dir), constrained=True, max_tokens=32, max_prompt_tokens=1024)
    )
    try:
        st = dagger_round(
            tasks,
            student,
            lambda: make_harness(HARNESS, experience=store),
            _game,
            tmp_path / "d.jsonl",
            max_steps=8,
            stop_repeats=3,
        )
    finally:
        student.close()
    from evoharness.files import read_jsonl

    ex = read_jsonl(tmp_path / "d.jsonl")
    assert st.played == 3 and st.examples == len(ex) > 0 and st.turns >= len(ex)
    for e in ex:
        user = e["messages"][-1]["content"]
        assert e["completion"] == teacher_completion(user)  # the label is the teacher's whole completion
        assert "<think>" in e["completion"] and "<action>" in e["completion"]
    assert len({str(e["messages"]) for e in ex}) == len(ex)  # a state is labelled once
    # beta = 1: every executed action is the teacher's, so the student's rollouts win like the teacher
    student = make_policy(
        PolicyConfig(kind="hf", model_path=str(model_dir), constrained=True, max_tokens=32, max_prompt_tokens=1024)
    )
    try:
        st1 = dagger_round(
            tasks,
            student,
            lambda: make_harness(HARNESS, experience=store),
            _game,
            tmp_path / "d1.jsonl",
            beta=1.0,
            max_steps=50,
        )
    finally:
        student.close()
    assert st1.won == st1.played == 3


@torch.no_grad()
def _token_accuracy(model_dir, examples: list[dict]) -> float:
    """Teacher-forced greedy accuracy on the completion tokens (think + action + eos)."""
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, torch.device("cpu"), torch.float32).eval()
    rows = tokenize_examples(tok, examples, 1024, 96)
    right = total = 0
    for i in range(0, len(rows), 8):
        ids, labels = collate(rows[i : i + 8], tok.pad_token_id)
        pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
        target = labels[:, 1:]
        keep = target != -100
        right += int((pred[keep] == target[keep]).sum())
        total += int(keep.sum())
    return right / total


def _action_accuracy(model_dir, examples: list[dict]) -> float:
    """Fraction of examples whose action the model decodes greedily (constrained to the prompt's
    admissible commands and meta-actions, as evaluated)."""
    from evoharness.policies.base import PolicyRequest

    def admissible(e: dict) -> list[str]:
        line = next(x for x in e["messages"][-1]["content"].splitlines() if x.startswith("ADMISSIBLE COMMANDS: "))
        return line[len("ADMISSIBLE COMMANDS: ") :].split(", ")

    pol = make_policy(
        PolicyConfig(kind="hf", model_path=str(model_dir), constrained=True, max_tokens=64, max_prompt_tokens=1024)
    )
    try:
        comps = pol.act(
            [
                PolicyRequest(messages=e["messages"], episode_id=str(i), turn=0, admissible_commands=admissible(e))
                for i, e in enumerate(examples)
            ]
        )
    finally:
        pol.close()
    return sum(
        split_completion(c.text)[1].strip() == split_completion(e["completion"])[1].strip()
        for c, e in zip(comps, examples)
    ) / len(examples)


def test_a_short_sft_and_dagger_run_improves_on_its_initial_checkpoint(model_dir, tmp_path):
    """Teacher traces on 4 real games -> 40 SFT steps -> one DAgger round -> 20 more steps on the
    aggregate, micro model, fixed seeds. Measured on the training states: completion-token accuracy
    (teacher-forced) and the greedy action of each state, before and after."""
    tasks = _tasks(4)
    store = ExperienceStore()
    collect_traces(
        tasks,
        TeacherPolicy(),
        lambda s: make_harness(HARNESS, experience=s),
        _game,
        tmp_path / "traces.jsonl",
        experience=store,
        progress=False,
        batch_size=4,
    )
    examples = traces_to_sft(tmp_path / "traces.jsonl")
    assert len(examples) >= 30
    cfg = SFTConfig(
        lr=3e-3,
        max_steps=40,
        batch_tokens=8192,
        warmup_steps=3,
        max_prompt_tokens=1024,
        max_completion_tokens=96,
        ckpt_every=0,
        progress=False,
    )
    tok0, act0 = _token_accuracy(model_dir, examples), _action_accuracy(model_dir, examples)
    sft1 = train_sft(cfg, examples, model_dir, tmp_path / "sft")
    tok1, act1 = _token_accuracy(sft1, examples), _action_accuracy(sft1, examples)
    print(f"token accuracy {tok0:.3f} -> {tok1:.3f}; action accuracy {act0:.3f} -> {act1:.3f}")
    assert tok0 < 0.05
    assert tok1 > tok0 + 0.4
    assert act0 == 0.0 and act1 >= 0.1  # the initial model decodes none of the teacher's actions
    # DAgger: the SFT student plays the same games, the teacher labels what it reached
    store.freeze()
    student = make_policy(
        PolicyConfig(kind="hf", model_path=str(sft1), constrained=True, max_tokens=64, max_prompt_tokens=1024)
    )
    try:
        dagger_round(
            tasks,
            student,
            lambda: make_harness(HARNESS, experience=store),
            _game,
            tmp_path / "dagger.jsonl",
            max_steps=20,
            stop_repeats=3,
        )
    finally:
        student.close()
    from evoharness.files import read_jsonl

    visited = read_jsonl(tmp_path / "dagger.jsonl")
    assert visited
    before = _token_accuracy(sft1, visited)
    sft2 = train_sft(
        cfg.model_copy(update={"max_steps": 20, "warmup_steps": 0}), examples + visited, sft1, tmp_path / "sft_dagger"
    )
    assert _token_accuracy(sft2, visited) > before + 0.02  # the student now imitates the teacher on its own states
    assert _token_accuracy(sft2, examples) > tok0 + 0.4  # without forgetting the teacher's states
