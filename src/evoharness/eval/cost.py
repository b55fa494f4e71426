"""Cost of won episodes, paired per game: does one system win the same games in fewer steps?

EvoHarness-RL's stage-2 reward prices steps, wasted steps and tokens (reference.md, Eq. 5-6), so
its effect shows first in what a won episode costs, not in which games are won. `paired_cost`
compares two systems' episodes of one panel on the games both won, per game, with an exact
sign-flip permutation test (`sign_flip_test`) on the integer per-game differences.
"""

from __future__ import annotations

from typing import Any

from evoharness.harness.base import META_VERBS


def sign_flip_test(diffs: list[int]) -> float:
    """Exact two-sided paired permutation test of mean zero for integer differences.

    Under H0 each difference's sign is a fair coin (the two systems are exchangeable per game);
    p = P(|sum of randomly signed |d_i|| >= |sum d_i|), computed exactly by dynamic programming over
    the attainable sums (O(n * sum|d|)), so there is no sampling error and no normal approximation.

    Args:
        diffs: per-pair differences (b - a), integers; zeros carry no information and are dropped.

    Returns:
        The two-sided p-value in (0, 1]; 1.0 with no non-zero difference.
    """
    d = [abs(int(x)) for x in diffs if int(x) != 0]
    if not d:
        return 1.0
    total = sum(d)
    # counts[s]: sign assignments whose positive part sums to s; the signed sum is 2s - total
    counts = [0] * (total + 1)
    counts[0] = 1
    for x in d:
        for s in range(total, x - 1, -1):
            counts[s] += counts[s - x]
    observed = abs(sum(int(x) for x in diffs))
    extreme = sum(c for s, c in enumerate(counts) if abs(2 * s - total) >= observed)
    return min(1.0, extreme / 2 ** len(d))


def episode_cost(ep: dict[str, Any]) -> dict[str, int]:
    """An episode's integer costs: ``steps`` (every turn), ``env_steps``, ``harness_calls`` (meta-actions),
    each meta verb's calls and ``completion_tokens``, from an episodes.jsonl row (`Trajectory.to_dict`)."""
    calls = ep.get("meta_calls") or {}
    out = {
        "steps": int(ep["steps"]),
        "env_steps": int(ep.get("env_steps", ep["steps"])),
        "harness_calls": int(sum(calls.values())),
        "completion_tokens": int(ep.get("completion_tokens", 0)),
    }
    out.update({v: int(calls.get(v, 0)) for v in META_VERBS})
    return out


def cost_pairs(a: list[dict], b: list[dict], key: str) -> list[tuple[int, int]]:
    """``(cost under a, cost under b)`` of `key` (`episode_cost`) per game both systems won, by task id."""
    ea = {e["task_id"]: e for e in a if e["won"]}
    eb = {e["task_id"]: e for e in b if e["won"]}
    return [(episode_cost(ea[g])[key], episode_cost(eb[g])[key]) for g in sorted(ea.keys() & eb.keys())]


def summarize_pairs(pairs: list[tuple[int, int]]) -> dict[str, float | int]:
    """``{"a", "b"}`` (mean costs), ``fewer`` / ``more`` (games where b cost less / more) and ``p``
    (`sign_flip_test` on the differences b - a)."""
    diffs = [y - x for x, y in pairs]
    n = max(1, len(pairs))
    return {
        "a": sum(x for x, _ in pairs) / n,
        "b": sum(y for _, y in pairs) / n,
        "fewer": sum(d < 0 for d in diffs),
        "more": sum(d > 0 for d in diffs),
        "p": sign_flip_test(diffs),
    }


def paired_cost(a: list[dict], b: list[dict], keys: tuple[str, ...] = ("steps", "env_steps", "harness_calls")) -> dict:
    """System `b` against `a` on the games both won (episode lists of one panel, matched by task id).

    Returns:
        ``{"both_won": n, <key>: {"a": mean, "b": mean, "fewer": games where b was cheaper,
        "more": games where b cost more, "p": sign_flip_test}}`` per cost key (`episode_cost`).
    """
    out: dict[str, Any] = {}
    for k in keys:
        pairs = cost_pairs(a, b, k)
        out["both_won"] = len(pairs)
        out[k] = summarize_pairs(pairs)
    return out


