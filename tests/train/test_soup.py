"""A GRPO seed soup (`recipes.soup`): each seed's real RL run, the policy their weight average, the
soup's checkpoints and metrics, resume, and the refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from pydantic import ValidationError
from rl_cells import metrics, rl_config
from safetensors.torch import load_file, save_file

from evoharness.config.rl import RLConfig
from evoharness.recipes.rl import train_rl
from evoharness.recipes.soup import average_weights


def test_soup_is_the_average_of_its_seeds_runs(model_dir, tmp_path):
    cfg = rl_config(model_dir, tmp_path / "soup", steps=1)  # seed 3: the soup's runs are seeds 3 and 4
    cfg.consolidate_experience, cfg.soup_seeds = False, 2
    final = train_rl(cfg, progress=False)

    out = tmp_path / "soup"
    assert final == out / "final"
    a, b = (load_file(out / f"seed{s}" / "final" / "model.safetensors") for s in (3, 4))
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the seeds sampled and trained differently
    soup = load_file(final / "model.safetensors")
    assert soup.keys() == a.keys()
    for k in a:
        assert torch.allclose(soup[k], (a[k].float() + b[k].float()).div(2).to(a[k].dtype), atol=1e-6), k

    ck = out / "checkpoints" / "step_0000001"
    ca, cb = (load_file(out / f"seed{s}" / "checkpoints" / ck.name / "model.safetensors") for s in (3, 4))
    soup_ck = load_file(ck / "model.safetensors")
    assert all(torch.allclose(soup_ck[k], (ca[k] + cb[k]) / 2, atol=1e-6) for k in ca)
    assert (out / "checkpoints" / "latest").read_text() == ck.name
    assert not (ck / "trainer_state.pt").exists()  # one seed's optimizer is not the soup's
    assert (ck / "experience.json").read_bytes() == (out / "seed3" / "final" / "experience.json").read_bytes()

    (ra,), (rb,), (rs,) = metrics(out / "seed3"), metrics(out / "seed4"), metrics(out)
    assert rs["step"] == 1 and rs["soup/runs"] == 2
    assert rs["success"] == pytest.approx((ra["success"] + rb["success"]) / 2)
    assert rs["timing_s/step"] == pytest.approx(ra["timing_s/step"] + rb["timing_s/step"])  # the soup's cost
    assert rs["adv/signal_groups"] == ra["adv/signal_groups"] + rb["adv/signal_groups"]
    assert (out / "report.md").is_file()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final)  # a standard HF model directory
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()

    # a rerun resumes: finished seeds train nothing again, the soup is the same
    train_rl(cfg, progress=False)
    assert len(metrics(out / "seed3")) == len(metrics(out / "seed4")) == len(metrics(out)) == 1
    assert all(torch.equal(load_file(final / "model.safetensors")[k], soup[k]) for k in soup)
    # ... and only the same soup: another setting is refused before any seed runs
    cfg.grpo.lr = 2e-3
    with pytest.raises(ValueError, match="another run"):
        train_rl(cfg, progress=False)


def test_a_soup_with_a_consolidated_store_is_refused(model_dir, tmp_path):
    with pytest.raises(ValidationError, match="consolidate_experience = false"):
        RLConfig(model_path=str(model_dir), out_dir=str(tmp_path), soup_seeds=2)  # consolidation is on by default


def test_average_weights_keeps_the_dtype_and_refuses_other_models(model_dir, tmp_path):
    w = load_file(model_dir / "model.safetensors")
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d, scale in zip(dirs, (1.0, 3.0)):
        shutil.copytree(model_dir, d)
        save_file(
            {k: (v.float() * scale).to(torch.bfloat16) for k, v in w.items()},
            d / "model.safetensors",
            metadata={"format": "pt"},
        )
        (d / "trainer_state.pt").write_bytes(b"one run's optimizer")
    avg = load_file(average_weights(dirs, tmp_path / "avg") / "model.safetensors")
    for k, v in w.items():
        assert avg[k].dtype == torch.bfloat16
        assert torch.allclose(avg[k].float(), 2 * v.float(), rtol=2e-2, atol=1e-3), k
    config = json.loads((model_dir / "config.json").read_text())
    assert json.loads((tmp_path / "avg" / "config.json").read_text()) == config
    assert (tmp_path / "avg" / "tokenizer.json").is_file() and not (tmp_path / "avg" / "trainer_state.pt").exists()

    with pytest.raises(ValueError, match="at least 2"):
        average_weights(dirs[:1], tmp_path / "one")
    k = next(iter(w))
    shutil.copytree(model_dir, tmp_path / "other")
    save_file({**w, k: torch.zeros(3, 3)}, tmp_path / "other" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="different shapes"):
        average_weights([dirs[0], tmp_path / "other"], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # nothing half-written
