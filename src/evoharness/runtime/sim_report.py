"""Side-by-side table (Markdown, JSON) and PNG timeline of simulated schedules.

Metric names follow verl's habit: wall time in hours, accelerator-hours
(cells x accelerators per cell x wall hours), per-role idle ratio (share of a
role's time with nothing running: no sequence decoding in rollout, no
micro-batch in train), rollout utilisation (tps(n) / tps(capacity) averaged
over rollout time), post-rollout hours per step (a batch's last execution
finished -> its weights synced: the training not hidden behind rollout),
staleness (trainer version - behaviour version, per sample), aborted turns,
role switches.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from evoharness.runtime.sim import S_ROLLOUT, S_SWITCH, S_SYNC, S_TRAIN, SimResult

COLUMNS = [
    ("policy", "policy"),
    ("wall_h", "wall (h)"),
    ("step_s", "s/step"),
    ("speedup", "{ref} speedup vs this"),
    ("accelerator_hours", "accel-hours"),
    ("post_rollout_h", "post-rollout h/step"),
    ("idle_rollout", "idle rollout"),
    ("util_rollout", "util rollout"),
    ("idle_train", "idle train"),
    ("frac_switch", "switching"),
    ("frac_sync", "weight sync"),
    ("staleness", "staleness mean/max"),
    ("aborted_turns", "aborted turns"),
    ("switches", "switches"),
]


def reference(results: list[SimResult]) -> SimResult:
    """The schedule speedups are measured for: elastic if present, else the last."""
    return next((r for r in results if r.policy == "elastic"), results[-1])


def rows(results: list[SimResult]) -> list[dict[str, float | str]]:
    """One flat dict per schedule; ``speedup`` = its wall time / the reference's."""
    ref = reference(results)
    out = []
    for r in results:
        row: dict[str, float | str] = {"policy": r.policy, **r.metrics}
        row["speedup"] = r.wall_s / ref.wall_s if ref.wall_s else float("nan")
        row["step_s"] = r.wall_s / len(r.step_end_s) if r.step_end_s else float("nan")  # runs of seconds, too
        row["staleness_hist"] = json.dumps({str(k): v for k, v in sorted(r.staleness.items())})
        out.append(row)
    return out