def _cells(s: dict) -> str:
    return f"{s['a']:.2f} -> {s['b']:.2f} | {s['fewer']} / {s['more']} | {s['p']:.3g}"


def cost_section(panels: dict[str, dict[str, list[dict]]], a: str, b: str, reference: str | None = None) -> list[str]:
    """Markdown lines of the report's cost section (issue 50): `b` against `a` (and against `reference`,
    e.g. the scripted teacher it imitated) on the games both won, per panel and pooled, and what `b`
    changed by task type on the first panel.

    Args:
        panels: panel name -> system name -> its episodes (episodes.jsonl rows), first panel first.
        a / b: the two systems compared (e.g. SFT and SFT + GRPO).
        reference: a third system `b` is also paired against, pooled over the panels (None: none).
    """
    from evoharness.envs.alfworld.games import TASK_SHORT, TASK_TYPES

    keys = ("steps", "env_steps", "harness_calls")
    have = {p: eps for p, eps in panels.items() if a in eps and b in eps}
    if not have:
        return []
    md = [
        "### Cost of won episodes",
        "",
        f"On the games both systems won, paired per game: mean cost per episode, the games where {b} took fewer / "
        "more, and p, the exact two-sided sign-flip permutation test on the per-game differences (`eval.cost`). "
        "Steps count every turn (environment actions, meta-actions, invalid turns); harness calls are the "
        "meta-actions.",
        "",
        "| comparison | panel | games both won | steps | fewer / more | p | env steps | fewer / more | p "
        "| harness calls | fewer / more | p |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [(a, p, [(eps[a], eps[b])]) for p, eps in have.items()]
    if len(have) > 1:
        rows.append((a, " + ".join(have), [(eps[a], eps[b]) for eps in have.values()]))
    ref = {p: eps for p, eps in have.items() if reference in eps}
    if reference and ref:
        rows.append((reference, " + ".join(ref), [(eps[reference], eps[b]) for eps in ref.values()]))
    for base, panel, sets in rows:
        cells = {k: summarize_pairs([pr for x, y in sets for pr in cost_pairs(x, y, k)]) for k in keys}
        n = len([pr for x, y in sets for pr in cost_pairs(x, y, "steps")])
        md.append(f"| {b} vs {base} | {panel} | {n} | " + " | ".join(_cells(cells[k]) for k in keys) + " |")
    first, eps = next(iter(have.items()))

    def per_type(system: str, tt: str) -> dict[str, float]:
        got = [e for e in eps[system] if e.get("task_type") == tt]
        costs = [episode_cost(e) for e in got]
        n = max(1, len(got))
        row = {k: sum(c[k] for c in costs) / n for k in ("steps", "completion_tokens", *META_VERBS)}
        return {"won": sum(bool(e["won"]) for e in got), "n": len(got), **row}

    md += [
        "",
        f"What {b} changed against {a}, by task type ({first}, every episode; per episode):",
        "",
        "| type | success | steps | " + " | ".join(META_VERBS) + " | completion tokens |",
        "|---|---|---|" + "---|" * len(META_VERBS) + "---|",
    ]
    for tt in TASK_TYPES:
        x, y = per_type(a, tt), per_type(b, tt)
        if not x["n"]:
            continue
        verbs = " | ".join(f"{x[v]:.2f} -> {y[v]:.2f}" for v in META_VERBS)
        md.append(
            f"| {TASK_SHORT[tt]} | {x['won']}/{x['n']} -> {y['won']}/{y['n']} | {x['steps']:.1f} -> {y['steps']:.1f} | "
            f"{verbs} | {x['completion_tokens']:.0f} -> {y['completion_tokens']:.0f} |"
        )
    return md + [""]
