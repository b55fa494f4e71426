"""Two systems paired per game, seed by seed, and pooled over independent seeds.

Shared by `main_job_seeds.py` (SFT + GRPO against SFT inside each job) and `pair_runs.py` (one system
of two versions of the job, seed by seed). Jobs with different seeds are independent, so under the null
that the second system changes nothing each discordant game of each seed is a fair coin and the
exact sign test on the summed wins and losses (`eval.run_report.sign_test`) holds for the pool.
"""

from __future__ import annotations

from evoharness.eval.run_report import paired, sign_test

PANELS = ("valid_seen", "dev")


def pair_seed(a: dict[str, list[dict]], b: dict[str, list[dict]], names: tuple[str, str]) -> dict[str, dict]:
    """One seed's comparison on each panel of `a`'s and `b`'s episodes (``{panel: episodes}``):
    ``{panel: {"games", names[0], names[1], "wins", "losses", "p"}}``, the two names holding each
    system's won games, wins / losses the games only `b` / only `a` won (`eval.run_report.paired`)."""
    out = {}
    for p in PANELS:
        c = paired(a[p], b[p])
        out[p] = {
            "games": c["n"],
            names[0]: sum(e["won"] for e in a[p]),
            names[1]: sum(e["won"] for e in b[p]),
            "wins": c["b_only"],
            "losses": c["a_only"],
            "p": c["p"],
        }
    return out


def pool(rows: list[dict]) -> dict[str, dict]:
    """``{panel: {"wins", "losses", "p"}}``: the rows' (`pair_seed` results) summed wins and losses and
    their exact two-sided sign test."""
    out = {}
    for p in PANELS:
        w, lo = sum(r[p]["wins"] for r in rows), sum(r[p]["losses"] for r in rows)
        out[p] = {"wins": w, "losses": lo, "p": sign_test(w, lo)}
    return out


def table_row(label: str, row: dict, names: tuple[str, str], last: str) -> str:
    """A markdown row ``| label | a/n | b/n | wins | losses | p | a dev/n | b dev/n | wins | losses | last |``
    of one `pair_seed` result."""
    v, d = row["valid_seen"], row["dev"]
    return (
        f"| {label} | {v[names[0]]}/{v['games']} | {v[names[1]]}/{v['games']} | {v['wins']} | {v['losses']} | "
        f"{v['p']:.3g} | {d[names[0]]}/{d['games']} | {d[names[1]]}/{d['games']} | {d['wins']} | "
        f"{d['losses']} | {last} |"
    )
