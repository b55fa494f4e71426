"""The GRPO weight extrapolation (experiments/rl_levers/rl_extrapolate.py) on a real model directory
that transformers loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from experiments.rl_levers.rl_extrapolate import extrapolate


def test_extrapolation_is_sft_at_0_rl_at_1_and_loads_in_transformers(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    rl = tmp_path / "rl"
    shutil.copytree(model_dir, rl)
    w = load_file(str(rl / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    moved = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    save_file(moved, str(rl / "model.safetensors"), metadata={"format": "pt"})
    base = load_file(str(Path(model_dir) / "model.safetensors"))
    for alpha, want in ((0.0, base), (1.0, moved), (2.0, {k: 2 * moved[k] - base[k] for k in base})):
        out = extrapolate(Path(model_dir), rl, alpha, tmp_path / f"a{alpha:g}")
        got = load_file(str(out / "model.safetensors"))
        assert got.keys() == base.keys()
        assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in base), alpha
        assert (out / "config.json").read_text() == (rl / "config.json").read_text()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a2")
    assert torch.equal(model.model.embed_tokens.weight.detach(), got["model.embed_tokens.weight"])
