"""Building, saving and loading models: any local HF causal-LM directory, one code path."""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import MICRO
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3ForCausalLM

from evoharness.models.init import (
    PRESETS,
    count_params,
    init_model,
    load_model,
    load_tokenizer,
    make_config,
    padded_vocab,
)


def test_presets_have_the_advertised_sizes(tokenizer):
    want = {"mini": (0.8e6, 1.4e6), "tiny": (1.5e6, 2.5e6), "small": (8e6, 12e6), "base": (25e6, 36e6)}
    for name in PRESETS:
        cfg = make_config(name, tokenizer)
        assert cfg.vocab_size == padded_vocab(len(tokenizer)) and cfg.vocab_size % 64 == 0
        with torch.device("meta"):
            n = count_params(Qwen3ForCausalLM(cfg))
        lo, hi = want[name]
        assert lo < n < hi, (name, n)


def test_a_preset_with_overridden_fields(tokenizer):
    """RunConfig.model_overrides: Qwen3Config fields over a preset's; a misspelt one is refused."""
    cfg = make_config({**PRESETS["mini"], "head_dim": 64}, tokenizer)
    with torch.device("meta"):
        m = Qwen3ForCausalLM(cfg)
    assert m.model.layers[0].self_attn.q_proj.weight.shape == (4 * 64, 128)
    with pytest.raises(ValueError, match="head_dims"):
        make_config({**PRESETS["mini"], "head_dims": 64}, tokenizer)


def test_init_is_seeded(tokenizer):
    a, b, c = (init_model(MICRO, tokenizer, seed=s) for s in (1, 1, 2))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])


def test_save_load_gives_identical_logits(tmp_path, tokenizer):
    model = init_model(MICRO, tokenizer, tmp_path / "m", seed=3)
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= files
    assert json.loads((tmp_path / "m/config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    again = load_model(tmp_path / "m", "cpu", "float32")
    assert again.config._attn_implementation == "sdpa"
    ids = torch.tensor([tokenizer.encode("You arrive at fridge 1. The fridge 1 is closed.")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    tok = load_tokenizer(tmp_path / "m")
    assert tok.encode("go to fridge 1") == tokenizer.encode("go to fridge 1")


def test_load_any_local_hf_causal_lm_directory(tmp_path, tokenizer):
    """A directory written by plain transformers (another architecture, bf16
    weights) loads through the same function; nothing is fetched."""
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ref.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    m = load_model(tmp_path / "llama", "cpu", "bfloat16")
    assert type(m).__name__ == "LlamaForCausalLM" and m.dtype == torch.bfloat16
    ids = torch.tensor([[5, 9, 13, 21]])
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    assert load_model(tmp_path / "llama").dtype == torch.float32  # default on CPU: fp32
    with pytest.raises(FileNotFoundError):
        load_model("Qwen/Qwen3-8B")  # a hub name is not a local directory
