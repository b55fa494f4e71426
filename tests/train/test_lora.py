"""LoRA through peft (`train.lora`) on a real micro Qwen3 model (tests/micro_model.py): only the
adapters train, the KL reference is the base with its adapters off, the merged export is a plain
Hugging Face model, a weights sync moves the adapters alone, and SFT and RL run and resume with it."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from evoharness.config.rl import GRPOConfig
from evoharness.config.scale import LoRAConfig, ShardConfig
from evoharness.config.sft import SFTConfig
from evoharness.models.adapters import adapter_parameters
from evoharness.models.init import load_model, load_tokenizer
from evoharness.train.grpo import TurnSample, logprobs_of
from evoharness.train.lora import apply_lora
from evoharness.train.sft import train_sft
from evoharness.train.step import streamed_rows
from evoharness.train.trainer import Trainer

LORA = LoRAConfig(r=4, alpha=8.0)


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _rows(model, tokenizer, n: int = 4, seed: int = 0) -> list[TurnSample]:
    """`n` turns of random tokenizer ids, their behaviour log-probs under `model`, advantages ±1."""
    rng = random.Random(seed)
    vocab = len(tokenizer)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(5, 12))] for _ in range(n)]
    comps = [[rng.randrange(vocab) for _ in range(rng.randint(3, 6))] for _ in range(n)]
    with torch.no_grad():
        lp = logprobs_of(model, prompts, comps)
    rows = [
        TurnSample(p, c, lp[i, : len(c)].tolist(), 1.0 if i % 2 else -1.0, f"e{i}")
        for i, (p, c) in enumerate(zip(prompts, comps))
    ]
    return streamed_rows(rows, n)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _base_tensors(model) -> dict[str, torch.Tensor]:
    adapters = set(adapter_parameters(model))
    return {k: v.clone() for k, v in model.state_dict().items() if k not in adapters}


@pytest.mark.parametrize("packing", [False, True])
def test_grpo_step_with_kl_trains_only_the_adapters(model_dir, packing):
    """A GRPO `Trainer` with kl_beta > 0 over a LoRA model, the reference its adapters-off view:
    AdamW holds exactly the adapters, the base weights stay bit-identical over two steps, the
    adapters move, the tied embeddings stay tied, and the KL term is 0 before the first update
    (a fresh adapter is the base) and > 0 after it."""
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, "cpu", torch.float32)
    lora = apply_lora(model, LORA, seed=0)
    adapters = adapter_parameters(model)
    assert adapters and all(p.requires_grad and p.dtype == torch.float32 for p in adapters.values())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == list(adapters)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    base = _base_tensors(model)
    trainer = Trainer(model, tok, GRPOConfig(kl_beta=0.5, lr=1e-2, packing=packing), ref_model=lora.reference())
    assert {id(p) for g in trainer.optimizer.param_groups for p in g["params"]} == {id(p) for p in adapters.values()}
    rows = _rows(model, tok)

    kls = []
    for step in range(2):
        kls.append(trainer.accumulate(rows)["kl"])
        assert trainer.apply(1e-2, step)["grad_norm"] > 0
    assert kls[0] == 0.0 and kls[1] > 0  # the reference is the base, the policy moved away from it
    state = trainer.optimizer.state
    assert len(state) == len(adapters) and all(state[p]["exp_avg"].abs().sum() > 0 for p in adapters.values())
    after = _base_tensors(model)
    assert after.keys() == base.keys() and all(torch.equal(after[k], base[k]) for k in base)
    assert any(n.endswith("lora_B.default.weight") and p.abs().sum() > 0 for n, p in adapters.items())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p.requires_grad for p in adapters.values()) and model.training  # the reference restored both


def test_reference_is_the_base_model_and_the_adapted_model_differs(model_dir):
    """log-probs under the adapters-off reference equal a separately loaded base model's exactly,
    through the model call and through the decoder + output head the losses use; the adapted
    model's differ once its adapters are not zero."""
    tok = load_tokenizer(model_dir)
    plain = load_model(model_dir, "cpu", torch.float32)
    model = load_model(model_dir, "cpu", torch.float32)
    lora = apply_lora(model, LORA, seed=1)
    with torch.no_grad():
        for n, p in adapter_parameters(model).items():
            if "lora_B" in n:
                p.normal_(0.0, 0.05)  # as after training
    rows = _rows(plain, tok, n=3, seed=4)
    prompts, comps = [r.prompt_ids for r in rows], [r.completion_ids for r in rows]
    ref = lora.reference()
    with torch.no_grad():
        base_lp, ref_lp, adapted_lp = (logprobs_of(m, prompts, comps) for m in (plain, ref, model))
    assert torch.equal(ref_lp, base_lp)
    assert (adapted_lp - base_lp).abs().max() > 1e-3
    ids = torch.tensor([prompts[0]])
    assert torch.equal(ref(input_ids=ids).logits, _logits(plain, ids))
    assert ref.config is model.config and ref.get_output_embeddings().weight is model.lm_head.weight


