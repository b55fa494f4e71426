"""Collect traces for stage-1 SFT, and turn them into (messages -> completion) examples.

`collect_traces` plays tasks with a policy (normally the scripted BPE teacher,
or an LLM teacher through ``OpenAIPolicy``) in batches and writes one
`Trajectory` per JSONL line: every turn with its messages, completion, kind,
action, feedback and harness views (``rollout/records.py``).

Experience across episodes (EvoHarness-RL §Experience): all episodes share one
`ExperienceStore`. It is frozen while a batch plays (reads see the counts at
freeze time, writes are buffered) and consolidated after each batch, so the
next batch recalls what the previous ones found and noted. With
``experience_path`` the store is saved after each batch and loaded on resume.

Resume: episode ids already in ``out_jsonl`` are skipped, and so are ids of
episodes played but not kept (``keep="successful"`` drops failures); those are
listed one per line in ``<out_jsonl>.dropped``. A batch is written when it
ends, then the store is consolidated and saved; a run killed mid-batch replays
that batch. (Killed between the write and the save, the resumed store misses
that one batch's consolidation.)

`traces_to_sft` turns the turns of successful episodes into SFT examples
``{"messages": [...], "completion": "<think>…</think><action>…</action>", ...}``
(the format `train/sft.py` reads), written atomically.

Command line (the teacher on the bundled train games, then the SFT file; `run_collect`)::

    evoharness collect --split train --per-type 10 \\
        --out runs/traces/teacher.jsonl --sft runs/traces/sft.jsonl

One prompt recipe: the harness keys (``harness.history_window``, ``harness.system_prompt``)
must be the ones ``eval`` and ``rl`` get; the defaults agree, and the SFT examples' recipe
(``<sft>.recipe.json``) carries them to the model ``evoharness sft`` trains.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from evoharness.config.collect import CollectConfig
from evoharness.config.harness import HarnessConfig
from evoharness.envs.base import Env, TaskSpec
from evoharness.files import read_jsonl
from evoharness.harness.base import Harness, split_completion
from evoharness.harness.factory import make_harness
from evoharness.policies.base import Policy, format_action
from evoharness.rollout.episode import EpisodeSpec, run_episodes

Keep = Literal["successful", "all"]
HarnessFactory = Callable[[Any], Harness]  # (experience store or None) -> a fresh harness


def bpe_harness_factory(cfg: HarnessConfig | None = None) -> HarnessFactory:
    """A factory of harnesses built from `cfg` (default: `HarnessConfig()`, the BPE harness
    as ``eval`` and ``rl`` build it), sharing the store they are given.

    The teacher's prompts become SFT examples: render them with the same
    configuration the student is evaluated and trained with (one prompt recipe).
    """
    cfg = cfg or HarnessConfig()
    return lambda store: make_harness(cfg, experience=store)


@dataclass
class CollectStats:
    """What one `collect_traces` call did (``skipped``: already in the files)."""

    planned: int = 0
    skipped: int = 0
    played: int = 0
    won: int = 0
    kept: int = 0
    turns_kept: int = 0
    batches: int = 0
    store_ops: dict[str, int] = field(default_factory=dict)

    @property
    def success(self) -> float:
        return self.won / self.played if self.played else 0.0


def _trim_torn_tail(path: Path) -> None:
    """Cut a file back to its last newline, so appends never extend a torn line."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _append(path: Path, lines: list[str]) -> None:
    if not lines:
        return
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())


def collect_traces(
    tasks: list[TaskSpec],
    policy: Policy,
    make_harness: HarnessFactory,
    make_env: Callable[[TaskSpec], Env],
    out_jsonl: str | Path,
    samples: int = 1,
    max_steps: int = 50,
    keep: Keep = "successful",
    batch_size: int = 8,
    experience=None,
    experience_path: str | Path | None = None,
    consolidator=None,
    seed: int = 0,
    progress: bool = True,
    wording: str = "native",
) -> CollectStats:
    """Play `samples` episodes per task and append the kept ones to `out_jsonl`.

    Args:
        tasks: games to play (episode ids ``<task_id>#<k>``, k < samples).
        policy: who plays (the teacher, an LLM policy, ...).
        make_harness: ``store -> Harness``; each episode gets a fresh harness
            sharing the store (see `bpe_harness_factory`).
        make_env: ``task -> Env``, a fresh environment per episode.
        out_jsonl: trajectories, one JSON object per line.
        max_steps: step budget per episode (meta-actions count).
        keep: ``successful`` (won episodes only) or ``all``.
        batch_size: episodes played in lock-step; the store is frozen for a
            batch and consolidated after it.
        experience: the `ExperienceStore` (None: a fresh seeded store; ignored
            when ``experience_path`` exists, which is loaded instead).
        experience_path: where the store is saved after each batch.
        consolidator: passed to `ExperienceStore.consolidate` (None: rules).
        seed: episode seed recorded in the trajectories.
        wording: the placing-command wording `make_env` plays (``native``,
            ``put`` or ``move``), recorded in each trajectory's ``info`` for
            tools that replay it (distill).

    Returns:
        `CollectStats` of this call.
    """
    from evoharness.harness.bpe import ExperienceStore

    if keep not in ("successful", "all"):
        raise ValueError(f"keep must be 'successful' or 'all', got {keep!r}")
    out = Path(out_jsonl)
    out.parent.mkdir(parents=True, exist_ok=True)
    dropped_path = out.with_name(out.name + ".dropped")
    for p in (out, dropped_path):
        _trim_torn_tail(p)
    done = {d["episode_id"] for d in read_jsonl(out)}
    if dropped_path.is_file():
        done |= {ln.split("\t")[0] for ln in dropped_path.read_text().splitlines() if ln.strip()}
    if experience_path and Path(experience_path).is_file():
        store = ExperienceStore.load(experience_path)
    else:
        store = experience if experience is not None else ExperienceStore()

    specs = [EpisodeSpec(t, f"{t.task_id}#{k}", seed) for t in tasks for k in range(samples)]
    todo = [s for s in specs if s.episode_id not in done]
    stats = CollectStats(planned=len(specs), skipped=len(specs) - len(todo))
    bar = tqdm(
        total=len(specs), initial=stats.skipped, desc="collect", unit="ep", disable=not progress, dynamic_ncols=True
    )
    for i in range(0, len(todo), batch_size):
        batch = todo[i : i + batch_size]
        store.freeze()
        epoch = store.epoch
        trajs = run_episodes(
            batch,
            make_env,
            lambda: make_harness(store),
            policy,
            max_steps=max_steps,
            on_finish=lambda _t: bar.update(1),
        )
        kept, dropped = [], []
        for t in trajs:
            t.info["experience_epoch"] = epoch
            t.info["wording"] = wording
            stats.played += 1
            stats.won += t.won
            if t.won or keep == "all":
                kept.append(json.dumps(t.to_dict()))
                stats.kept += 1
                stats.turns_kept += len(t.turns)
            else:
                dropped.append(f"{t.episode_id}\t{t.stop_reason}")
        _append(out, kept)
        _append(dropped_path, dropped)
        for op in store.consolidate(consolidator):
            stats.store_ops[op.op] = stats.store_ops.get(op.op, 0) + 1
        store.unfreeze()
        if experience_path:
            store.save(experience_path)
        stats.batches += 1
        bar.set_postfix(won=f"{stats.won}/{stats.played}", kept=stats.kept)
    bar.close()
    return stats


