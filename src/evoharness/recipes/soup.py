"""A GRPO seed soup: the same RL run from one SFT model under several seeds, and the policy their
uniform weight average.

Short GRPO runs from a near-deterministic SFT policy move it along directions that depend on the
seed's samples: the same recipe won +3 / -3 or +5 / -1 valid_seen games against SFT under two seeds
(benchmarks/results/student/rl_levers_short_branch.md). Runs fine-tuned from one initialisation stay
in one linearly connected basin, so their weight average keeps what the seeds agree on and damps
what one seed's draw added (model soups, Wortsman et al. 2022, Eq. 1 with uniform weights; WARP,
Ramé et al. 2024, averages RL policies trained from one SFT model the same way). The soup costs
the seeds' RL time and nothing at inference.

Layout under ``out_dir``: ``seed<s>/`` each seed's own run (checkpoints, metrics, report);
``checkpoints/step_N`` the average of the seeds' step-N checkpoints (weights, tokenizer, experience
store: no optimizer state, so not a resume point); ``metrics.jsonl`` the seeds' records per step
(`merge_metrics`: means, and the sums of counts such as step seconds); ``final`` the average of the
seeds' final models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from evoharness.files import atomic_dir, atomic_write_text, read_jsonl
from evoharness.train.checkpoint import check_resume_config

if TYPE_CHECKING:
    from evoharness.config.rl import RLConfig

# checkpoint files that belong to one run's optimisation, not to the averaged model
_RUN_STATE = {"trainer_state.pt", "state.json", "metrics.jsonl", "job.pkl"}
# metrics that count what a step did (seconds, groups, errors): the soup's step did all its runs' steps
_SUMMED = ("timing_s/", "adv/", "rollout/env_errors")


def average_weights(dirs: list[Path], out: Path) -> Path:
    """Write the uniform weight average of Hugging Face model directories `dirs` to `out` (atomically).

    Every ``*.safetensors`` file (one file or the shards an index names) is averaged tensor by tensor
    in fp32 and stored in its original dtype; the other files (config, tokenizer, experience store)
    are copied from ``dirs[0]``, less one run's optimizer and step state. Source: model soups
    (Wortsman et al. 2022), the uniform soup of Eq. 1.

    Args:
        dirs: two or more model directories fine-tuned from one initialisation (the same files,
            tensor names and shapes).
        out: the averaged model's directory (replaced when it exists).

    Returns:
        `out`.

    Raises:
        ValueError: fewer than two directories, no weights, or directories whose weight files,
            tensor names, shapes or experience stores differ.
    """
    if len(dirs) < 2:
        raise ValueError(f"a weight average needs at least 2 model directories, got {len(dirs)}")
    shards = sorted(p.name for p in dirs[0].glob("*.safetensors"))
    if not shards:
        raise ValueError(f"no *.safetensors weights in {dirs[0]}")
    for d in dirs[1:]:
        if sorted(p.name for p in d.glob("*.safetensors")) != shards:
            raise ValueError(f"{d} holds other weight files than {dirs[0]}: not one model's runs")
    stores = {(d / "experience.json").read_bytes() if (d / "experience.json").exists() else b"" for d in dirs}
    if len(stores) > 1:  # a consolidated store is each run's own: no average of two stores exists
        raise ValueError(
            "the runs' experience stores differ (RL consolidated them): a weight average needs "
            "consolidate_experience = false"
        )

    def write(tmp: Path) -> None:
        for f in dirs[0].iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name not in _RUN_STATE:
                shutil.copy2(f, tmp / f.name)
        for name in shards:
            handles = [safe_open(str(d / name), framework="pt") for d in dirs]
            keys = sorted(handles[0].keys())
            if any(sorted(h.keys()) != keys for h in handles[1:]):
                raise ValueError(f"{name}: the runs' tensor names differ")
            avg = {}
            for k in keys:
                ts = [h.get_tensor(k) for h in handles]
                if any(t.shape != ts[0].shape for t in ts[1:]):
                    raise ValueError(f"{name}: tensor {k} has different shapes {[tuple(t.shape) for t in ts]}")
                avg[k] = (torch.stack([t.float() for t in ts]).mean(0)).to(ts[0].dtype)
            save_file(avg, str(tmp / name), metadata=handles[0].metadata() or {"format": "pt"})

    return atomic_dir(out, write)


def merge_metrics(runs: list[list[dict]]) -> list[dict]:
    """The soup's metrics records: per step logged by every run, each numeric field's mean over the
    runs, the counts of what a step did (``timing_s/*``: the runs' cost, ``adv/*`` groups, environment
    errors) their sum; other fields from the first run; plus ``soup/runs``. Steps some run did not
    log are left out."""
    by_step = [{r["step"]: r for r in recs if "step" in r} for recs in runs]
    merged = []
    for step in sorted(set.intersection(*(set(b) for b in by_step))):
        recs = [b[step] for b in by_step]
        rec = {}
        for k, v in recs[0].items():
            vals = [r.get(k) for r in recs]
            if k != "step" and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
                rec[k] = sum(vals) if k.startswith(_SUMMED) else sum(vals) / len(vals)
            else:
                rec[k] = v
        merged.append({**rec, "soup/runs": len(recs)})
    return merged


def train_soup(cfg: RLConfig, progress: bool = True) -> Path:
    """Run (or resume) ``cfg.soup_seeds`` GRPO runs with seeds ``cfg.seed, cfg.seed + 1, ...`` into
    ``out_dir/seed<s>``, then write their averages (module docstring); returns ``out_dir/final``.

    Each seed's run resumes as any run does (a finished one trains nothing again, one given more
    ``steps`` continues); ``rl_config.json`` holds the soup's config. A wall-clock cap
    (``max_minutes``) is split evenly over the seeds.

    Raises:
        ValueError: as `train_rl`; a resume with other settings (`check_resume_config`);
            `average_weights`'s errors.
    """
    from evoharness.config.rl import RLConfig
    from evoharness.eval.run_report import write_rl_report
    from evoharness.recipes.rl import train_rl

    out, n = Path(cfg.out_dir), cfg.soup_seeds
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("seed*")):  # a resume continues the same soup only
        check_resume_config(out / "rl_config.json", json.loads(cfg.model_dump_json()), RLConfig.RESUME_FREE)
    atomic_write_text(out / "rl_config.json", cfg.model_dump_json(indent=2))
    runs = []
    for seed in range(cfg.seed, cfg.seed + n):
        sub = cfg.model_copy(deep=True, update={"seed": seed, "soup_seeds": 1, "out_dir": str(out / f"seed{seed}")})
        if sub.max_minutes:
            sub.max_minutes = cfg.max_minutes / n
        train_rl(sub, progress)  # a finished seed resumes at its last step: nothing is trained again
        runs.append(Path(sub.out_dir))
    steps = set.intersection(*({p.name for p in (r / "checkpoints").glob("step_*")} for r in runs))
    for name in sorted(steps):
        if not (out / "checkpoints" / name / "config.json").exists():
            average_weights([r / "checkpoints" / name for r in runs], out / "checkpoints" / name)
    if steps:
        atomic_write_text(out / "checkpoints" / "latest", max(steps))
    metrics = merge_metrics([read_jsonl(r / "metrics.jsonl") for r in runs])
    atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in metrics))
    write_rl_report(out, out / "metrics.jsonl")
    return average_weights([r / "final" for r in runs], out / "final")
