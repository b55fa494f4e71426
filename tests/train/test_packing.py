"""Tree packing is exact: on a real micro Qwen3 and real ALFWorld BPE episodes played by
the model itself, packed log-probs, losses and gradients equal those of unpacked rows."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from evoharness.config.rl import GRPOConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import load_model, load_tokenizer
from evoharness.policies.local import LocalHFPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.rollout.tree import TrajectoryTree, all_paths, select_paths
from evoharness.train.grpo import TokenMasks, logprobs_of
from evoharness.train.packing import collate, pack_trees, packed_sft_loss, sft_trees, target_logprobs
from evoharness.train.sft import collate as sft_collate
from evoharness.train.sft import completion_loss
from evoharness.train.step import plan_updates, run_updates, set_token_weights, step_stats, turn_rows, update_metrics
from evoharness.train.trainer import Trainer
from evoharness.train.tree_loss import packed_rows_accumulate


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def play(model_dir, constrained: bool):
    """Three real BPE episodes (4 turns each) sampled from the micro model at T=1."""
    policy = LocalHFPolicy(
        model_dir,
        temperature=1.0,
        max_new_tokens=10 if not constrained else 24,
        max_prompt_tokens=4096,
        seed=1,
        constrained=constrained,
    )
    tasks = discover_games("valid_seen")[:3]
    specs = [EpisodeSpec(t, f"{t.task_id}#0", seed=i) for i, t in enumerate(tasks)]
    trajs = run_episodes(
        specs, lambda t: make_env(t, engine="fast"), lambda: BPEHarness(ExperienceStore()), policy, max_steps=4
    )
    assert all(len(t.turns) == 4 and t.turns[0].completion_token_ids for t in trajs)
    assert all((t.constraint is not None) == constrained for tr in trajs for t in tr.turns)
    return trajs, TokenMasks(policy.tokenizer, policy.model.get_output_embeddings().weight.shape[0])


@pytest.fixture(scope="module")
def episodes(model_dir):
    return play(model_dir, constrained=False)[0]


@pytest.fixture(scope="module")
def constrained(model_dir):
    return play(model_dir, constrained=True)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(a, b, rtol=1e-4):
    assert a.keys() == b.keys() and a
    for n in a:
        scale = b[n].abs().max().clamp(min=1e-8)
        assert float((a[n] - b[n]).abs().max() / scale) < rtol, n


def _rows(episodes, adv, cfg=None, step=0):
    """The step's turn rows (`train.step.turn_rows`), trajectory i in GRPO group i."""
    return [
        r for i, (t, a) in enumerate(zip(episodes, adv)) for r in turn_rows(t, a, cfg or GRPOConfig(), step, group=i)
    ]


def test_alfworld_episodes_share_their_prompt_prefix(episodes):
    for traj in episodes:
        tree = TrajectoryTree.from_trajectory(traj)
        assert len(tree.calls) == 4 and tree.n_trainable == sum(len(t.completion_token_ids) for t in traj.turns)
        assert tree.n_tokens < tree.n_call_tokens()  # the system prompt and objective are stored once
        for i, turn in enumerate(traj.turns):
            assert tree.call_sequence(i) == (turn.prompt_token_ids, turn.completion_token_ids)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpacked_rows(model_dir, episodes, attn):
    model = load_model(model_dir)
    model.config._attn_implementation = attn  # eager gets the additive float mask
    trees = [TrajectoryTree.from_trajectory(t) for t in episodes]
    batch = collate(trees, pack_trees(trees))
    assert batch.input_ids.shape[0] == 1 and batch.input_ids.shape[1] == sum(t.n_tokens for t in trees)
    with torch.no_grad():
        packed, _ = target_logprobs(model, batch, temperature=0.7)
        want = {}
        for ti, traj in enumerate(episodes):
            turns = traj.turns
            ref = logprobs_of(model, [t.prompt_token_ids for t in turns], [t.completion_token_ids for t in turns], 0.7)
            for ci, turn in enumerate(turns):
                for j in range(len(turn.completion_token_ids)):
                    want[(ti, ci, j)] = float(ref[ci, j])
    got = {}
    for k in range(batch.n_targets):
        ti, nid, off, g = (int(x[k]) for x in (batch.tree, batch.node, batch.offset, batch.gen_call))
        pos = trees[ti].depth(nid) + off - trees[ti].calls[g].n_prompt
        got[(ti, g, pos)] = float(packed[k])
    assert got.keys() == want.keys()
    assert max(abs(got[k] - want[k]) for k in want) < 1e-5


