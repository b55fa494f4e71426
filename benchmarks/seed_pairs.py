"""Two systems paired per game, seed by seed, and pooled over independent seeds.

Shared by `main_job_seeds.py` (SFT + GRPO against SFT inside each job) and `pair_runs.py` (one system
of two versions of the job, seed by seed). Jobs with different seeds are independent, so under the null
that the second system changes nothing each discordant game of each seed is a fair coin and the
exact sign test on the summed wins and losses (`eval.run_report.sign_test`) holds for the pool. For
the same reason the discordant games of different panels of one job (different games) can be summed
into one test too (`pool_panels`).
"""

from __future__ import annotations

from evoharness.eval.run_report import paired, sign_test

PANELS = ("valid_seen", "dev")  # every main job plays these
UNSEEN = "unseen"  # the unseen-room panel (eval/unseen_<system>): only jobs run since it existed


def pair_seed(
    a: dict[str, list[dict]], b: dict[str, list[dict]], names: tuple[str, str], panels: tuple[str, ...] = PANELS
) -> dict[str, dict]:
    """One seed's comparison on each of `panels` of `a`'s and `b`'s episodes (``{panel: episodes}``):
    ``{panel: {"games", names[0], names[1], "wins", "losses", "p"}}``, the two names holding each
    system's won games, wins / losses the games only `b` / only `a` won (`eval.run_report.paired`)."""
    out = {}
    for p in panels:
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


def pool(rows: list[dict], panels: tuple[str, ...] | None = None) -> dict[str, dict]:
    """``{panel: {"wins", "losses", "p"}}``: the rows' (`pair_seed` results) summed wins and losses and
    their exact two-sided sign test, for each of `panels` (default: those of `PANELS` and `UNSEEN` that
    every row has; a panel some row lacks is skipped, never pooled over part of the seeds)."""
    if panels is None:
        panels = tuple(p for p in (*PANELS, UNSEEN) if all(p in r for r in rows))
    out = {}
    for p in panels:
        w, lo = sum(r[p]["wins"] for r in rows), sum(r[p]["losses"] for r in rows)
        out[p] = {"wins": w, "losses": lo, "p": sign_test(w, lo)}
    return out


def pool_panels(rows: list[dict], panels: tuple[str, ...]) -> dict:
    """``{"panels", "wins", "losses", "p"}``: the wins and losses of every row on every one of `panels`
    summed into one exact sign test (the panels' games are different games, so each discordant one
    is still its own fair coin under the null)."""
    w = sum(r[p]["wins"] for r in rows for p in panels)
    lo = sum(r[p]["losses"] for r in rows for p in panels)
    return {"panels": list(panels), "wins": w, "losses": lo, "p": sign_test(w, lo)}


def panel_cells(v: dict, names: tuple[str, str], with_p: bool = True) -> str:
    """``a/n | b/n | wins | losses [| p]``: one panel of a `pair_seed` result as markdown cells."""
    cells = [f"{v[names[0]]}/{v['games']}", f"{v[names[1]]}/{v['games']}", str(v["wins"]), str(v["losses"])]
    return " | ".join(cells + ([f"{v['p']:.3g}"] if with_p else []))


def table_row(label: str, row: dict, names: tuple[str, str], last: str) -> str:
    """A markdown row ``| label | a/n | b/n | wins | losses | p | a dev/n | b dev/n | wins | losses | last |``
    of one `pair_seed` result."""
    return f"| {label} | {panel_cells(row['valid_seen'], names)} | {panel_cells(row['dev'], names, False)} | {last} |"
