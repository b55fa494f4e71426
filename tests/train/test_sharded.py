"""FSDP2 sharded training (`train.sharded`) on real processes: 2 CPU ranks (gloo, spawned by
`train.launch.launch_ranks`) train the micro Qwen3 as one process does.

Tolerances: FSDP on gloo is exact up to float summation order (a rank sums its own micro-batches,
the reduce-scatter adds the ranks', and a rank's micro-batches pad differently), so gradients,
losses and gradient norms agree to 1e-5 relative. After several AdamW steps each weight tensor's
update agrees to 1% of its largest entry (measured: <= 0.2%, in <= 0.03% of the entries; AdamW
turns float noise in near-zero gradients into moves of up to lr). Checkpoint round trips between
1 and 2 ranks move data only: they are exact.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_sft_anchor import write_examples
from test_trainer import played, step_rows  # noqa: F401 -- `played` is a fixture used below

from evoharness.config.rl import GRPOConfig
from evoharness.config.scale import ShardConfig
from evoharness.config.sft import SFTAnchorConfig, SFTConfig
from evoharness.models.init import load_model, load_tokenizer
from evoharness.train.launch import current_group, launch_ranks
from evoharness.train.sft import train_sft
from evoharness.train.sft_anchor import SFTAnchor
from evoharness.train.sharded import ShardGroup, init_group, shard_model
from evoharness.train.sharded_checkpoint import export_hf, full_state_dict, load_sharded, save_sharded
from evoharness.train.step import plan_updates, run_updates
from evoharness.train.trainer import Trainer

# turn rows with the KL reference, the entropy bonus and the SFT anchor over two steps; tree-packed
# rows with decoupled PPO over 2 mini-batches x 2 epochs (π_prox recorded first), one of whose
# updates leaves rank 1 without rows, with activation checkpointing and gathered parameters kept
# from forward to backward
SCENARIOS = {
    "turns_kl_anchor": (
        GRPOConfig(kl_beta=0.05, entropy_coef=0.01, micro_batch_size=2, lr=1e-3),
        2,
        True,
        ShardConfig(ranks=2),
    ),
    "packed_decoupled": (
        GRPOConfig(
            packing=True,
            pack_tokens=700,
            micro_batch_size=1,
            off_policy="decoupled",
            mini_batches=2,
            epochs=2,
            kl_beta=0.0,
            lr=1e-3,
            clip_low=0.05,
            clip_high=0.05,
        ),
        1,
        False,
        ShardConfig(ranks=2, activation_checkpointing=True, reshard_after_forward=False),
    ),
}


def share(update: list, rank: int, world: int) -> list:
    """A train rank's rows of an update: whole executions, dealt round-robin in first-seen order."""
    execs = list(dict.fromkeys(r.episode_id for r in update))
    mine = set(execs[rank::world])
    return [r for r in update if r.episode_id in mine]


def grpo_run(model_dir, rows, anchor_data, name, group: ShardGroup | None):
    """One scenario on this rank (`group`) or in one process (None): the gradient of the first update's
    rows, then `steps` RL steps (`run_updates`). Returns (gradients, per-update metrics, trainer)."""
    cfg, steps, anchored, shard = SCENARIOS[name]
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir)
    ref = copy.deepcopy(model).eval() if cfg.kl_beta > 0 else None  # the KL reference: unsharded
    model.train()
    rank, world = (group.rank, group.world) if group is not None else (0, 1)
    if group is not None:
        shard_model(model, shard, group)
        assert model.is_activation_checkpointing == shard.activation_checkpointing
    updates_per_step = len(plan_updates(copy.deepcopy(rows), cfg))
    anchor = None
    if anchored:
        acfg = SFTAnchorConfig(data_path=str(anchor_data), coef=0.5, batch_tokens=1200, max_prompt_tokens=512)
        anchor = SFTAnchor(acfg, tok, seed=0, updates_per_step=updates_per_step)
    trainer = Trainer(model, tok, cfg, ref_model=ref, anchor=anchor, reducer=group)
    first = plan_updates(copy.deepcopy(rows), cfg)[0]
    trainer.accumulate(share(first, rank, world))
    grads = {n: p.grad.full_tensor() if group else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    runs = []
    for step in range(steps):
        updates = [share(u, rank, world) for u in plan_updates(copy.deepcopy(rows), cfg)]
        runs += run_updates(trainer, updates, cfg.lr, step)
    return grads, runs, trainer


def _full_optimizer_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=opts).get("state", {})  # {} off rank 0