def test_eager_with_a_boolean_mask_would_be_wrong(model_dir, episodes):
    """Why packing picks the mask type per kernel (machine-notes.md)."""
    model = load_model(model_dir)
    model.config._attn_implementation = "eager"
    trees = [TrajectoryTree.from_trajectory(episodes[0])]
    batch = collate(trees, pack_trees(trees))
    with torch.no_grad():
        right, _ = target_logprobs(model, batch)
        hidden = model.get_decoder()(
            input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=batch.attention_mask("bool")
        ).last_hidden_state
        wrong = torch.log_softmax(model.lm_head(hidden[batch.pred_row, batch.pred_pos]), -1)
        wrong = wrong.gather(-1, batch.targets[:, None])[:, 0]
    assert float((right - wrong).abs().max()) > 1e-2


def test_packed_sft_loss_and_gradients_equal_unpacked(model_dir, episodes):
    rows = [(t.prompt_token_ids + t.completion_token_ids, len(t.prompt_token_ids)) for tr in episodes for t in tr.turns]
    model = load_model(model_dir)
    model.train()
    loss, n = completion_loss(model, *sft_collate(rows, pad_id=0))
    loss.backward()
    ref_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    tree = sft_trees(rows)
    batch = collate([tree], pack_trees([tree], max_tokens=None))
    ploss, pn = packed_sft_loss(model, batch)
    ploss.backward()
    assert pn == n and float(ploss.detach()) == pytest.approx(float(loss.detach()), rel=1e-5)
    _assert_grads_close(_grads(model), ref_grads)
    assert batch.input_ids.numel() < sum(len(r[0]) for r in rows)  # shared prefixes ran once


@pytest.mark.parametrize("pack_tokens,micro_batch_size", [(100_000, 1), (900, 1), (900, 3)])
def test_packed_trainer_equals_turn_rows(model_dir, constrained, pack_tokens, micro_batch_size):
    """The trainer's tree-packed rows (per-turn advantages, KL to a reference, entropy, the
    constrained sampler's masks replayed) give the turn-row loss and gradient, however the trees
    are cut into packed rows and micro-batches."""
    episodes, masks = constrained
    model = load_model(model_dir)
    ref_model = copy.deepcopy(model).eval()
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    cfg = GRPOConfig(
        kl_beta=0.05, entropy_coef=0.01, temperature=1.0, micro_batch_size=micro_batch_size, pack_tokens=pack_tokens
    )
    episodes = copy.deepcopy(episodes)
    for traj in episodes:  # make the ratio move off 1 so the clip is exercised
        for t in traj.turns:
            t.logprobs = [x + 0.3 * ((i % 3) - 1) for i, x in enumerate(t.logprobs)]
    adv = [[1.5 - 0.1 * k for k in range(4)], [-0.5] * 4, [0.25, 0.0, -0.25, 1.0]]
    samples = _rows(episodes, adv)
    assert len(samples) == 12
    set_token_weights(samples)
    want = Trainer(model, masks.tokenizer, cfg, ref_model=ref_model).accumulate(samples)
    want_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    packed = cfg.model_copy(update={"packing": True})
    got = Trainer(model, masks.tokenizer, packed, ref_model=ref_model).accumulate(samples)
    assert want["n_forced"] > 0 and got["n_forced"] == want["n_forced"]
    with pytest.raises(ValueError, match="TokenMasks"):
        packed_rows_accumulate(model, samples, packed, ref_model)
    for key in ("loss", "pg_loss", "kl", "entropy", "ratio_sum"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert got["n_tokens"] == want["n_tokens"] and want["n_clipped"] > 0
    assert got["n_clipped"] == want["n_clipped"]
    _assert_grads_close(_grads(model), want_grads)
    # 3 executions that share nothing: 3 packed rows or more (the cost model and the budget cut
    # trees where sharing does not pay), shared prefixes run once
    assert got["rows"] >= 3
    assert got["packed_tokens"] < sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)


