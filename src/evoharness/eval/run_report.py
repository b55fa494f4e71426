"""The main job's report: systems side by side, training curves (Markdown + PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evoharness.envs.alfworld.games import TASK_SHORT, TASK_TYPES
from evoharness.eval.cost import cost_section
from evoharness.eval.report import plot_success, wilson_interval
from evoharness.files import read_jsonl
from evoharness.harness.base import META_VERBS


def _plot_curves(path: Path, panels: list[tuple[str, list[tuple[str, list[float], list[float]]]]]) -> None:
    """One row of line plots; each panel is (title, [(label, xs, ys), ...])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels):
        for label, xs, ys in lines:
            ax.plot(xs, ys, label=label, lw=1.4)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if len(lines) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(ys: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(ys)):
        window = ys[max(0, i - k + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def success_table(systems: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows: per-type wins, overall success, steps, tokens, harness calls, invalid actions per episode."""
    md = [
        "| system | " + " | ".join(TASK_SHORT[t] for t in TASK_TYPES) + " | all | steps/ep | "
        "prompt tok/ep | compl. tok/ep | harness calls/ep | invalid/ep |",
        "|---|" + "---|" * (len(TASK_TYPES) + 6),
    ]
    for name, s in systems.items():
        o = s["overall"]
        cells = [f"{s['by_type'][t]['won']}/{s['by_type'][t]['n']}" for t in TASK_TYPES]
        calls = sum(o.get("meta_per_ep", {}).get(v, 0) for v in META_VERBS)
        md.append(
            f"| {name} | " + " | ".join(cells) + f" | **{o['success']}%** | {o.get('mean_steps', 0)} | "
            f"{o.get('prompt_tokens_per_ep', 0)} | {o.get('completion_tokens_per_ep', 0)} | {calls:.2f} | "
            f"{o.get('invalid_per_ep', 0)} |"
        )
    return md


def wasted_steps(episode: dict) -> dict[str, int]:
    """Turns of one episode (an ``episodes.jsonl`` line) that bought nothing.

    ``invalid``: turns that were neither an admissible command nor a meta-action;
    ``repeated``: environment or meta actions whose (action, feedback) pair already
    occurred earlier in the episode (a revisit that shows nothing new).
    """
    seen, rep, inv = set(), 0, 0
    for t in episode.get("turns", []):
        if t.get("kind") == "invalid":
            inv += 1
            continue
        key = (t.get("action"), t.get("feedback"))
        rep += key in seen
        seen.add(key)
    return {"invalid": inv, "repeated": rep}


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test (McNemar's exact test on the discordant pairs):
    P(|W - n/2| >= |wins - n/2|) for W ~ Binomial(n = wins + losses, 1/2)."""
    from math import comb

    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n)


def paired(a: list[dict], b: list[dict]) -> dict[str, Any]:
    """Per-game comparison of system `b` against `a` (episode lists of one panel):
    ``{"n", "b_only", "a_only", "both", "neither", "p"}`` (p: `sign_test`)."""
    wa = {e["task_id"]: bool(e["won"]) for e in a}
    wb = {e["task_id"]: bool(e["won"]) for e in b}
    common = sorted(wa.keys() & wb.keys())
    b_only = sum(wb[g] and not wa[g] for g in common)
    a_only = sum(wa[g] and not wb[g] for g in common)
    both = sum(wa[g] and wb[g] for g in common)
    return {
        "n": len(common),
        "b_only": b_only,
        "a_only": a_only,
        "both": both,
        "neither": len(common) - b_only - a_only - both,
        "p": sign_test(b_only, a_only),
    }


def gap_interval(won_a: int, n_a: int, won_b: int, n_b: int) -> tuple[float, float, float]:
    """The difference of two independent success rates, ``won_a / n_a - won_b / n_b`` in points, with
    its 95% interval by Newcombe's hybrid score method (1998, method 10: from each rate's Wilson
    interval, `eval.report.wilson_interval`), for panels of different games (no pairing).
    ``(gap, low, high)``; ``n = 0`` on a side: that side's rate counts as 0 with interval [0, 100]."""
    pa, pb = (100 * won_a / n_a if n_a else 0.0), (100 * won_b / n_b if n_b else 0.0)
    (la, ua), (lb, ub) = wilson_interval(won_a, n_a), wilson_interval(won_b, n_b)
    d = pa - pb
    return d, d - ((pa - la) ** 2 + (ub - pb) ** 2) ** 0.5, d + ((ua - pa) ** 2 + (pb - lb) ** 2) ** 0.5


def _rate(o: dict) -> str:
    """``93.6% [88.2, 96.6] (131/140)``: a summary's overall success with its 95% Wilson interval."""
    lo, hi = wilson_interval(o["won"], o["n"])
    return f"{o['success']}% [{lo:.1f}, {hi:.1f}] ({o['won']}/{o['n']})"


def _load(eval_dir: Path) -> tuple[dict, list[dict]]:
    import json

    return json.loads((eval_dir / "summary.json").read_text()), read_jsonl(eval_dir / "episodes.jsonl")


def _plot_learning_curve(path: Path, curve: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    pts = [p for p in curve["points"] if p["stage"] != "sft_final"]
    # one run across stages: a thin line through every point in time order, then each stage's own
    order = sorted(pts, key=lambda p: p["minutes"])
    ax.plot([p["minutes"] for p in order], [p["success"] for p in order], color="0.75", lw=0.8, zorder=0)
    for stage in dict.fromkeys(p["stage"] for p in pts):
        xs = [p["minutes"] for p in pts if p["stage"] == stage]
        ys = [p["success"] for p in pts if p["stage"] == stage]
        ax.plot(xs, ys, marker="o", lw=1.4, label=stage)
    ax.set_xlabel("training minutes (cumulative, this machine)")
    ax.set_ylabel(f"dev success % ({curve['games']} games)")
    ax.set_ylim(0, 102)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_run_report(
    out: Path,
    systems: dict[str, Path],
    dev: dict[str, Path],
    sft_metrics: list[Path],
    rl_metrics: Path | None,
    notes: list[str],
    stage_times: dict[str, float] | None = None,
    curve: dict | None = None,
    title: str = "EvoHarness main job",
    unseen: dict[str, Path] | None = None,
) -> Path:
    """Write ``report.md`` with ``success.png``, ``learning_curve.png``, ``sft_loss.png``, ``rl_curves.png``
    (and ``unseen_success.png``).

    Args:
        systems: display name -> valid_seen evaluation directory (``summary.json`` +
            ``episodes.jsonl``), in display order.
        dev: display name -> development-set evaluation directory (same names).
        unseen: display name -> unseen-room panel evaluation directory (same names; None: no such
            panel): a column beside dev, its paired tests, its success with Wilson intervals against
            valid_seen's (the seen-vs-unseen gap) and by task type.
        sft_metrics: the SFT stages' ``metrics.jsonl`` in order (teacher SFT, DAgger rounds).
        rl_metrics: the GRPO stage's ``metrics.jsonl`` (None: no RL section).
        notes: lines appended under "Notes" (budget, limits, what was skipped).
        stage_times: stage name -> wall seconds.
        curve: the learning curve (`pipeline.learning_curve`), or None.
    """
    out.mkdir(parents=True, exist_ok=True)
    md = [f"# {title}", ""]
    vs = {n: _load(d) for n, d in systems.items() if (d / "summary.json").is_file()}
    dv = {n: _load(d) for n, d in dev.items() if (d / "summary.json").is_file()}
    uv = {n: _load(d) for n, d in (unseen or {}).items() if (d / "summary.json").is_file()}
    if vs:
        ucol = (" | unseen rooms", " / unseen", "---|") if unseen is not None else ("", "", "")
        md += [
            "## Success",
            "",
            "Greedy, each game once, step cap 50, BPE harness. Stopped early: episodes ended in a repeated "
            "(prompt, completion) loop (failures). Wasted steps: invalid actions + repeated (action, feedback) "
            "pairs, per episode (valid_seen).",
            "",
            f"| system | valid_seen | dev{ucol[0]} | stopped early (valid_seen / dev{ucol[1]}) | steps/ep | "
            "harness calls/ep | wasted/ep |",
            f"|---|---|---|{ucol[2]}---|---|---|---|",
        ]
        for name, (s, eps) in vs.items():
            o = s["overall"]
            d = dv.get(name, ({"overall": {}}, []))[0]["overall"]
            u = uv.get(name, ({"overall": {}}, []))[0]["overall"]
            calls = sum(o.get("meta_per_ep", {}).get(v, 0) for v in META_VERBS)
            w = [wasted_steps(e) for e in eps]
            wasted = sum(x["invalid"] + x["repeated"] for x in w) / max(1, len(w))
            dcell = f"{d['success']}% ({d['won']}/{d['n']})" if d else "-"
            ucell = (f" | {u['success']}% ({u['won']}/{u['n']})" if u else " | -") if unseen is not None else ""
            stopped = f"{o.get('stopped_early', 0)} / {d.get('stopped_early', '-')}" + (
                f" / {u.get('stopped_early', '-')}" if unseen is not None else ""
            )
            md.append(
                f"| {name} | **{o['success']}%** ({o['won']}/{o['n']}) | {dcell}{ucell} | {stopped} | "
                f"{o.get('mean_steps', 0)} | {calls:.2f} | {wasted:.2f} |"
            )
        md.append("")
        pairs = [(a, b) for a, b in zip(list(vs)[:-1], list(vs)[1:]) if a != "random" and not a.startswith("scripted")]
        if pairs:
            md += [
                "Paired per game (same games, same order): wins = games only the second system won, losses = "
                "games only the first won; p = exact two-sided sign test (McNemar) on those.",
                "",
                "| comparison | panel | games | wins | losses | both won | p |",
                "|---|---|---|---|---|---|---|",
            ]
            # a GRPO checkpoint chosen on dev games is also compared on the dev games that had no say in
            # the choice (none when the whole development set chose it)
            chose = (
                set(curve.get("chosen_on", curve.get("game_ids", [])))
                if curve and curve.get("rl_selected", {}).get("stage") == "rl"
                else set()
            )
            for a, b in pairs:
                chosen = chose if "GRPO" in b else set()
                # (panel, data, games left out, may join the pooled test, its name in the pooled row)
                panels = [("valid_seen", vs, set(), True, "valid_seen")]
                for pname, data in (("dev", dv), ("unseen rooms", uv)):
                    ids = {e["task_id"] for e in data[b][1]} if b in data else set()
                    mine = chosen & ids  # the games of this panel that chose the checkpoint
                    every = bool(mine) and ids <= mine
                    panels.append((f"{pname} (chose the checkpoint)" if every else pname, data, set(), not mine, pname))
                    if mine and not every:
                        panels.append(
                            (
                                f"{pname} without the {len(mine)} that chose it",
                                data,
                                mine,
                                True,
                                f"{pname} without those",
                            )
                        )
                pooled: list[tuple[list[dict], list[dict]]] = []
                names: list[str] = []
                for panel, data, drop, pool, short in panels:
                    if a in data and b in data:
                        pair = (
                            [e for e in data[a][1] if e["task_id"] not in drop],
                            [e for e in data[b][1] if e["task_id"] not in drop],
                        )
                        c = paired(*pair)
                        md.append(
                            f"| {b} vs {a} | {panel} | {c['n']} | {c['b_only']} | {c['a_only']} | {c['both']} | "
                            f"{c['p']:.3g} |"
                        )
                        if pair[0] and pool:
                            pooled.append(pair)
                            names.append(short)
                if len(pooled) > 1:  # disjoint game sets, none of which chose the checkpoint: one larger paired test
                    c = paired([e for x, _ in pooled for e in x], [e for _, y in pooled for e in y])
                    md.append(
                        f"| {b} vs {a} | {' + '.join(names)} | {c['n']} | {c['b_only']} | "
                        f"{c['a_only']} | {c['both']} | {c['p']:.3g} |"
                    )
            md.append("")
        stage2 = [(n, f"{n} + GRPO") for n in vs if f"{n} + GRPO" in vs]
        if stage2:  # what stage 2's cost terms bought on the games both systems won
            panels = {"valid_seen": {n: e for n, (_, e) in vs.items()}, "dev": {n: e for n, (_, e) in dv.items()}}
            teacher = next((n for n in vs if n.startswith("scripted teacher")), None)
            md += cost_section(panels, *stage2[-1], teacher)
        summaries = {n: s for n, (s, _) in vs.items()}
        plot_success(summaries, out / "success.png", "ALFWorld valid_seen success by task type")
        md += ["### valid_seen by task type", ""] + success_table(summaries) + ["", "![success](success.png)", ""]
        md += [
            "Harness calls per episode by meta-action (valid_seen):",
            "",
            "| system | " + " | ".join(META_VERBS) + " |",
            "|---|" + "---|" * len(META_VERBS),
        ]
        for name, s in summaries.items():
            meta = s["overall"].get("meta_per_ep", {})
            md.append(f"| {name} | " + " | ".join(str(meta.get(v, 0)) for v in META_VERBS) + " |")
        md.append("")
        if uv:
            md += _unseen_section(out, vs, uv)
    if curve and curve.get("points"):
        _plot_learning_curve(out / "learning_curve.png", curve)
        md += [
            "## Learning curve",
            "",
            f"Dev success ({curve['games']} development games, greedy, early stopping) of every saved checkpoint "
            "against cumulative training minutes (DAgger rollouts included).",
            "",
            "![learning curve](learning_curve.png)",
            "",
            "| stage | step | minutes | dev success % |",
            "|---|---|---|---|",
        ]
        md += [
            f"| {p['stage']} | {p['step']} | {p['minutes']} | {p['success']} |"
            for p in curve["points"]
            if p["stage"] != "sft_final"
        ]
        md.append("")
    sft, offset, bounds = [], 0, []
    for path in sft_metrics:
        recs = [r for r in read_jsonl(path) if "loss" in r] if path.is_file() else []
        sft += [{**r, "step": r["step"] + offset} for r in recs]
        offset += len(recs)
        bounds.append(offset)
    if sft:
        xs = [r["step"] for r in sft]
        panels = [
            (
                "SFT loss (assistant tokens)",
                [("loss", xs, [r["loss"] for r in sft]), ("smoothed", xs, _smooth([r["loss"] for r in sft], 20))],
            )
        ]
        prompt = [r for r in sft if "prompt_loss" in r]
        if prompt:  # the auxiliary loss on prompt tokens (sft.prompt_loss_weight)
            panels.append(
                (
                    "prompt-token loss",
                    [("prompt loss", [r["step"] for r in prompt], [r["prompt_loss"] for r in prompt])],
                )
            )
        _plot_curves(out / "sft_loss.png", panels)
        final = f"final loss {sft[-1]['loss']:.4f}" + (
            f" (prompt tokens: {prompt[-1]['prompt_loss']:.4f})" if prompt else ""
        )
        md += [
            "## Stage 1: SFT (teacher traces, then DAgger rounds)",
            "",
            f"{len(sft)} steps (stage ends at steps {', '.join(map(str, bounds))}); {final}.",
            "",
            "![sft loss](sft_loss.png)",
            "",
        ]
    if rl_metrics:
        md += rl_section(out, read_jsonl(rl_metrics))
    if stage_times:
        md += ["## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
        md += [f"| {k} | {v:.0f} |" for k, v in stage_times.items()]
        md += [f"| **total** | **{sum(stage_times.values()):.0f}** |", ""]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def _unseen_section(
    out: Path, vs: dict[str, tuple[dict, list[dict]]], uv: dict[str, tuple[dict, list[dict]]]
) -> list[str]:
    """Markdown lines (and ``unseen_success.png``): each system's success on valid_seen and on the
    unseen-room panel with 95% Wilson intervals, the seen-vs-unseen gap with its interval
    (`gap_interval`), and the unseen-room panel by task type."""
    summaries = {n: s for n, (s, _) in uv.items()}
    md = [
        "### Unseen rooms",
        "",
        "The unseen-room panel: ALFWorld train games of floor plans (scenes) no game the job trains, teaches, "
        "screens, runs RL or develops on comes from (notes below). Success with its 95% Wilson interval; the "
        "gap is valid_seen minus unseen rooms in points, with its 95% interval (Newcombe's hybrid score "
        "method: different games, so not paired); its paired tests are in the table above.",
        "",
        "| system | valid_seen | unseen rooms | gap (points) |",
        "|---|---|---|---|",
    ]
    for name, (s, _) in uv.items():
        u = s["overall"]
        if name not in vs:
            md.append(f"| {name} | - | {_rate(u)} | - |")
            continue
        o = vs[name][0]["overall"]
        gap, lo, hi = gap_interval(o["won"], o["n"], u["won"], u["n"])
        md.append(f"| {name} | {_rate(o)} | {_rate(u)} | {gap:+.1f} [{lo:+.1f}, {hi:+.1f}] |")
    plot_success(summaries, out / "unseen_success.png", "ALFWorld unseen-room panel success by task type")
    return md + ["", "By task type:", ""] + success_table(summaries) + ["", "![unseen rooms](unseen_success.png)", ""]


def _trend(ys: list[float]) -> float:
    """Least-squares slope of ys against their index (units of y per step)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def rl_section(
    out: Path, rl: list[dict], name: str = "rl_curves.png", title: str = "Stage 2: cost-aware GRPO"
) -> list[str]:
    """Markdown lines for a GRPO run's metrics, and the plot `name` in `out`
    (reward, training success, greedy eval success when logged, KL, harness
    calls per meta-action). Empty when there are no steps."""
    if not rl:
        return []
    xs = [r["step"] for r in rl]
    panels = [
        (
            "reward (mean)",
            [("reward", xs, [r["reward"] for r in rl]), ("smoothed", xs, _smooth([r["reward"] for r in rl]))],
        ),
        (
            "training success",
            [("success", xs, [r["success"] for r in rl]), ("smoothed", xs, _smooth([r["success"] for r in rl]))],
        ),
    ]
    ev = [r for r in rl if "eval/success" in r]
    if ev:
        panels.append(("greedy eval success", [("eval", [r["step"] for r in ev], [r["eval/success"] for r in ev])]))
    panels += [
        ("KL to SFT reference", [("k3 KL", xs, [r.get("train/kl", 0.0) for r in rl])]),
        ("harness calls / episode", [(v, xs, [r.get(f"harness/{v}_per_episode", 0) for r in rl]) for v in META_VERBS]),
    ]
    _plot_curves(out / name, panels)
    k = min(5, len(rl))
    succ, rew = [r["success"] for r in rl], [r["reward"] for r in rl]
    md = [
        f"## {title}",
        "",
        f"{len(rl)} steps. Training success {succ[0]:.2f} -> {succ[-1]:.2f} (mean of first/last {k}: "
        f"{sum(succ[:k]) / k:.2f} -> {sum(succ[-k:]) / k:.2f}; least-squares trend {_trend(succ):+.4f}/step); "
        f"reward {rew[0]:.2f} -> {rew[-1]:.2f} (first/last {k}: {sum(rew[:k]) / k:.2f} -> {sum(rew[-k:]) / k:.2f}; "
        f"trend {_trend(rew):+.4f}/step).",
        "",
    ]
    if runs := rl[0].get("soup/runs"):  # recipes.soup's merged records
        md += [
            f"A seed soup: {runs} runs with consecutive RL seeds from the same SFT model, the policy their "
            "uniform weight average (`recipes.soup`). Each row is the runs' mean (step times and group counts: "
            "their sum).",
            "",
        ]
    if ev:
        md += [
            "Greedy evaluation during training: "
            + ", ".join(f"step {r['step']}: {r['eval/success']:.2f} (n={r.get('eval/n', '?')})" for r in ev)
            + ".",
            "",
        ]
    inv = [r.get("invalid_per_episode", 0.0) for r in rl]
    constrained = rl[-1].get("constrained")  # ALFWorld runs record it; repository runs have no action grammar
    if constrained:
        forced = sum(r.get("train/forced_fraction", 0.0) for r in rl) / len(rl)
        decoding = (
            f"constrained to admissible commands and meta-actions; {100 * forced:.0f}% of trained "
            "tokens were forced by the grammar (log-prob 0, no gradient)"
        )
    elif constrained is False:
        decoding = "unconstrained (the invalid-action term carries the format)"
    else:
        decoding = "free-form tool calls (no action grammar)"
    if any("adv/std_floor_groups" in r for r in rl):
        spread = sum(r.get("adv/signal_groups", 0) for r in rl)
        floored = sum(r.get("adv/std_floor_groups", 0) for r in rl)
        md += [
            f"Advantage std floor: acted in {floored} of {spread} groups with a reward spread "
            f"({100 * floored / max(1, spread):.0f}%); there the shaping-only differences keep their raw "
            "size instead of being scaled up to success-vs-failure size.",
            "",
        ]
    if any("adv/step_groups" in r for r in rl):
        steps = sum(r.get("adv/step_groups", 0) for r in rl)
        sfloored = sum(r.get("adv/step_floor_groups", 0) for r in rl)
        md += [
            f"GiGPO step level: the std floor (scaled by the return's discount) acted in {sfloored} of {steps} "
            f"anchor-state groups with a return spread ({100 * sfloored / max(1, steps):.0f}%).",
            "",
        ]
    md += [
        f"Invalid actions per episode {inv[0]:.2f} -> {inv[-1]:.2f} (reward term "
        f"{rl[0].get('reward/invalid', 0.0):+.3f} -> {rl[-1].get('reward/invalid', 0.0):+.3f}); decoding {decoding}.",
        "",
    ]
    md += [
        f"![rl curves]({name})",
        "",
        "| step | success | reward | steps/ep | invalid/ep | KL | entropy | clip frac | compl. tok/ep | gen s "
        "| env s | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rl:
        md.append(
            f"| {r['step']} | {r['success']:.3f} | {r['reward']:.2f} | {r['steps_per_episode']:.1f} | "
            f"{r.get('invalid_per_episode', 0):.2f} | "
            f"{r.get('train/kl', 0):.4f} | {r.get('train/entropy', 0):.3f} | {r.get('train/clip_fraction', 0):.3f} | "
            f"{r['completion_tokens_per_episode']:.0f} | {r['timing_s/gen']:.0f} | {r['timing_s/env']:.1f} | "
            f"{r['timing_s/train']:.0f} |"
        )
    return md + [""]


def write_rl_report(out: Path, rl_metrics: Path) -> Path:
    """``report.md`` + ``rl_curves.png`` for a stand-alone ``evoharness rl`` run."""
    lines = rl_section(out, read_jsonl(rl_metrics))
    path = out / "report.md"
    path.write_text("\n".join(["# EvoHarness RL run", ""] + (lines or ["No completed steps yet.", ""])))
    return path
