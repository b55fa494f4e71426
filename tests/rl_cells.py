"""Helpers shared by the RL-on-cells tests (tests/train/test_rl_runtime.py, tests/runtime/...):
the small ALFWorld RL config and the comparison with the in-process run (`rl_reference` in
tests/conftest.py). Fault injection lives in tests/synthetic_agents.py (`KillOnCommand`) and in
the tests (``job.backend.transport.pid(c)`` / ``.kill(c)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from safetensors.torch import load_file

if TYPE_CHECKING:
    from evoharness.config.rl import RLConfig

# the Driver's hang guard in the cell tests: starting Ray actors (Python processes importing torch) took
# over 60 s on 2 cores beside a training job; a real hang still fails, only later
RAY_STALL_S = 300.0

# the in-process run's per-step numbers a runtime run must reproduce exactly, and to float noise
EXACT = (
    "success",
    "reward",
    "steps_per_episode",
    "completion_tokens_per_episode",
    "invalid_per_episode",
    "experience_ops",
    "experience_epoch",
    "policy_version",
    "train/n_tokens",
    "adv/signal_groups",
    "prompt/cut_tokens",
    "rollout/env_errors",
)
CLOSE = ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/forced_fraction")


def rl_config(model_dir: Path, out: Path, steps: int = 2, **runtime: Any) -> RLConfig:
    """2 steps x 2 games x 2 samples, episodes of at most 4 turns of 12 tokens; `runtime` sets
    ``cfg.runtime`` fields (none: one cell in process; ``cells`` > 1 without a ``backend``: processes)."""
    from evoharness.config.rl import RLConfig

    cfg = RLConfig(
        model_path=str(model_dir),
        out_dir=str(out),
        steps=steps,
        max_steps=4,
        max_new_tokens=12,
        max_prompt_tokens=512,
        decode_threads=1,
        seed=3,
    )
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 2, 1e-3
    cfg.grpo.temperature, cfg.grpo.micro_batch_size = 1.0, 8
    if runtime.get("cells", 1) > 1:
        runtime.setdefault("backend", "local")
    cfg.runtime = cfg.runtime.model_validate({**cfg.runtime.model_dump(), **runtime})
    return cfg


def metrics(out: Path) -> list[dict]:
    """A run's per-step records (``metrics.jsonl``)."""
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_steps(got: list[dict], want: list[dict]) -> None:
    """Steps 1 and 2 with the same `EXACT` numbers and `CLOSE` ones within float noise."""
    assert [m["step"] for m in got] == [1, 2]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        for k in CLOSE:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7), k


def assert_same_update(final: Path, ref_w: dict, model_dir: Path) -> None:
    """The same AdamW updates: `final`'s weights agree with `ref_w` far below the size of the update.

    1% of each tensor's move: a cell decodes the calls queued together as one batch and the train
    cells sum gradients in another order, so log-probs and gradients differ in the last float bits,
    and AdamW's 1/sqrt(v) scales that up where gradients are tiny (1.2e-3 of the update was seen
    once; another sample or update would differ by ~100%)."""
    w0 = load_file(str(model_dir / "model.safetensors"))
    w = load_file(str(final / "model.safetensors"))
    assert max(float((w[k] - w0[k]).abs().max()) for k in w0) > 0  # the updates changed the weights
    for k in ref_w:
        moved = (ref_w[k] - w0[k]).abs().max()
        assert (w[k] - ref_w[k]).abs().max() <= 1e-2 * moved + 1e-7, k