def markdown_table(results: list[SimResult]) -> str:
    ref = reference(results).policy
    head = [label.format(ref=ref) for _, label in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows(results):
        cells = []
        for key, _ in COLUMNS:
            if key == "policy":
                cells.append(str(row["policy"]))
            elif key == "staleness":
                cells.append(f"{row['staleness_mean']:.2f}/{row['staleness_max']:.0f}")
            elif key == "speedup":
                cells.append(f"{row['speedup']:.2f}x")
            elif key in ("idle_rollout", "util_rollout", "idle_train", "frac_switch", "frac_sync"):
                cells.append(f"{100 * float(row[key]):.1f}%")
            elif key in ("aborted_turns", "switches"):
                cells.append(f"{row[key]:.0f}")
            else:
                cells.append(f"{row[key]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- timeline -----------------------------------------------------------------

_COLORS = {
    "rollout_busy": (0.12, 0.40, 0.75),
    "rollout_idle": (0.86, 0.91, 0.98),
    "train_busy": (0.95, 0.50, 0.05),
    "train_idle": (0.99, 0.88, 0.75),
    "switch": (0.84, 0.15, 0.16),
    "sync": (0.55, 0.35, 0.72),
}


def _binned(r: SimResult, edges: np.ndarray) -> np.ndarray:
    """[cells, bins, 3] RGB: each bin's colour mixes the states by time share."""
    assert r.timeline is not None
    tl, wall = r.timeline, r.wall_s
    img = np.ones((len(tl.t), len(edges) - 1, 3))
    width = np.diff(edges)
    for c in range(len(tl.t)):
        t = np.asarray(tl.t[c] + [wall])
        s = np.asarray(tl.state[c])
        u = np.asarray(tl.util[c])
        dur = np.diff(t)

        def share(w: np.ndarray, t: np.ndarray = t) -> np.ndarray:
            cum = np.concatenate([[0.0], np.cumsum(w)])
            return np.diff(np.interp(edges, t, cum)) / width

        parts = {}
        for code, name in ((S_ROLLOUT, "rollout"), (S_TRAIN, "train")):
            on = dur * (s == code)
            busy = share(on * u)
            parts[f"{name}_busy"], parts[f"{name}_idle"] = busy, share(on) - busy
        parts["switch"], parts["sync"] = share(dur * (s == S_SWITCH)), share(dur * (s == S_SYNC))
        total = sum(parts.values())
        px = np.outer(1.0 - np.clip(total, 0, 1), np.ones(3))
        for name, w in parts.items():
            px += np.outer(np.clip(w, 0, 1), _COLORS[name])
        img[c] = np.clip(px, 0, 1)
    return img


def plot_timeline(results: list[SimResult], path: str | Path, bins: int = 600, max_rows: int = 64) -> Path:
    """One panel per schedule: cells (rows) x time; colour = role, depth =
    utilisation (dark blue: decoding at capacity; pale: idle)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    shown = [r for r in results if r.timeline is not None]
    if not shown:
        raise ValueError("no timeline recorded (run with record_timeline=True)")
    t_end = max(r.wall_s for r in shown)
    edges = np.linspace(0.0, t_end, bins + 1)
    fig, axes = plt.subplots(len(shown), 1, figsize=(12, 1.2 + 1.6 * len(shown)), squeeze=False, sharex=True)
    for ax, r in zip(axes[:, 0], shown):
        img = _binned(r, edges)
        k = img.shape[0]
        if k > max_rows:  # average neighbouring cells into at most max_rows rows
            grp = int(np.ceil(k / max_rows))
            n_rows = int(np.ceil(k / grp))
            img = np.concatenate([img, np.full((grp * n_rows - k, img.shape[1], 3), np.nan)])
            img = np.nanmean(img.reshape(n_rows, grp, img.shape[1], 3), axis=1)
        ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, t_end / 3600, k - 0.5, -0.5))
        ax.set_ylabel("cell")
        ax.set_title(
            f"{r.policy}: {r.wall_s / 3600:.2f} h, rollout util {100 * r.metrics['util_rollout']:.0f}%, "
            f"train idle {100 * r.metrics['idle_train']:.0f}%",
            fontsize=9,
            loc="left",
        )
        for t in r.step_end_s:
            ax.axvline(t / 3600, color="k", lw=0.5, ls=":")
    axes[-1, 0].set_xlabel("hours")
    handles = [Patch(color=v, label=k.replace("_", " ")) for k, v in _COLORS.items()]
    fig.legend(handles=handles, loc="upper center", ncol=6, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(results: list[SimResult], out_dir: str | Path, title: str = "simulation") -> dict[str, Path]:
    """``table.md``, ``results.json`` and (if recorded) ``timeline.png`` in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"table": out / "table.md", "json": out / "results.json"}
    paths["table"].write_text(f"# {title}\n\n{markdown_table(results)}\n")
    data = [
        {
            **row,
            "staleness_hist": json.loads(str(row["staleness_hist"])),
            "step_end_s": r.step_end_s,
            "checks": r.checks,
        }
        for row, r in zip(rows(results), results)
    ]
    paths["json"].write_text(json.dumps({"title": title, "results": data}, indent=2))
    if any(r.timeline is not None for r in results):
        paths["timeline"] = plot_timeline(results, out / "timeline.png")
    return paths


def run_cli(
    workload: str | Path,
    cells: int | None = None,
    policies: str = "colocate,async,elastic,elastic-async",
    steps: int | None = None,
    seed: int | None = None,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
) -> str:
    """What ``evoharness simulate`` does: load, run each policy, write, summarise.

    Raises:
        ConfigError / ValueError: a missing or malformed workload, an unknown
            policy, an impossible cluster.
    """
    from evoharness.runtime.schedulers import SCHEDULERS
    from evoharness.runtime.sim import compare
    from evoharness.runtime.workload import load_sim_config

    names = [p.strip() for p in policies.split(",") if p.strip()]
    bad = [p for p in names if p not in SCHEDULERS]
    if not names or bad:
        raise ValueError(f"unknown policy {', '.join(bad) or '(none)'}; choose from {', '.join(SCHEDULERS)}")
    flags = {"cluster.cells": cells, "steps": steps, "seed": seed}
    sets = [f"{k}={v}" for k, v in flags.items() if v is not None] + list(overrides or [])
    cfg, base_dir = load_sim_config(workload, sets)
    results = compare(cfg, names, record_timeline=out is not None, base_dir=base_dir)
    title = (
        f"{cfg.workload.name}: {cfg.cluster.cells} cells x {cfg.cluster.accelerators_per_cell} accelerators, "
        f"{cfg.workload.groups_per_step}x{cfg.workload.group_size} executions/step, {cfg.steps} steps, "
        f"seed {cfg.seed}"
    )
    text = f"{title}\n\n{markdown_table(results)}"
    if out is not None:
        paths = write_report(results, out, title)
        text += "\n\n" + "\n".join(f"{k}: {v}" for k, v in paths.items())
    return text