def test_j_max_trains_fewer_tokens_each_once(model_dir, episodes):
    trees = [TrajectoryTree.from_trajectory(t) for t in episodes]
    for j_max in (1, 2):
        sels = [select_paths(t, j_max, seed=3) for t in trees]
        assert all(len(s.leaves) == j_max for s in sels)
        batch = collate(trees, pack_trees(trees, sels, max_tokens=700))
        keys = list(zip(batch.tree.tolist(), batch.node.tolist(), batch.offset.tolist()))
        assert len(keys) == len(set(keys)) == sum(s.n_tokens for s in sels)  # shared prefixes train once
        assert sum(s.n_tokens for s in sels) < sum(t.n_trainable for t in trees)
    full = collate(trees, pack_trees(trees, [all_paths(t) for t in trees]))
    assert full.n_targets == sum(t.n_trainable for t in trees)


def test_cost_model_packs_only_what_shares_enough():
    tree = TrajectoryTree("c")
    tree.add_call(list(range(1, 401)), [500, 501])  # path A: 402 tokens
    tree.add_call(list(range(1, 401)), [600, 601])  # path B: shares A's 400-token prompt
    tree.add_call([1] + list(range(1000, 1400)), [700])  # path C: shares one token
    rows = pack_trees([tree], alpha=960.0)  # the 'tiny' preset's ratio
    assert [len(r.segments) for r in rows] == [4, 2]  # "1", A's prompt rest, A, B | "1", C
    assert rows[1].n_tokens == 402
    assert len(pack_trees([tree])) == 1  # no cost model, no budget: one row
    assert len(pack_trees([tree], alpha=1e6)) == 1  # a big model: one shared token already pays
    assert len(pack_trees([tree], max_tokens=1)) == 3  # one row per path
    batch = collate([tree], pack_trees([tree], alpha=960.0))
    assert batch.n_targets == 5  # the shared "1" is context in both rows; every completion token once


class _L2Anchor:
    """An SFT anchor (`train.sft_anchor.SFTAnchor`'s interface) adding the gradient of a small L2
    term, logging the update it was called for."""

    def __init__(self):
        self.calls = []

    def for_step(self, model, step, amp=None):
        def anchor(j: int) -> dict[str, float]:
            self.calls.append(j)
            (1e-3 * sum((p**2).sum() for p in model.parameters())).backward()
            return {"anchor_nll": 0.0}

        return anchor


@pytest.mark.parametrize("epochs", [1, 2])
def test_packed_step_equals_turn_row_step_with_mini_batches(model_dir, constrained, epochs):
    """Two updates (mini-batches of whole groups) per epoch, each with the anchor's gradient: the
    weights after a packed step equal a turn-row step's (SGD: Adam's g/sqrt(v) would blow float
    noise in near-zero gradients up to a full step)."""
    episodes, masks = constrained
    cfg = GRPOConfig(lr=0.5, kl_beta=0.0, mini_batches=2, epochs=epochs, clip_low=0.05, clip_high=0.05)
    adv = [[1.0] * 4, [-1.0] * 4, [0.5] * 4]
    out = {}
    for packing in (False, True):
        model = load_model(model_dir)
        anchor = _L2Anchor()
        trainer = Trainer(model, masks.tokenizer, cfg.model_copy(update={"packing": packing}), anchor=anchor)
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        updates = plan_updates(_rows(episodes, adv), cfg)
        runs = run_updates(trainer, updates, cfg.lr, step=0)
        out[packing] = (update_metrics(step_stats(runs)), model, anchor.calls)
    (want, a, calls_a), (got, b, calls_b) = out[False], out[True]
    assert got["train/updates"] == want["train/updates"] == 2 * epochs
    assert got["train/n_tokens"] == want["train/n_tokens"]
    assert calls_a == calls_b == list(range(2 * epochs))
    assert got["train/clip_fraction"] == pytest.approx(want["train/clip_fraction"]) and want["train/clip_fraction"] > 0
    assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-4)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-4), n