def turn_example(traj: dict, turn: dict) -> dict | None:
    """One SFT example from a turn (None for invalid or failed turns).

    The completion is re-written as ``<think>…</think><action>…</action>``
    with the action as the harness executed it (an admissible command exactly,
    or ``verb argument`` for a meta-action).
    """
    if turn.get("kind") not in ("env", "meta") or turn.get("error") or not turn.get("messages"):
        return None
    think, _ = split_completion(turn.get("completion", ""))
    return {
        "messages": turn["messages"],
        "completion": format_action(turn["action"], think),
        "episode_id": traj.get("episode_id", ""),
        "task_type": traj.get("task_type", ""),
        "turn": turn.get("turn", 0),
        "kind": turn["kind"],
    }


def traces_to_sft(
    jsonl: str | Path | list[dict], out_path: str | Path | None = None, successful_only: bool = True
) -> list[dict]:
    """SFT examples, one per turn of the (successful) episodes of a trajectory JSONL.

    Args:
        jsonl: a trajectory JSONL path, or already-read trajectory dicts.
        out_path: if set, the examples are written there as JSONL atomically
            (a temporary file, then a rename).
        successful_only: skip episodes that were not won.

    Returns:
        ``[{"messages", "completion", "episode_id", "task_type", "turn", "kind"}, ...]``
    """
    trajs = read_jsonl(jsonl) if isinstance(jsonl, (str, Path)) else jsonl
    examples = []
    for d in trajs:
        if successful_only and not d.get("won"):
            continue
        for turn in d.get("turns", []):
            if (ex := turn_example(d, turn)) is not None:
                examples.append(ex)
    if out_path is not None:
        write_jsonl_atomic(out_path, examples)
    return examples


def write_jsonl_atomic(path: str | Path, records: list[dict]) -> None:
    """Write records as JSONL through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_collect(cfg: CollectConfig, log: Callable[[str], None] = print) -> CollectStats:
    """``evoharness collect``: play `cfg`'s games with its policy, write the traces (and the SFT
    examples with their recipe, `config.recipe.write_examples_recipe`).

    Raises:
        GameDataError: the split has no games at ``cfg.env.data_path``.
    """
    from collections import defaultdict

    from evoharness.config.recipe import ExamplesRecipe, write_examples_recipe
    from evoharness.envs.alfworld import make_env
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.policies.factory import make_policy

    tasks = discover_games(cfg.split, cfg.env.data_path)
    if cfg.per_type:
        by: dict[str, list[TaskSpec]] = defaultdict(list)
        for t in tasks:
            by[t.task_type].append(t)
        tasks = [t for ts in by.values() for t in ts[: cfg.per_type]]
    wording = cfg.env.wording
    policy = make_policy(cfg.policy)
    try:
        stats = collect_traces(
            tasks,
            policy,
            bpe_harness_factory(cfg.harness),
            lambda t: make_env(t, engine=cfg.env.engine, wording=wording),
            cfg.out,
            samples=cfg.samples,
            max_steps=cfg.max_steps,
            keep=cfg.keep,
            batch_size=cfg.batch_size,
            experience_path=cfg.experience,
            wording=wording,
        )
    finally:
        policy.close()
    log(
        f"played {stats.played} (skipped {stats.skipped}), won {stats.won}, kept {stats.kept} "
        f"({stats.turns_kept} turns) -> {cfg.out}"
    )
    if cfg.sft:
        n = len(traces_to_sft(cfg.out, cfg.sft))
        write_examples_recipe(cfg.sft, ExamplesRecipe(harness=cfg.harness, wording=wording, experience=cfg.experience))
        log(f"{n} SFT examples -> {cfg.sft}")
    return stats