def test_merged_export_is_a_plain_model_with_the_adapted_logits(model_dir, tmp_path):
    """`LoRAModel.export`: a Hugging Face directory that `AutoModelForCausalLM` loads without peft
    and whose logits equal the adapted model's (1e-5), tied embeddings kept tied; ``adapter/``
    holds peft's adapter files, which rebuild the same model on a fresh base. The trained model is
    left as it was."""
    from peft import PeftModel

    model = load_model(model_dir, "cpu", torch.float32)
    lora = apply_lora(model, LORA, seed=2)
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0.0, 0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[3, 17, 99, 250, 7, 41, 600, 12]])
    want = _logits(model, ids)
    lora.export(tmp_path / "out", torch.float32)

    assert (_logits(lora.merged(), ids) - want).abs().max() < 1e-5  # in memory, as exported
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    assert not any("lora" in k or "base_layer" in k for k in merged.state_dict())
    assert merged.lm_head.weight is merged.model.embed_tokens.weight
    assert (_logits(merged, ids) - want).abs().max() < 1e-5
    assert (_logits(merged, ids) - _logits(load_model(model_dir), ids)).abs().max() > 1e-3  # not the base
    assert {p.name for p in (tmp_path / "out" / "adapter").iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    rebuilt = PeftModel.from_pretrained(load_model(model_dir), str(tmp_path / "out" / "adapter"))
    assert (_logits(rebuilt, ids) - want).abs().max() < 1e-5
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_bad_targets_and_mismatched_adapters_are_named(model_dir, tmp_path):
    model = load_model(model_dir)
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] match no module.*q_proj"):
        apply_lora(model, LoRAConfig(r=4, target_modules=["q_proj", "qkv_proj"]))
    with pytest.raises(ValueError, match=r"\['embed_tokens'\] adapt the tied"):
        apply_lora(model, LoRAConfig(r=4, target_modules=["embed_tokens"]))
    with pytest.raises(ValueError, match="r > 0"):
        apply_lora(model, LoRAConfig(r=0))
    apply_lora(model, LORA).save_adapter(tmp_path / "a")
    with pytest.raises(ValueError, match="'r': 4.*'r': 8"):
        apply_lora(load_model(model_dir), LoRAConfig(r=8), adapter_dir=tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        apply_lora(load_model(model_dir), LORA, adapter_dir=tmp_path)
    sharded = SFTConfig(max_steps=1, progress=False).model_copy(update={"lora": LORA, "shard": ShardConfig(ranks=2)})
    with pytest.raises(ValueError, match="sharded ranks is not supported"):
        train_sft(sharded, _sft_examples(), model_dir, tmp_path / "sharded")


def test_adapter_only_sync_makes_another_cell_equal_and_a_save_resumes(model_dir, tmp_path):
    """Two `ModelCell`s of LoRA `EngineCell`s: the core trains a step and publishes weights v1,
    which hold only the adapter tensors; the other cell loads v1 and then equals the core (every
    tensor, every logit). A LoRA checkpoint (`save`: merged weights + ``adapter/`` + optimizer) starts
    a cell with the base from model_path, the trained adapters and the AdamW moments."""
    from evoharness.recipes.engine_cell import EngineCellFactory
    from evoharness.runtime.cell import ModelCell, WeightStore, load_sync_tensors

    make = EngineCellFactory(str(model_dir), GRPOConfig(kl_beta=0.1, lr=1e-2), lora=LORA, seed=7)
    store = WeightStore(tmp_path / "weights")
    core, other = ModelCell(0, make, store), ModelCell(1, make, store)
    rows = _rows(core.parts.model, core.parts.tokenizer)
    core.submit("train", 1, {"version": 0, "rows": rows})
    core.submit(
        "step", 2, {"version": 0, "plan": {"updates": [], "lr": 1e-2, "step": 0, "scale": 1.0}, "publish": True}
    )
    core.ready()
    assert core.ready()[0][0] == "step"
    published = load_file(str(store.path(1)))
    assert set(published) == set(adapter_parameters(core.parts.model))
    ids = torch.tensor([rows[0].prompt_ids])
    assert not torch.equal(_logits(other.parts.model, ids), _logits(core.parts.model, ids))
    other.submit("load", 3, 1)
    assert other.ready() == [("load", 3, 1)]
    a, b = core.parts.model.state_dict(), other.parts.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(_logits(other.parts.model, ids), _logits(core.parts.model, ids))

    core.parts.save(str(tmp_path / "ckpt"), optimizer=True)
    assert {"model.safetensors", "adapter", "trainer_state.pt"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}
    again = make(0, str(tmp_path / "ckpt"))
    c = again.model.state_dict()
    assert c.keys() == a.keys() and all(torch.equal(c[k], a[k]) for k in a)
    st, st1 = core.parts.trainer.state_dict()["state"], again.trainer.state_dict()["state"]
    assert st.keys() == st1.keys() and all(torch.equal(st[i]["exp_avg"], st1[i]["exp_avg"]) for i in st)
    with pytest.raises(KeyError, match="not this model's weights"):  # a full model's tensors
        load_sync_tensors(again.model, load_file(str(model_dir / "model.safetensors")), "base")


def _sft_examples(n: int = 8) -> list[dict]:
    rooms = ["fridge 1", "cabinet 4", "sinkbasin 1", "microwave 1", "countertop 2", "drawer 3"]
    return [
        {
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": f"OBJECTIVE: find item {i}\nOBSERVATION: you see {rooms[i % 6]}."},
            ],
            "completion": f"<think>try {rooms[(i + 1) % 6]}</think><action>go to {rooms[(i + 1) % 6]}</action>",
        }
        for i in range(n)
    ]