def test_j_max_rows_are_the_selected_calls_and_pack_to_their_loss(model_dir, episodes):
    """ALFWorld trees are stars (each turn re-renders its prompt): a selected path is one call, so
    `turn_rows` with J_max keeps exactly the turns whose calls the dedup sampling selected, and
    their packed loss equals their turn-row loss."""
    model = load_model(model_dir)
    cfg = GRPOConfig(kl_beta=0.0, entropy_coef=0.0, j_max=2)
    adv = [[1.0] * 4, [-2.0] * 4, [0.5] * 4]
    samples = _rows(episodes, adv, cfg, step=11)
    trees = [TrajectoryTree.from_trajectory(t) for t in episodes]
    sels = [select_paths(t, 2, seed=11) for t in trees]
    picked = [t.call_sequence(c) for t, s in zip(trees, sels) for leaf in s.leaves for c in t.nodes[leaf].ends]
    assert len(samples) == 6
    assert sorted((s.prompt_ids, s.completion_ids) for s in samples) == sorted(picked)
    assert len(_rows(episodes, adv, cfg, step=12)) == 6 and len(_rows(episodes, adv)) == 12
    set_token_weights(samples)
    tok = load_tokenizer(model_dir)
    unpacked = Trainer(model, tok, cfg).accumulate(samples)
    want_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    got = Trainer(model, tok, cfg.model_copy(update={"packing": True})).accumulate(samples)
    assert got["n_tokens"] == unpacked["n_tokens"]
    assert got["loss"] == pytest.approx(unpacked["loss"], rel=1e-4, abs=1e-7)
    _assert_grads_close(_grads(model), want_grads)


def test_chat_history_tree_logprobs_equal_each_calls_own_row(model_dir):
    """A chain (answers re-rendered into the next prompt) with a sub-agent branch and a summary:
    every generated token's packed log-prob equals the one from its own call's unpacked row."""
    from evoharness.models.init import load_tokenizer

    tok, model = load_tokenizer(model_dir), load_model(model_dir)

    def ids(messages, answer):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"], tok(answer + "<|im_end|>", add_special_tokens=False)[
            "input_ids"
        ]

    tree = TrajectoryTree("chat")
    msgs = [{"role": "system", "content": "You are in a kitchen."}, {"role": "user", "content": "find a mug"}]
    for k, obs in enumerate(["You see a cabinet 1.", "The cabinet 1 is open.", "You see a mug 2."]):
        answer = f"<think>step {k}</think><action>go to cabinet {k + 1}</action>"
        tree.add_call(*ids(msgs, answer), None)
        msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": obs}]
    tree.add_call(
        *ids(msgs + [{"role": "user", "content": "Summarise."}], "The mug 2 is in cabinet 3."), None, role="summary"
    )
    tree.add_call(
        *ids([{"role": "system", "content": "You search."}, {"role": "user", "content": "mug"}], "cabinet"),
        None,
        role="subagent",
    )
    assert tree.n_tokens < tree.n_call_tokens() / 2  # the history is stored once
    batch = collate([tree], pack_trees([tree]))
    with torch.no_grad():
        packed, _ = target_logprobs(model, batch)
        for g in range(len(tree.calls)):
            prompt, comp = tree.call_sequence(g)
            own = logprobs_of(model, [prompt], [comp])[0]
            sel = batch.gen_call == g
            assert int(sel.sum()) == len(comp)
            pos = [
                tree.depth(n) + o - tree.calls[g].n_prompt
                for n, o in zip(batch.node[sel].tolist(), batch.offset[sel].tolist())
            ]
            assert torch.allclose(packed[sel], own[pos], atol=1e-5)


def test_packed_sft_trains_repeated_and_alike_completions_as_unpacked_rows(model_dir, episodes):
    """SFT rows repeated in a batch, or whose completions start alike, share their positions in
    the tree; each row's completion tokens still count (one target per row), as unpacked."""
    rows = [(t.prompt_token_ids + t.completion_token_ids, len(t.prompt_token_ids)) for t in episodes[0].turns]
    ids, n_prompt = rows[0]
    rows += [rows[0], rows[1], (ids[:-2], n_prompt), (ids[:-1] + [ids[-1] + 1], n_prompt)]
    model = load_model(model_dir)
    loss, n = completion_loss(model, *sft_collate(rows, pad_id=0))
    loss.backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    tree = sft_trees(rows)
    batch = collate([tree], pack_trees([tree]))
    ploss, pn = packed_sft_loss(model, batch)
    ploss.backward()
    assert pn == n and float(ploss.detach()) == pytest.approx(float(loss.detach()), rel=1e-5)
    _assert_grads_close(_grads(model), want)