def _grpo_ranks(model_dir: str, rows_path: str, anchor_data: str, out: str, one_rank_ckpt: str) -> None:
    """Every rank: both scenarios, a DCP checkpoint and an HF export of the first; load the one-process
    checkpoint `one_rank_ckpt` into a sharded trainer. Rank 0 writes what it gathered to `out`."""
    group, out = current_group(), Path(out)
    rows = pickle.loads(Path(rows_path).read_bytes())
    for name in SCENARIOS:
        grads, runs, trainer = grpo_run(model_dir, rows, anchor_data, name, group)
        (out / f"{name}_runs_{group.rank}.json").write_text(json.dumps(runs))
        sd = full_state_dict(trainer.model)
        if group.rank == 0:
            torch.save({"grads": grads, "weights": sd}, out / f"{name}.pt")
        if name == "turns_kl_anchor":
            moments = _full_optimizer_state(trainer.model, trainer.optimizer)
            save_sharded(out / "ckpt2", trainer.model, trainer.optimizer)
            export_hf(trainer.model, load_tokenizer(model_dir), out / "export", torch.float32)
            if group.rank == 0:
                torch.save(moments, out / "moments2.pt")
    # a one-process checkpoint into 2 ranks
    cfg = SCENARIOS["turns_kl_anchor"][0]
    model = shard_model(load_model(model_dir).train(), ShardConfig(ranks=2), group)
    trainer = Trainer(model, load_tokenizer(model_dir), cfg.model_copy(update={"kl_beta": 0.0}), reducer=group)
    load_sharded(one_rank_ckpt, model, trainer.optimizer)
    sd, moments = full_state_dict(model), _full_optimizer_state(model, trainer.optimizer)
    if group.rank == 0:
        torch.save({"weights": sd, "moments": moments}, out / "loaded1.pt")


@pytest.fixture(scope="module")
def sharded_grpo(model_dir, played, tmp_path_factory):  # noqa: F811
    """The one-process references of both scenarios and what 2 ranks did (`_grpo_ranks`)."""
    d = tmp_path_factory.mktemp("sharded_grpo")
    rows = step_rows(played)
    (d / "rows.pkl").write_bytes(pickle.dumps(rows))
    anchor_data = write_examples(d / "anchor.jsonl")
    refs = {name: grpo_run(model_dir, rows, anchor_data, name, None) for name in SCENARIOS}
    ref = refs["turns_kl_anchor"][2]
    save_sharded(d / "ckpt1", ref.model, ref.optimizer)  # one process, no process group
    launch_ranks(2, _grpo_ranks, (str(model_dir), str(d / "rows.pkl"), str(anchor_data), str(d), str(d / "ckpt1")))
    return d, refs


def _close(got: dict, want: dict, rtol: float) -> None:
    """Each tensor within `rtol` of its reference's largest entry."""
    assert got.keys() == want.keys() and want
    for k in want:
        scale = want[k].abs().max().clamp(min=1e-8)
        assert float((got[k] - want[k]).abs().max() / scale) < rtol, k