class _Interrupt(Exception):
    pass


def test_sft_with_lora_trains_adapters_exports_merged_and_resumes(model_dir, tmp_path):
    """`train_sft` with lora.r > 0 (adapter dropout on, so the resumed RNG matters): loss falls, a
    checkpoint holds adapter files (no model weights), ``final/`` is the merged model (loads with
    transformers, differs from the base) with ``final/adapter/``; a run interrupted after its
    step-2 checkpoint resumes to the uninterrupted run's exact adapters and losses."""
    cfg = SFTConfig(
        lr=1e-2, max_steps=4, warmup_steps=1, batch_tokens=300, ckpt_every=2, progress=False, seed=3
    ).model_copy(update={"lora": LoRAConfig(r=4, alpha=8.0, dropout=0.1)})
    ref = train_sft(cfg, _sft_examples(), model_dir, tmp_path / "ref")
    losses = [json.loads(ln)["loss"] for ln in (tmp_path / "ref/metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and losses[-1] < losses[0]
    ckpt = tmp_path / "ref/checkpoints/step_0000002"
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= {p.name for p in ckpt.iterdir()}
    assert not list(ckpt.glob("model*.safetensors"))
    assert (ref / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(ref, local_files_only=True)
    ids = torch.tensor([[5, 9, 33, 70]])
    assert (_logits(merged, ids) - _logits(load_model(model_dir), ids)).abs().max() > 1e-4

    def crash_at_3(step, _rec):
        if step == 3:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        train_sft(cfg, _sft_examples(), model_dir, tmp_path / "run", on_step=crash_at_3)
    out = train_sft(cfg, _sft_examples(), model_dir, tmp_path / "run")
    a, b = (load_file(str(d / "adapter" / "adapter_model.safetensors")) for d in (ref, out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    resumed = [json.loads(ln)["loss"] for ln in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert resumed == losses


def _rl_config(model_dir, out, steps: int = 2, **runtime):
    """tests/rl_cells.py's small RL run with LoRA adapters and the KL term on."""
    from rl_cells import rl_config

    cfg = rl_config(model_dir, out, steps=steps, **runtime)
    cfg.lora = LoRAConfig(r=4, alpha=16.0)
    cfg.grpo.kl_beta = 0.2
    cfg.threads = 1  # the module fixture's run and the test's resumed runs reduce in the same order
    return cfg


@pytest.fixture(scope="module")
def lora_rl(model_dir, tmp_path_factory):
    """`evoharness rl` in process with lora.r > 0 for 2 steps, evaluating after step 2: (out, final)."""
    from evoharness.recipes.rl import train_rl

    out = tmp_path_factory.mktemp("lora_rl")
    cfg = _rl_config(model_dir, out)
    cfg.eval_every, cfg.eval_limit = 2, 1  # the periodic evaluation loads the published adapters
    return out, train_rl(cfg, progress=False)


def test_rl_with_lora_runs_in_process_and_resumes(lora_rl, model_dir, tmp_path):
    """The in-process run logs a KL and an evaluation; its checkpoints and ``final/`` are merged
    models with ``adapter/``, only adapted weights moved; a 1-step run extended to 2 steps resumes
    from its checkpoint's adapters and optimizer state to the same final weights."""
    from rl_cells import metrics

    from evoharness.recipes.rl import train_rl

    out, final = lora_rl
    recs = metrics(out)
    assert [r["step"] for r in recs] == [1, 2] and recs[0]["train/n_tokens"] > 0 and recs[1]["train/kl"] > 0
    assert recs[1]["eval/n"] == 1
    assert (final / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "checkpoints/step_0000002/adapter/adapter_config.json").is_file()
    w, base = load_file(str(final / "model.safetensors")), load_file(str(model_dir / "model.safetensors"))
    assert w.keys() == base.keys()
    assert torch.equal(w["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # not adapted
    assert not torch.equal(w["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])

    train_rl(_rl_config(model_dir, tmp_path / "b", 1), progress=False)
    resumed = train_rl(_rl_config(model_dir, tmp_path / "b", 2), progress=False)
    r = load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(r[k], w[k]) for k in w)


def test_rl_with_lora_on_two_elastic_cell_processes_trains_the_inprocess_weights(lora_rl, model_dir, tmp_path):
    """2 cell processes on the elastic schedule (cells switch roles; a rollout cell loads the newest
    adapters on a switch): every published weights file holds adapter tensors only, and the run
    trains the in-process run's steps and weights (to the float noise of another batching)."""
    from rl_cells import assert_same_steps, assert_same_update, metrics

    from evoharness.recipes.rl import train_rl

    ref_out, ref_final = lora_rl
    out = tmp_path / "elastic"
    final = train_rl(_rl_config(model_dir, out, schedule="elastic", cells=2), progress=False)
    assert json.loads((out / "runtime.json").read_text())["runtime/switches"] > 0
    published = sorted((out / "runtime" / "weights").glob("v*.safetensors"))
    assert published and all(all("lora_" in k for k in load_file(str(p))) for p in published)
    assert_same_steps(metrics(out), metrics(ref_out))
    assert_same_update(final, load_file(str(ref_final / "model.safetensors")), model_dir)


def test_the_static_decoder_refuses_adapters_and_auto_picks_the_hf_engine(model_dir):
    from evoharness.engines import Engine, make_engine
    from evoharness.engines.decoder import StaticKVDecoder

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    apply_lora(model, LoRAConfig(r=4))
    assert "LoRA" in StaticKVDecoder.unsupported(model)  # it would decode with the base weights alone
    with pytest.raises(ValueError, match="LoRA"):
        make_engine("static", model, tok)
    assert isinstance(make_engine("auto", model, tok), Engine)