def test_packed_sft_micro_batches_match_one_unpacked_step(model_dir, episodes):
    from evoharness.train.packing import packed_sft_micro

    rows = [(t.prompt_token_ids + t.completion_token_ids, len(t.prompt_token_ids)) for tr in episodes for t in tr.turns]
    model = load_model(model_dir)
    loss, n = completion_loss(model, *sft_collate(rows, pad_id=0))
    (loss / n).backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    total, ran = 0.0, 0
    for part, n_run in packed_sft_micro(model, rows, max_tokens=1200, pad_id=0):
        (part / n).backward()
        total, ran = total + float(part.detach()), ran + n_run
    assert total == pytest.approx(float(loss.detach()), rel=1e-5)
    assert ran < sum(len(r[0]) for r in rows)
    _assert_grads_close(_grads(model), want)


def test_rl_with_packing_makes_the_turn_trainers_update(model_dir, tmp_path):
    """`evoharness rl` with grpo.packing takes the same step as turn rows, also with the turn
    sampler's cap (packing only saves forward/backward work)."""
    from safetensors.torch import load_file

    from evoharness.config.rl import RLConfig
    from evoharness.recipes.rl import train_rl

    def cfg(out, **grpo):
        c = RLConfig(
            model_path=str(model_dir),
            out_dir=str(out),
            steps=1,
            max_steps=3,
            max_new_tokens=10,
            max_prompt_tokens=1024,
            decode_threads=1,
            seed=3,
        )
        c.grpo.group_size, c.grpo.prompts_per_step, c.grpo.lr, c.grpo.kl_beta = 2, 1, 1e-3, 0.0
        for k, v in grpo.items():
            setattr(c.grpo, k, v)
        return c

    runs = {
        name: train_rl(cfg(tmp_path / name, **kw), progress=False)
        for name, kw in (
            ("rows", {}),
            ("packed", {"packing": True}),
            ("rows2", {"max_train_turns": 2}),
            ("packed2", {"packing": True, "max_train_turns": 2}),
        )
    }
    start = load_file(str(model_dir / "model.safetensors"))
    recs = {n: json.loads((tmp_path / n / "metrics.jsonl").read_text().splitlines()[0]) for n in runs}
    for rows, packed in (("rows", "packed"), ("rows2", "packed2")):
        a, b = load_file(str(runs[rows] / "model.safetensors")), load_file(str(runs[packed] / "model.safetensors"))
        assert any(not torch.equal(a[k], start[k]) for k in a)  # it moved
        for k in a:
            assert torch.allclose(a[k], b[k], atol=1e-5), k
        assert recs[packed]["train/rows"] >= 1 and "train/rows" not in recs[rows]
        assert recs[packed]["train/n_tokens"] == recs[rows]["train/n_tokens"] > 0
        assert recs[packed]["train/loss"] == pytest.approx(recs[rows]["train/loss"], rel=1e-4, abs=1e-7)
    assert recs["rows2"]["train/n_tokens"] < recs["rows"]["train/n_tokens"]  # at most 2 of 3 turns each


def test_sft_with_packing_reaches_the_same_weights(model_dir, episodes, tmp_path):
    from safetensors.torch import load_file

    from evoharness.config.sft import SFTConfig
    from evoharness.train.sft import train_sft

    examples = [
        {"messages": t.messages, "completion": t.completion or "<action>look</action>"}
        for tr in episodes
        for t in tr.turns
    ]
    finals = {}
    for packing in (False, True):
        cfg = SFTConfig(
            lr=1e-3,
            max_steps=2,
            batch_tokens=6000,
            warmup_steps=0,
            progress=False,
            ckpt_every=0,
            packing=packing,
            micro_batch_tokens=2500 if packing else None,
        )
        finals[packing] = load_file(
            str(train_sft(cfg, examples, model_dir, tmp_path / str(packing)) / "model.safetensors")
        )
    ran = [
        json.loads(ln)["tokens"]
        for ln in (tmp_path / "True" / "metrics.jsonl").read_text().splitlines()
        if "tokens" in json.loads(ln)
    ]
    padded = [
        json.loads(ln)["tokens"]
        for ln in (tmp_path / "False" / "metrics.jsonl").read_text().splitlines()
        if "tokens" in json.loads(ln)
    ]
    assert len(ran) == len(padded) == 2 and sum(ran) < sum(padded)
    start = load_file(str(model_dir / "model.safetensors"))
    assert any(not torch.equal(start[k], finals[True][k]) for k in start)  # it trained
    for k, v in finals[False].items():
        assert torch.allclose(v, finals[True][k], atol=1e-5), k