def _same_update(got: dict, want: dict, start: dict) -> None:
    """Every tensor's update (from `start`) as the reference's to 1% of the reference's largest
    update entry; the updates are real (the largest over 1e-3: lr x steps)."""
    assert got.keys() == want.keys() == start.keys()
    moved = {k: float((want[k] - start[k]).abs().max()) for k in want}
    assert max(moved.values()) > 1e-3
    for k in want:
        assert float((got[k] - want[k]).abs().max()) <= 0.01 * moved[k], k


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_ranks_train_the_one_process_weights(sharded_grpo, name):
    """Each rank backpropagates its executions' rows of every update (the token weights set over the
    whole update): the reduce-scatter SUMS the ranks' gradients (FSDP would average them), the
    clipped norm is the global one, the anchor's gradient is one rank's, and the weights after the
    step(s) are the one-process weights, with a rank whose share of an update is empty idling along."""
    d, refs = sharded_grpo
    want_grads, want_runs, trainer = refs[name]
    got = torch.load(d / f"{name}.pt")
    _close(got["grads"], want_grads, 1e-5)
    ranks = [json.loads((d / f"{name}_runs_{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(want_runs) > 1
    for j, want in enumerate(want_runs):
        parts = [ranks[r][j] for r in (0, 1)]
        assert parts[0]["grad_norm"] == parts[1]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
        assert sum(p.get("n_tokens", 0) for p in parts) == want["n_tokens"]
        assert sum(p.get("loss", 0.0) for p in parts) == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
        if "anchor_nll" in want:
            assert parts[0]["anchor_nll"] == parts[1]["anchor_nll"] == pytest.approx(want["anchor_nll"], rel=1e-5)
    if name == "packed_decoupled":  # the second mini-batch is one execution: rank 1 had no rows in it
        assert any("n_tokens" not in ranks[1][j] for j in range(len(want_runs)))
        assert sum(r["n_clipped"] for r in want_runs[1:]) > 0  # later updates moved: the clip acted
    _same_update(got["weights"], _weights(trainer.model), load_model(trainer.model.name_or_path).state_dict())


def test_checkpoints_load_at_another_world_size(sharded_grpo):
    """A DCP checkpoint written by 2 ranks loads into one process's plain model and AdamW, and one
    written by one process into 2 ranks: weights and both AdamW moments exactly as saved."""
    d, refs = sharded_grpo
    ref = refs["turns_kl_anchor"][2]
    saved2 = torch.load(d / "turns_kl_anchor.pt")["weights"]
    model = load_model(ref.model.name_or_path).train()
    plain = Trainer(model, load_tokenizer(ref.model.name_or_path), GRPOConfig(kl_beta=0.0))
    load_sharded(d / "ckpt2", model, plain.optimizer)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved2.items())
    moments2 = torch.load(d / "moments2.pt")
    loaded = _full_optimizer_state(model, plain.optimizer)
    assert loaded.keys() == moments2.keys() and len(loaded) == len(list(model.parameters()))
    for k, st in moments2.items():
        assert float(st["step"]) == float(loaded[k]["step"]) == 2.0
        for m in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[k][m], st[m]), (k, m)
    got1 = torch.load(d / "loaded1.pt")
    assert all(torch.equal(got1["weights"][k], v) for k, v in _weights(ref.model).items())
    for k, st in _full_optimizer_state(ref.model, ref.optimizer).items():
        for m in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(got1["moments"][k][m], st[m]), (k, m)


def test_hf_export_loads_with_transformers(sharded_grpo):
    """`export_hf` gathers the shards to rank 0 and writes a plain HF directory: it loads with
    `AutoModelForCausalLM.from_pretrained` (tied head included) and holds the trained weights."""
    from transformers import AutoModelForCausalLM

    d, _ = sharded_grpo
    trained = torch.load(d / "turns_kl_anchor.pt")["weights"]
    m = AutoModelForCausalLM.from_pretrained(str(d / "export"), local_files_only=True)
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    assert all(torch.equal(m.state_dict()[k], v) for k, v in trained.items())
    assert (d / "export" / "tokenizer.json").is_file() and not list(d.glob(".tmp-export-*"))


def test_sft_on_two_ranks_resumes_on_one_process(model_dir, tmp_path):
    """`train_sft` with shard.ranks = 2 (this process rank 0, with the prompt loss, whose passes make two
    head calls) trains the one-process weights; killed at step 3 (rank 0's `on_step` raises: the
    other rank is stopped), its step-2 DCP checkpoint resumes in one process to the same final model."""
    data = write_examples(tmp_path / "sft.jsonl", n_games=12)
    cfg = SFTConfig(
        max_steps=4,
        batch_tokens=2500,
        micro_batch_tokens=700,
        lr=3e-3,
        warmup_steps=1,
        ckpt_every=2,
        progress=False,
        max_prompt_tokens=512,
        prompt_loss_weight=0.3,
    )
    one = train_sft(cfg, str(data), model_dir, tmp_path / "one", eval_examples=str(data))

    def crash(step, rec):
        if step == 3:
            raise RuntimeError("killed")

    two = cfg.model_copy(update={"shard": ShardConfig(ranks=2)})
    with pytest.raises(RuntimeError, match="killed"):
        train_sft(two, str(data), model_dir, tmp_path / "two", eval_examples=str(data), on_step=crash)
    ckpt = tmp_path / "two" / "checkpoints" / "step_0000002"
    assert (ckpt / ".metadata").is_file() and len(list(ckpt.glob("*.distcp"))) == 2
    final = train_sft(cfg, str(data), model_dir, tmp_path / "two", eval_examples=str(data))  # one process
    got, want = (load_file(str(p / "model.safetensors")) for p in (final, one))
    _same_update(got, want, load_file(str(Path(model_dir) / "model.safetensors")))
    recs = [[json.loads(x) for x in open(p / "metrics.jsonl")] for p in (tmp_path / "one", tmp_path / "two")]
    assert [r["step"] for r in recs[1]] == [r["step"] for r in recs[0]]
    for a, b in zip(*recs):
        for k in ("loss", "prompt_loss", "grad_norm", "eval_loss"):
            if k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-5), k


def test_bad_input_is_refused(model_dir):
    with pytest.raises(ValueError, match="rank 2 is not in a group of 2"):
        init_group(rank=2, world=2, init_method="file:///nonexistent")
    with pytest.raises(ValueError, match="at least one rank"):
        launch_ranks(0, print)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GPU"):
            launch_ranks(2, print, device="cuda")
    alone = ShardGroup(0, 1, 0, torch.device("cpu"), None, owns_group=False)
    with pytest.raises(ValueError, match="decoder-only causal LM"):
        shard_model(torch.nn.Linear(2, 2), ShardConfig(), alone)
    frozen = load_model(model_dir)
    frozen.model.norm.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="frozen parameters"):
        shard_model(frozen, ShardConfig(), alone)
    with pytest.raises(ValueError, match="fp32 master weights"):
        shard_model(load_model(model_dir, dtype=torch.bfloat16), ShardConfig(), alone)


def _rank1_fails_after_a_collective() -> int:
    group = current_group()
    group.barrier()
    if group.rank == 1:
        raise ValueError("rank 1 fails after its last collective")
    return group.rank


def _world() -> int:
    group = current_group()
    group.barrier()
    return group.world


def test_a_rank_that_fails_after_the_last_collective_is_reported_and_ranks_that_finish_agree():
    with pytest.raises(RuntimeError, match=r"rank\(s\) exited with errors: \[\(1, 1\)\]"):
        launch_ranks(2, _rank1_fails_after_a_collective)
    assert launch_ranks(2, _world) == 2  # the failed launch left no group behind: a second one works
