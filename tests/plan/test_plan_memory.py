"""The memory planner's numbers against real models: parameter counts (loaded models, peft's
trainable count), activation bytes (what a real forward pass saves for backward), FSDP sharding,
and the placement of cells and roles on devices."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from evoharness.config.base import load_config
from evoharness.config.rl import RLConfig
from evoharness.config.scale import QWEN3_LORA_TARGETS
from evoharness.config.sft import SFTConfig
from evoharness.plan import memory
from evoharness.plan.layouts import LAYOUTS, Layout, resolve_layout
from evoharness.plan.planner import plan_rl, plan_sft


def _hf_config(lay: Layout, vocab: int | None = None) -> Qwen3Config:
    cfg = Qwen3Config(
        vocab_size=vocab or lay.vocab,
        hidden_size=lay.hidden,
        num_hidden_layers=lay.layers,
        num_attention_heads=lay.heads,
        num_key_value_heads=lay.kv_heads,
        head_dim=lay.head_dim,
        intermediate_size=lay.intermediate,
        tie_word_embeddings=lay.tied,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def _terms(plan, device: int = 0) -> dict[str, float]:
    """what -> bytes of the first process on `device`."""
    owner = next(iter(plan.devices[device].owners.values()))
    return {t.what: t.bytes for t in owner.terms}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_named_layouts_count_the_parameters_of_the_model_they_describe(name):
    lay = LAYOUTS[name]
    with torch.device("meta"):  # the real module tree, no memory
        model = Qwen3ForCausalLM(_hf_config(lay))
    assert lay.params() == _numel(model)


def test_a_model_directory_gives_its_exact_parameter_count(model_dir):
    from evoharness.models.init import load_model

    lay = resolve_layout(model_dir, "qwen3-8b")  # config.json wins over the named layout
    n = _numel(load_model(model_dir, "cpu", torch.float32))
    assert lay.name == str(model_dir) and lay.params() == n
    cfg = RLConfig(model_path=str(model_dir), grpo={"kl_beta": 0.01})
    t = _terms(plan_rl(cfg, 20.0))
    assert t["parameters (fp32 masters)"] == 4 * n
    assert t["gradients (fp32)"] == 4 * n
    assert t["optimizer state (AdamW m, v)"] == 8 * n
    assert t["parameters (frozen)"] == 4 * n  # the KL reference in the CPU compute dtype, fp32


@pytest.mark.parametrize(
    "r, targets", [(8, QWEN3_LORA_TARGETS), (4, ["q_proj", "v_proj"]), (2, ["down_proj", "lm_head"])]
)
def test_lora_adapter_count_equals_pefts_trainable_parameters(model_dir, r, targets):
    import peft

    from evoharness.models.init import load_model

    model = load_model(model_dir, "cpu", torch.float32)
    peft_model = peft.get_peft_model(model, peft.LoraConfig(r=r, target_modules=targets))
    trainable, _ = peft_model.get_nb_trainable_parameters()
    lay = resolve_layout(model_dir, None)
    assert lay.lora_params(r, targets) == trainable
    cfg = RLConfig(model_path=str(model_dir), lora={"r": r, "target_modules": targets}, grpo={"kl_beta": 0.01})
    t = _terms(plan_rl(cfg, 20.0))
    assert t["parameters (adapters, fp32)"] + t["gradients (adapters, fp32)"] == 8 * trainable
    assert t["optimizer state (AdamW)"] == 8 * trainable
    assert "parameters (frozen)" not in t  # the reference is the base with adapters off: no copy


def test_an_unknown_lora_target_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="qkv_proj.*known"):
        LAYOUTS["qwen3-0.6b"].lora_params(8, ["qkv_proj"])


def _saved_activation_bytes(lay: Layout, rows: int, seq: int, dtype: torch.dtype) -> float:
    """Bytes a real forward pass saves for backward (distinct storages), parameters and
    autocast's casts of the weights (the planner's "compute copies") excluded."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(_hf_config(lay, vocab=256)).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape[::-1]) for p in model.parameters()} | {tuple(p.shape) for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        is_weight_cast = t.dtype == torch.bfloat16 and t.dim() == 2 and tuple(t.shape) in weight_shapes
        if ptr not in params and not is_weight_cast:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 256, (rows, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            model.model(input_ids=ids, use_cache=False)
    return float(sum(saved.values()))


@pytest.mark.parametrize(
    "lay",
    [
        Layout("a", 256, 3, 4, 2, 64, 1024, 256, True),
        Layout("b", 512, 2, 8, 4, 64, 1536, 256, True),
    ],
)
@pytest.mark.parametrize("dtype, compute_bytes", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_activation_estimate_matches_what_a_forward_pass_saves(lay, dtype, compute_bytes):
    rows, seq = 3, 37  # 111 tokens: no 2D activation [tokens, features] has a weight's shape
    measured = _saved_activation_bytes(lay, rows, seq, dtype)
    est = memory.activations(lay, rows, seq, 0, compute_bytes, checkpointing=False, padded=False)[0].bytes
    assert abs(est - measured) / measured < 0.05, (est, measured)


def test_checkpointing_keeps_layer_inputs_and_one_layer():
    lay = LAYOUTS["qwen3-8b"]
    off = memory.activations(lay, 1, 4096, 0, 2, checkpointing=False, padded=False)[0].bytes
    on = memory.activations(lay, 1, 4096, 0, 2, checkpointing=True, padded=False)[0].bytes
    per_layer = memory.layer_activation_bytes(lay, 2) * 4096
    assert on == pytest.approx(off - (lay.layers - 1) * per_layer + lay.layers * 4096 * 4 * lay.hidden)
    assert on < off / 10


def test_fsdp_divides_the_sharded_terms_by_the_ranks():
    def cfg(cells: int) -> RLConfig:
        return load_config(
            RLConfig,
            overrides=[
                'layout="qwen3-8b"',
                'device="cuda"',
                f"runtime.cells={cells}",
                'runtime.backend="local"',
                "runtime.gpus_per_cell=1",
                'runtime.trainer="fsdp"',
                "grpo.kl_beta=0.01",
            ],
        )

    one, four = _terms(plan_rl(cfg(1), 140.0)), _terms(plan_rl(cfg(4), 140.0))
    for what in ("parameters (fp32 masters)", "gradients (fp32)", "optimizer state (AdamW m, v)"):
        assert four[what] == pytest.approx(one[what] / 4)
    assert four["parameters (frozen)"] == one["parameters (frozen)"]  # the KL reference stays whole
    assert four["activations (checkpointing off)"] == one["activations (checkpointing off)"]
    assert "gathered units (FSDP2)" in four and "gathered units (FSDP2)" not in one
    sft = {r: _terms(plan_sft(SFTConfig(device="cuda", shard={"ranks": r}, layout="qwen3-4b"), 80.0)) for r in (1, 8)}
    assert sft[8]["optimizer state (AdamW m, v)"] == pytest.approx(sft[1]["optimizer state (AdamW m, v)"] / 8)


def test_async_cells_split_roles_and_single_keeps_adam_on_the_core():
    cfg = load_config(
        RLConfig,
        overrides=[
            'layout="qwen3-0.6b"',
            'device="cuda"',
            'runtime.schedule="async"',
            "runtime.cells=4",
            'runtime.backend="local"',
            "runtime.gpus_per_cell=1",
            "runtime.async_train_cells=2",
            'runtime.trainer="single"',
        ],
    )
    plan = plan_rl(cfg, 80.0)
    cells = [_terms(plan, d) for d in range(4)]
    assert "optimizer state (AdamW m, v)" in cells[0] and "optimizer state (AdamW m, v)" not in cells[1]
    assert "gradients (fp32)" in cells[1]  # a train cell that sends its gradient to the core
    assert all("KV cache" not in c for c in cells[:2]) and all("weights (fp32 policy)" in c for c in cells[2:])


def test_a_cells_gpus_slice_places_its_reference_on_its_second_gpu():
    cfg = load_config(
        RLConfig,
        overrides=[
            'layout="qwen3-1.7b"',
            'device="cuda"',
            'ref_device="cuda:1"',
            "runtime.cells=2",
            'runtime.backend="local"',
            "runtime.gpus_per_cell=2",
            'runtime.trainer="allreduce"',
        ],
    )
    plan = plan_rl(cfg, 80.0)
    assert plan.needed_devices == 4
    assert ["parameters (frozen)" in _terms(plan, d) for d in range(4)] == [False, True, False, True]
    assert not plan_rl(cfg, 80.0, devices=2).fits  # two devices short


def test_a_process_peak_takes_its_largest_phase_and_a_device_sums_its_processes():
    cfg = RLConfig(layout="qwen3-0.6b", device="cpu", runtime={"cells": 2, "backend": "local"}, eval_every=0)
    plan = plan_rl(cfg, 64.0)
    host = plan.devices[0]
    for o in host.owners.values():
        always = sum(t.bytes for t in o.terms if t.phase == "always")
        phases = [sum(t.bytes for t in o.terms if t.phase == p) for p in ("train", "rollout")]
        assert o.peak == pytest.approx(always + max(phases))
    assert host.total == pytest.approx(sum(o.peak for o in host.owners.values()))
    assert set(host.owners) == {"cell 0", "cell 1", "driver"}


def test_the_call_batch_cap_is_the_runtimes():
    from evoharness.plan.planner import MAX_CALL_BATCH
    from evoharness.runtime.cell import MAX_CALL_BATCH as RUNTIME_MAX_CALL_BATCH

    assert MAX_CALL_BATCH == RUNTIME_MAX_CALL_BATCH


def _vllm_cfg(share: float) -> RLConfig:
    return load_config(
        RLConfig,
        overrides=[
            'layout="qwen3-8b"',
            'device="cuda"',
            "runtime.cells=2",
            'runtime.backend="local"',
            "runtime.gpus_per_cell=1",
            'runtime.rollout_engine="vllm"',
            f"runtime.vllm_gpu_memory_utilization={share}",
            "grpo.kl_beta=0",
            "max_prompt_tokens=8192",
        ],
    )


def test_vllm_takes_its_whole_share_and_a_share_without_room_for_a_sequence_is_refused():
    plan = plan_rl(_vllm_cfg(0.5), 140.0)
    engine = [t for t in next(iter(plan.devices[0].owners.values())).terms if t.role == "rollout engine"]
    assert sum(t.bytes for t in engine) == pytest.approx(0.5 * 140.0 * memory.GIB)
    assert any("planned at 0.50" in n for n in plan.notes)
    small = plan_rl(_vllm_cfg(0.12), 140.0)  # 16.8 GiB: the 8B weights and workspace leave no KV cache
    assert not small.fits and "vLLM refuses to start" in small.verdict
    cpu = load_config(RLConfig, overrides=['layout="qwen3-0.6b"', 'runtime.rollout_engine="vllm"'])
    terms = _terms(plan_rl(cpu, 64.0))
    assert terms["KV cache (vllm_cpu_kv_cache_gib)"] == cpu.runtime.vllm_cpu_kv_cache_gib * memory.GIB
