"""Student levers (issue 11): each lever as a controlled comparison of the main job's SFT stages.

Usage:
    python -m experiments.student_levers.student_levers [--arms base,batch4k,...] [--parallel 2]
                                                        [--out runs/levers] [--results benchmarks/results/student]

Every arm is one `evoharness run` (the main job, `pipeline.run_pipeline`) at a reduced
scale with GRPO skipped, differing from the reference arm in one lever only; all arms
share the seed, the teacher traces (540 train games, the 60 development games held
out), the tokenizer and the initial weights. Levers that change how much is trained
(batch size, packing) are compared at an equal number of training tokens (equal wall
time on a quiet machine); the others at equal optimizer steps. Choices are made on the
development games; valid_seen is reported beside them and never used to choose.

Each arm runs as its own process (OMP_NUM_THREADS=1, `threads=1`), at most
``--parallel`` at once. An arm whose directory already holds a report is not rerun
(a rerun resumes unfinished ones). Writes ``levers.md`` and ``levers.json`` to
``--results`` with every finished arm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the reduced scale of every arm (the dev subset and the valid_seen prefix are balanced across types)
SCALE = [
    "skip_rl=true",
    "curve_games=0",
    "dev_eval_limit=30",
    "eval_limit=42",
    "sft.ckpt_every=0",
    "sft.progress=false",
    "threads=1",
]
NO_PROMPT_LOSS = "sft.prompt_loss_weight=0"  # the arms measured before the prompt loss became the default
REF_STEPS = 60  # the reference arm's SFT optimizer steps at 16K-token batches

# name -> (lever, what differs, overrides)
ARMS: dict[str, tuple[str, str, list[str]]] = {
    "base": (
        "reference",
        f"{REF_STEPS} steps x 16K tokens, no DAgger",
        [f"sft.max_steps={REF_STEPS}", "sft.batch_tokens=16384", NO_PROMPT_LOSS, "dagger_rounds=0"],
    ),
    "batch4k": (
        "steps vs batch size",
        f"{4 * REF_STEPS} steps x 4K tokens (same tokens)",
        [f"sft.max_steps={4 * REF_STEPS}", "sft.batch_tokens=4096", NO_PROMPT_LOSS, "dagger_rounds=0"],
    ),
    "dagger": (
        "DAgger",
        f"{REF_STEPS * 2 // 3} + {REF_STEPS // 3} steps x 16K; 1 round on 80 train games",
        [
            f"sft.max_steps={REF_STEPS * 2 // 3}",
            "sft.batch_tokens=16384",
            NO_PROMPT_LOSS,
            "dagger_rounds=1",
            "dagger_games=80",
            f"dagger_sft_steps={REF_STEPS // 3}",
        ],
    ),
    "dagger4k": (
        "DAgger (4K batches)",
        f"{4 * REF_STEPS * 2 // 3} + {4 * REF_STEPS // 3} steps x 4K; 1 round on 80 games",
        [
            f"sft.max_steps={4 * REF_STEPS * 2 // 3}",
            "sft.batch_tokens=4096",
            NO_PROMPT_LOSS,
            "dagger_rounds=1",
            "dagger_games=80",
            f"dagger_sft_steps={4 * REF_STEPS // 3}",
        ],
    ),
    "packing4k": (
        "shared-prefix packing",
        f"{4 * REF_STEPS} steps x 4K tokens, sft.packing=true",
        [
            f"sft.max_steps={4 * REF_STEPS}",
            "sft.batch_tokens=4096",
            NO_PROMPT_LOSS,
            "dagger_rounds=0",
            "sft.packing=true",
            "sft.micro_batch_tokens=4096",
        ],
    ),
    "lr_const4k": (
        "lr schedule",
        f"{4 * REF_STEPS} steps x 4K, constant lr (min_lr_ratio=1)",
        [
            f"sft.max_steps={4 * REF_STEPS}",
            "sft.batch_tokens=4096",
            NO_PROMPT_LOSS,
            "dagger_rounds=0",
            "sft.min_lr_ratio=1.0",
        ],
    ),
    "tiny4k": (
        "model size",
        f"{4 * REF_STEPS} steps x 4K, 'tiny' (1.8M) instead of 'mini' (1.1M)",
        [
            f"sft.max_steps={4 * REF_STEPS}",
            "sft.batch_tokens=4096",
            NO_PROMPT_LOSS,
            "dagger_rounds=0",
            'model_preset="tiny"',
        ],
    ),
    "batch4k_x2": (
        "steps vs batch size (2x scale)",
        f"{8 * REF_STEPS} steps x 4K tokens",
        [f"sft.max_steps={8 * REF_STEPS}", "sft.batch_tokens=4096", NO_PROMPT_LOSS, "dagger_rounds=0"],
    ),
    "dagger4k_x2": (
        "DAgger (4K batches, 2x scale)",
        f"{8 * REF_STEPS * 2 // 3} + {8 * REF_STEPS // 3} steps x 4K; 1 round on 80 games",
        [
            f"sft.max_steps={8 * REF_STEPS * 2 // 3}",
            "sft.batch_tokens=4096",
            NO_PROMPT_LOSS,
            "dagger_rounds=1",
            "dagger_games=80",
            f"dagger_sft_steps={8 * REF_STEPS // 3}",
        ],
    ),
    "prompt_loss4k": (
        "prompt loss",
        f"{4 * REF_STEPS} steps x 4K, + prompt-token loss x 2 (sft.prompt_loss_weight=2)",
        [f"sft.max_steps={4 * REF_STEPS}", "sft.batch_tokens=4096", "dagger_rounds=0", "sft.prompt_loss_weight=2.0"],
    ),
    "prompt_loss4k_x2": (
        "prompt loss (2x scale)",
        f"{8 * REF_STEPS} steps x 4K, sft.prompt_loss_weight=2",
        [f"sft.max_steps={8 * REF_STEPS}", "sft.batch_tokens=4096", "dagger_rounds=0", "sft.prompt_loss_weight=2.0"],
    ),
    "default_sft_old": (
        "the previous main job's SFT stage",
        "2000 steps x 4K, no prompt loss: full scale",
        [NO_PROMPT_LOSS],
    ),
    "default_sft": ("the main job's SFT stage", "RunConfig defaults: full scale", []),
}


# The reading of the committed table (benchmarks/results/student/levers.md), kept beside it.
READING = [
    "Train minutes were measured at load averages from 2 to 13 (other engineers' jobs): compare speeds with "
    "`step_costs.md` (controlled, alternating), not with this column.",
    "Steps vs batch size: at equal training tokens, 4K-token batches (4x the optimizer steps) beat 16K-token "
    "batches on dev action accuracy, 15.9% vs 6.6%; doubling the 4K run to 480 steps gives 27.7%. Kept: 4K batches.",
    "Packing: the same dev accuracy as unpacked (15.9%: the same update), but slower per step at 4K batches "
    "(step_costs.md: 0.52-0.53 vs 0.45-0.46 s). Kept off.",
    "DAgger (one round, a third of the steps on teacher + student-state labels): 13.7% vs 15.9% at 240 steps and "
    "23.3% vs 27.7% at 480 steps on dev action accuracy; dev success 0 for both at both scales (the student "
    "won 0 of 80 train games in its DAgger rollouts, agreeing with the teacher on 0% and 26% of its turns). "
    "Not a win at these scales, so the default has no DAgger round (`dagger_rounds=1` turns it on); "
    "its real test needs a student that already wins some games (the full-scale run).",
    "The previous default SFT stage (default_sft_old: 2000 steps x 4K, 17 min at load ~2.5): 16.7% valid_seen "
    "(7/42), 10.0% dev (3/30) on these subsets: far below the issue's 60% goal; success is still climbing "
    "with steps (0 -> 2.4 -> 16.7% at 240 / 480 / 2000 steps).",
    "Prompt loss (`sft.prompt_loss_weight=2`: the step also minimises twice the next-token loss on the prompt "
    "tokens): at equal steps and tokens it beats completion-only SFT on dev action accuracy, 21.9% vs 15.9% at 240 "
    "steps and 52.9% vs 27.7% at 480 (dev success 3.3% vs 0%). The weight: prompt_loss_sweep.md. Kept: the new "
    "default; it costs 10% more per step (step_costs.md: 0.49-0.51 vs 0.45-0.46 s). The rows before it were "
    "measured with `prompt_loss_weight=0` (completion only), as their overrides now say.",
    "default_sft_old is the previous default at full scale (2000 steps, no prompt loss). The new default at full "
    "scale (4000 steps, prompt loss 2, 2 threads) is the main job itself: 57.9% valid_seen (81/140), 36.7% dev "
    "(22/60), benchmarks/results/main_job/report.md; its `default_sft` arm here (1 thread, subsets) was not run.",
    "Full-scale levers (whole main jobs: more SFT steps, every ALFWorld train game, GRPO with the experience "
    "store fixed vs consolidated): full_scale.md (`python -m experiments.student_levers.student_full_scale`).",
    "Not measured (time on the shared machine): lr schedule, model size (arm `tiny4k` is defined), GRPO lr "
    "decay / KL target, games per step.",
]


def run_arm(name: str, out: Path) -> subprocess.Popen | None:
    d = out / name
    if (d / "report.md").is_file():
        return None
    d.mkdir(parents=True, exist_ok=True)
    sets = [x for o in SCALE + ARMS[name][2] for x in ("--set", o)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(d / "run.log", "a")
    return subprocess.Popen(
        [sys.executable, "-m", "evoharness.cli", "run", "--out", str(d), *sets],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def dev_teacher_states(out: Path, n_games: int = 30) -> list[dict]:
    """The teacher's states on the first `n_games` development games (SFT example dicts),
    collected once into ``out/dev_teacher.jsonl`` (never trained on)."""
    from evoharness.config.base import load_config
    from evoharness.files import read_jsonl
    from evoharness.pipeline import RunConfig, dev_teacher_examples
    from evoharness.rollout.collect import write_jsonl_atomic

    path = out / "dev_teacher.jsonl"
    if not path.is_file():
        cfg = load_config(RunConfig, None, SCALE)
        examples = dev_teacher_examples(
            cfg, next(out.glob("*/experience.json")), out / "dev_teacher_traces.jsonl", n_games
        )
        write_jsonl_atomic(path, examples)
    return read_jsonl(path)


def action_accuracy(model_dir: Path, examples: list[dict]) -> float:
    """Fraction of teacher states where the model's greedy, constrained action is the teacher's
    (a cheap proxy that still moves while success is 0 at this scale)."""
    from evoharness.config.policy import PolicyConfig
    from evoharness.harness.base import split_completion
    from evoharness.policies.base import PolicyRequest
    from evoharness.policies.factory import make_policy

    def admissible(e: dict) -> list[str]:
        line = next(x for x in e["messages"][-1]["content"].splitlines() if x.startswith("ADMISSIBLE COMMANDS: "))
        return line[len("ADMISSIBLE COMMANDS: ") :].split(", ")

    pol = make_policy(
        PolicyConfig(
            kind="hf", model_path=str(model_dir), constrained=True, max_tokens=48, max_prompt_tokens=1024, num_threads=1
        )
    )
    right = 0
    try:
        for i in range(0, len(examples), 64):
            chunk = examples[i : i + 64]
            comps = pol.act(
                [
                    PolicyRequest(
                        messages=e["messages"], episode_id=f"acc{i + j}", turn=0, admissible_commands=admissible(e)
                    )
                    for j, e in enumerate(chunk)
                ]
            )
            right += sum(
                split_completion(c.text)[1].strip() == split_completion(e["completion"])[1].strip()
                for c, e in zip(comps, chunk)
            )
    finally:
        pol.close()
    return right / len(examples)


def arm_row(name: str, d: Path) -> dict | None:
    if not (d / "report.md").is_file():
        return None
    model = "sft" if (d / "eval" / "sft").is_dir() else None
    if model is None:
        return None
    vs = json.loads((d / "eval" / "sft" / "summary.json").read_text())["overall"]
    dev = json.loads((d / "eval" / "dev_sft" / "summary.json").read_text())["overall"]
    times = {m.name[1:-5]: float(m.read_text() or 0) for m in d.glob(".*.done")}
    train_s = sum(v for k, v in times.items() if k.startswith(("sft", "dagger")))
    steps = tokens = 0
    for m in sorted(d.glob("sft*/metrics.jsonl")):
        recs = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
        recs = [r for r in recs if "loss" in r]
        steps += len(recs)
        tokens += sum(r["tokens"] for r in recs)
    acc_file = d / "dev_action_accuracy.json"
    if not acc_file.is_file():
        final = sorted(d.glob("sft*/final"))[-1]
        acc_file.write_text(
            json.dumps({"model": str(final), "accuracy": action_accuracy(final, dev_teacher_states(d.parent))})
        )
    acc = json.loads(acc_file.read_text())["accuracy"]
    return {
        "arm": name,
        "lever": ARMS[name][0],
        "setting": ARMS[name][1],
        "optimizer_steps": steps,
        "dev_action_acc": acc,
        "train_tokens": tokens,
        "train_min": round(train_s / 60, 1),
        "dev_success": dev["success"],
        "dev_n": dev["n"],
        "dev_stopped": dev.get("stopped_early", 0),
        "vs_success": vs["success"],
        "vs_n": vs["n"],
        "vs_stopped": vs.get("stopped_early", 0),
        "eval_min": round(sum(v for k, v in times.items() if k.startswith("eval_") and "sft" in k) / 60, 1),
    }


def write_table(out: Path, results: Path) -> list[dict]:
    rows = [r for name in ARMS if (r := arm_row(name, out / name))]
    results.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    md = [
        "# Student levers (issue 11)",
        "",
        f"Scale: every arm is the main job's SFT stage(s) from the same from-scratch 'mini' model "
        f"(unless the arm says otherwise), teacher traces on the 540 training games, seed 0, GRPO skipped; "
        f"evaluated greedy, constrained, cap 50, early stop after 3 repeated (prompt, completion) pairs, on the "
        f"first 30 development games (5 per type; held-out train games: choices are made here) and the first 42 "
        f"valid_seen games (reported only). One thread per arm, 2 arms at once on a shared 2-core machine "
        f"(load average {load:.1f} when this table was written): minutes are this machine's, not a quiet one's.",
        "",
        "Dev action accuracy: the share of the teacher's states on those 30 development games (its own episodes, "
        "never trained on) where the model's greedy constrained action is the teacher's: a cheap proxy that moves "
        "while success is still 0 at this scale.",
        "",
        "| arm | lever | setting | opt. steps | train tokens (M) | train min | dev action acc. | dev success | "
        "valid_seen success | stopped early (dev / vs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['arm']} | {r['lever']} | {r['setting']} | {r['optimizer_steps']} | {r['train_tokens'] / 1e6:.1f} | "
            f"{r['train_min']} | {100 * r['dev_action_acc']:.1f}% | **{r['dev_success']}%** ({r['dev_n']}) | "
            f"{r['vs_success']}% ({r['vs_n']}) | "
            f"{r['dev_stopped']} / {r['vs_stopped']} |"
        )
    md += (
        [
            "",
            "Command: `python -m experiments.student_levers.student_levers --arms <names>`; per-arm runs under "
            "`runs/levers/<arm>/`.",
            "",
            "## Reading",
            "",
        ]
        + [f"- {x}" for x in READING]
        + [""]
    )
    (results / "levers.md").write_text("\n".join(md))
    (results / "levers.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(md))
    return rows


def check_early_stop(arm_dir: Path, results: Path, n_games: int = 30) -> None:
    """Play the first `n_games` development games with the arm's SFT model and the teacher,
    with and without early stopping (stop_repeats 3 vs 0); write early_stop.md/.json with
    the won games of each (the rule must never stop an episode that would still be won)."""
    from evoharness.config.base import load_config
    from evoharness.eval.evaluate import evaluate
    from evoharness.pipeline import RunConfig, dev_split, eval_config, model_policy

    cfg = load_config(RunConfig, None, [f'out_dir="{arm_dir}"', *SCALE])
    dev = [t.task_id for t in dev_split(cfg)[1]][:n_games]
    rows = []
    for system, pol in (
        ("scripted teacher", cfg.teacher),
        ("SFT student", model_policy(cfg, arm_dir / "sft" / "final")),
    ):
        res = {}
        for k in (3, 0):
            c = eval_config(
                cfg.model_copy(update={"stop_repeats": k}),
                arm_dir,
                f"stopcheck/{system[:3]}_{k}",
                pol,
                arm_dir / "experience.json",
                dev,
            )
            s = evaluate(c, progress=False)
            eps = [json.loads(x) for x in (Path(c.out_dir) / "episodes.jsonl").read_text().splitlines() if x.strip()]
            res[k] = {
                "won": sorted(e["task_id"] for e in eps if e["won"]),
                "turns": sum(len(e["turns"]) for e in eps),
                "stopped": s["overall"].get("stopped_early", 0),
                "wall_s": s["wall_s"],
            }
        rows.append(
            {
                "system": system,
                "games": len(dev),
                "won_with_stop": len(res[3]["won"]),
                "won_without": len(res[0]["won"]),
                "same_wins": res[3]["won"] == res[0]["won"],
                "stopped": res[3]["stopped"],
                "turns_with_stop": res[3]["turns"],
                "turns_without": res[0]["turns"],
                "wall_s_with_stop": res[3]["wall_s"],
                "wall_s_without": res[0]["wall_s"],
            }
        )
    md = [
        "# Early stopping of repeated-state loops: does it ever stop a game that would be won?",
        "",
        f"First {len(dev)} development games, greedy, constrained, cap 50; model: `{arm_dir}/sft/final`. "
        "Rule: end an episode once the same (prompt, completion) pair has occurred 3 times.",
        "",
        "| system | won with rule | won without | same games won | stopped early | turns with / without | "
        "wall s with / without |",
        "|---|---|---|---|---|---|---|",
    ]
    md += [
        f"| {r['system']} | {r['won_with_stop']}/{r['games']} | {r['won_without']}/{r['games']} | {r['same_wins']} | "
        f"{r['stopped']} | {r['turns_with_stop']} / {r['turns_without']} | {r['wall_s_with_stop']:.0f} / "
        f"{r['wall_s_without']:.0f} |"
        for r in rows
    ]
    md += ["", f"Command: `python -m experiments.student_levers.student_levers --check-stop {arm_dir}`", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "early_stop.md").write_text("\n".join(md))
    (results / "early_stop.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(md))


def step_costs(out: Path, results: Path, steps: int = 25) -> None:
    """Seconds per SFT optimizer step of the main job's SFT config ('mini', 4K-token batches):
    the default (prompt loss) at 1 and 2 torch threads, and completion-only unpacked vs packed
    at 1 thread; median of steps 6..N, the settings alternated twice; written to step_costs.md."""
    import shutil
    import statistics

    import torch

    from evoharness.pipeline import RunConfig
    from evoharness.train.sft import train_sft

    settings = [
        ("default (prompt loss 2)", {}, 1),
        ("default (prompt loss 2)", {}, 2),
        ("completion only, unpacked", {"prompt_loss_weight": 0.0}, 1),
        ("completion only, packed", {"prompt_loss_weight": 0.0, "packing": True}, 1),
    ]
    base = _sweep_base(out)
    rows, load0 = [], os.getloadavg()[0]
    for name, update, threads in settings + settings:
        torch.set_num_threads(threads)
        cfg = RunConfig().sft.model_copy(update={"max_steps": steps, "ckpt_every": 0, "progress": False, **update})
        d = out / "_steps"
        shutil.rmtree(d, ignore_errors=True)
        train_sft(cfg, base / "sft_examples.jsonl", base / "model_init", d)
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        dts = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(recs, recs[1:])][5:]
        rows.append((name, threads, statistics.median(dts)))
        shutil.rmtree(d, ignore_errors=True)
    md = [
        "# SFT seconds per optimizer step (main job SFT config: 'mini', 4K-token batches, fp32)",
        "",
        f"Load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on the 2-core machine during the measurement; "
        f"median of steps 6..{steps}, each setting measured twice, alternating.",
        "",
        "| setting | torch threads | s/step |",
        "|---|---|---|",
    ] + [f"| {n} | {k} | {t:.3f} |" for n, k, t in rows]
    md += ["", "Command: `python -m experiments.student_levers.student_levers --step-costs`", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "step_costs.md").write_text("\n".join(md))
    print("\n".join(md))


def run_parallel(names: list, start: Callable[[Any], subprocess.Popen | None], parallel: int) -> dict:
    """Start ``start(name)`` for each name, at most `parallel` processes at once (a None start:
    nothing to run); returns {name: exit code} of the processes run."""
    todo, running, codes = list(names), {}, {}
    while todo or running:
        while todo and len(running) < parallel:
            name = todo.pop(0)
            if (p := start(name)) is not None:
                running[name] = p
                print(f"[{time.strftime('%H:%M:%S')}] started {name}", flush=True)
        for name, p in list(running.items()):
            if p.poll() is not None:
                print(f"[{time.strftime('%H:%M:%S')}] {name} exited {p.returncode}", flush=True)
                codes[name] = p.returncode
                del running[name]
        time.sleep(5)
    return codes


def _sweep_base(out: Path) -> Path:
    """An arm directory whose teacher traces, tokenizer and initial model the sweep shares."""
    return next(d for d in sorted(out.iterdir()) if (d / ".model.done").is_file())


def sweep_one(out: Path, weight: float, steps: int) -> None:
    """One prompt-loss sweep point: the default SFT config with `steps` and `weight`, 1 thread;
    writes ``result.json`` (train seconds, dev action accuracy) into its directory."""
    import torch

    from evoharness.pipeline import RunConfig
    from evoharness.train.sft import train_sft

    torch.set_num_threads(1)
    base, d = _sweep_base(out), out / "prompt_loss_sweep" / f"w{weight:g}_s{steps}"
    cfg = RunConfig().sft.model_copy(
        update={"max_steps": steps, "ckpt_every": 0, "progress": False, "prompt_loss_weight": weight}
    )
    t = time.perf_counter()
    final = train_sft(cfg, base / "sft_examples.jsonl", base / "model_init", d)
    train_s = time.perf_counter() - t
    acc = action_accuracy(final, dev_teacher_states(out))
    (d / "result.json").write_text(
        json.dumps({"weight": weight, "steps": steps, "train_s": round(train_s), "dev_action_acc": acc})
    )


def prompt_loss_sweep(out: Path, results: Path, weights: list[float], steps: int, parallel: int) -> None:
    """SFT with the prompt-token loss at each weight (same data, init, steps), dev action
    accuracy of each; `parallel` 1-thread processes at once; writes prompt_loss_sweep.md/.json."""

    def start(w: float) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, __file__, "--out", str(out), "--sweep-one", str(w), "--sweep-steps", str(steps)],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )

    if failed := [f"w={w:g}" for w, rc in run_parallel(weights, start, parallel).items() if rc]:
        sys.exit(f"sweep points failed: {failed}")
    rows = [json.loads((out / "prompt_loss_sweep" / f"w{w:g}_s{steps}" / "result.json").read_text()) for w in weights]
    md = [
        f"# SFT prompt-token loss weight (issue 11): {steps} steps x 4K tokens, 'mini', 1 thread",
        "",
        "Every point trains the main job's default SFT config from the same initial model on the same teacher "
        f"traces for {steps} optimizer steps, changing only `sft.prompt_loss_weight` (the step minimises "
        "L_completion + w * L_prompt). Dev action accuracy as in levers.md (the student's greedy constrained "
        f"action vs the teacher's, on the teacher's states of 30 development games). {parallel} points at once on "
        f"the 2-core machine (load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        "| prompt loss weight | train s | dev action acc. |",
        "|---|---|---|",
    ]
    md += [f"| {r['weight']:g} | {r['train_s']} | {100 * r['dev_action_acc']:.1f}% |" for r in rows]
    md += [
        "",
        "Command: `python -m experiments.student_levers.student_levers --prompt-loss-sweep "
        f"{','.join(f'{w:g}' for w in weights)} "
        f"--sweep-steps {steps}`",
        "",
    ]
    results.mkdir(parents=True, exist_ok=True)
    (results / "prompt_loss_sweep.md").write_text("\n".join(md))
    (results / "prompt_loss_sweep.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", default="runs/levers")
    ap.add_argument("--results", default="benchmarks/results/student")
    ap.add_argument("--check-stop", default=None, help="an arm directory: check the early-stop rule on its model")
    ap.add_argument("--table", action="store_true", help="only rewrite the table from finished arms")
    ap.add_argument("--step-costs", action="store_true", help="measure the default SFT's seconds per step")
    ap.add_argument("--prompt-loss-sweep", default=None, help="comma-separated prompt loss weights to compare")
    ap.add_argument("--sweep-steps", type=int, default=600)
    ap.add_argument("--sweep-one", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    if args.sweep_one is not None:
        sweep_one(out, args.sweep_one, args.sweep_steps)
        return
    if args.prompt_loss_sweep:
        prompt_loss_sweep(
            out,
            Path(args.results),
            [float(w) for w in args.prompt_loss_sweep.split(",")],
            args.sweep_steps,
            args.parallel,
        )
        return
    if args.step_costs:
        step_costs(out, Path(args.results))
        return
    if args.check_stop:
        check_early_stop(Path(args.check_stop), Path(args.results))
        return
    if args.table:
        write_table(out, Path(args.results))
        return
    todo = [a.strip() for a in args.arms.split(",") if a.strip()]
    if unknown := [a for a in todo if a not in ARMS]:
        sys.exit(f"unknown arms {unknown}; known: {list(ARMS)}")
    run_parallel(todo, lambda name: run_arm(name, out), args.parallel)
    write_table(out, Path(args.results))


if __name__ == "__main__":
    main()
