"""Repository-task evaluation report: per-task table, per-difficulty means, a score chart."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from evoharness.envs.repo.scoring import ScoreOutcome, outcome_counts

DIFFICULTY_ORDER = ("easy", "medium", "hard", "nl2repo")


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def summarize_repo(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of a list of `RepoEpisode` dicts. Mean score counts a dropped
    execution as missing (``scored_mean``) and, conservatively, as 0 (``mean_score``)."""

    def row(eps: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(eps)
        return {
            "n": n,
            "mean_score": _mean([e["reward"] or 0.0 for e in eps]),
            "scored_mean": _mean([e["reward"] for e in eps if e["reward"] is not None]),
            "solved": sum(e["reward"] == 1.0 for e in eps),
            "tool_calls_mean": _mean([e["tool_calls"] for e in eps]),
            "tokens_mean": _mean([e["prompt_tokens"] + e["completion_tokens"] for e in eps]),
            "wall_s_mean": _mean([e["wall_s"] for e in eps]),
        }

    diffs = [d for d in DIFFICULTY_ORDER if any(e["difficulty"] == d for e in episodes)]
    diffs += sorted({e["difficulty"] for e in episodes} - set(diffs))
    stops: dict[str, int] = {}
    for e in episodes:
        stops[e["stop_reason"]] = stops.get(e["stop_reason"], 0) + 1
    outcomes = [ScoreOutcome(e["score_status"], e["reward"], e["score_attempts"]) for e in episodes]
    return {
        "overall": row(episodes),
        "by_difficulty": {d: row([e for e in episodes if e["difficulty"] == d]) for d in diffs},
        "scoring": outcome_counts(outcomes),
        "stop_reasons": stops,
        "tasks": [
            {
                k: e[k]
                for k in (
                    "task_id",
                    "difficulty",
                    "reward",
                    "score_status",
                    "passed",
                    "n_tests",
                    "tool_calls",
                    "tool_errors",
                    "model_calls",
                    "compactions",
                    "prompt_tokens",
                    "completion_tokens",
                    "wall_s",
                    "stop_reason",
                )
            }
            for e in episodes
        ],
    }


def repo_table(summary: dict[str, Any]) -> str:
    """Per-task Markdown table: score, tool calls, tokens, wall time, stop reason."""
    rows = [
        "| task | difficulty | score | passed/n | scoring | tool calls | model calls | prompt tok | "
        "compl. tok | wall s | stop |",
        "|" + "---|" * 11,
    ]
    for t in summary["tasks"]:
        score = "dropped" if t["reward"] is None else f"{t['reward']:.3f}"
        rows.append(
            f"| {t['task_id']} | {t['difficulty']} | {score} | {t['passed']}/{t['n_tests']} | "
            f"{t['score_status']} | {t['tool_calls']} | {t['model_calls']} | {t['prompt_tokens']} | "
            f"{t['completion_tokens']} | {t['wall_s']:.1f} | {t['stop_reason']} |"
        )
    return "\n".join(rows)


def difficulty_table(summary: dict[str, Any]) -> str:
    rows = [
        "| difficulty | n | mean score | solved | tool calls/task | tokens/task | wall s/task |",
        "|---|---|---|---|---|---|---|",
    ]
    items = list(summary["by_difficulty"].items()) + [("**all**", summary["overall"])]
    for name, r in items:
        rows.append(
            f"| {name} | {r['n']} | {r['mean_score']:.3f} | {r['solved']} | {r['tool_calls_mean']:.1f} | "
            f"{r['tokens_mean']:.0f} | {r['wall_s_mean']:.1f} |"
        )
    return "\n".join(rows)


def plot_scores(summary: dict[str, Any], path: Path, title: str) -> None:
    """Horizontal bars: each task's score, coloured by difficulty (dropped: hatched, at 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = summary["tasks"]
    colours = {"easy": "#4c9f70", "medium": "#e0a030", "hard": "#c0504d", "nl2repo": "#5b7fbf"}
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.28 * max(1, len(tasks))))
    ys = list(range(len(tasks)))[::-1]
    for y, t in zip(ys, tasks):
        ax.barh(
            y,
            t["reward"] or 0.0,
            color=colours.get(t["difficulty"], "#888888"),
            hatch="//" if t["reward"] is None else None,
            edgecolor="black",
            linewidth=0.3,
        )
    ax.set_yticks(ys, [t["task_id"] for t in tasks], fontsize=8)
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("score (hidden tests passed / total)")
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=d) for d, c in colours.items() if any(t["difficulty"] == d for t in tasks)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def write_repo_report(summary: dict[str, Any], out: Path) -> None:
    """``summary.json``, ``report.md`` and ``scores.png`` in `out` (atomic replaces)."""

    def put(name: str, text: str) -> None:
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)

    put("summary.json", json.dumps(summary, indent=2))
    o = summary["overall"]
    title = f"{summary.get('policy', '?')} on {summary.get('task_source', '?')}"
    plot_scores(summary, out / "scores.png", title)
    sc = summary["scoring"]
    md = [
        f"# Repository tasks: {title}",
        "",
        f"Mean score **{o['mean_score']:.3f}** over {o['n']} tasks ({o['solved']} solved in full); scoring: "
        f"{sc['score/scored']} scored, {sc['score/placeholder']} placeholder, {sc['score/dropped']} dropped, "
        f"{sc['score/retries']} retries. Stop reasons: "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["stop_reasons"].items()))
        + ".",
        "",
        difficulty_table(summary),
        "",
        repo_table(summary),
        "",
        "![scores](scores.png)",
        "",
    ]
    put("report.md", "\n".join(md))
