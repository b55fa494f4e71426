"""Fixed-panel evaluation: play a split's games, stream one JSONL line per episode, report.

Episodes are split into chunks of ``batch_size`` (played in lock-step so a
model policy answers them as one batch) and the chunks run on ``workers``
processes. Every episode's randomness is keyed by its id, so results do not
depend on the number of workers. Finished episodes are appended to
``episodes.jsonl`` as they end; a rerun with the same output directory
resumes, skipping episodes already there. It resumes only the same
evaluation: a directory whose ``config.json`` differs in anything that changes
an episode (policy, model, harness, env, split, protocol, step cap, seed) is
refused with the differing keys named, rather than reporting the old
episodes as the new system's.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from tqdm import tqdm

from evoharness.config.eval import EvalConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.eval.panel import build_episodes
from evoharness.files import read_jsonl
from evoharness.harness.factory import make_harness
from evoharness.policies.factory import make_policy
from evoharness.policies.guard import ErrorGuard, PolicyFailure, probe_policy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.rollout.records import Trajectory
from evoharness.tracking import Tracker, check_trackers

# settings a resumed evaluation may change: they do not change what an episode records
_RESUME_FREE = {
    "workers": True,
    "batch_size": True,
    "limit": True,
    "resume": True,
    "tracking": True,
    "out_dir": True,
    "policy": {
        "concurrency": True,
        "timeout_s": True,
        "max_retries": True,
        "num_threads": True,
        "api_key_env": True,
        "max_consecutive_errors": True,
    },
}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resumable(out: Path, cfg: EvalConfig) -> None:
    """Raise ValueError if `out` holds episodes of an evaluation other than `cfg`
    (its ``config.json`` differs in a setting outside `_RESUME_FREE`)."""
    saved = out / "config.json"
    if not saved.is_file() or not (out / "episodes.jsonl").is_file():
        return
    old = _flat(json.loads(saved.read_text()))
    new = _flat(json.loads(cfg.model_dump_json()))
    free = set(_flat(_RESUME_FREE))
    diff = sorted(k for k in old.keys() | new.keys() if k not in free and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:4])
        raise ValueError(
            f"{out} holds episodes of another evaluation ({shown}{', ...' if len(diff) > 4 else ''}); "
            "use a new --out, or --set resume=false to replace them"
        )


# Per-process state of a pool worker (built once by the initializer).
_WORKER: dict = {}


def _init_worker(cfg_json: str, finished=None) -> None:
    cfg = EvalConfig.model_validate_json(cfg_json)
    _WORKER["cfg"] = cfg
    _WORKER["finished"] = finished  # a queue (pool workers) or a callable (in-process): each episode as it ends
    _WORKER["policy"] = ErrorGuard(make_policy(cfg.policy), cfg.policy.max_consecutive_errors)


def _init_pool_worker(cfg_json: str, finished=None) -> None:
    # A failing initializer would only break the pool; keep the error for the first chunk to
    # raise, so the caller gets its type and message (a missing model directory, say).
    try:
        _init_worker(cfg_json, finished)
    except Exception as e:  # noqa: BLE001 - re-raised by _play_chunk
        _WORKER["error"] = e


def _play_chunk(specs: list[EpisodeSpec]) -> list[dict]:
    if "error" in _WORKER:
        raise _WORKER["error"]
    cfg: EvalConfig = _WORKER["cfg"]
    sink = _WORKER.get("finished")

    def on_finish(t) -> None:
        t.info["wording"] = (
            cfg.env.wording
        )  # tools that replay the log (distill) read it: `put X in/on Y` or `move X to Y`
        if sink is not None:  # streamed, so an episode outlives a later crash of its chunk
            (sink if callable(sink) else sink.put)(t.to_dict())

    trajs = run_episodes(
        specs,
        make_env=lambda task: make_env(task, engine=cfg.env.engine, wording=cfg.env.wording),
        make_harness=lambda: make_harness(cfg.harness),
        policy=_WORKER["policy"],
        max_steps=cfg.step_cap,
        env_timeout_s=cfg.env.timeout_s,
        stop_repeats=cfg.stop_repeats,
        on_finish=on_finish,
    )
    return [t.to_dict() for t in trajs]


def evaluate(cfg: EvalConfig, progress: bool = True) -> dict:
    """Run the evaluation `cfg` describes; returns the summary (also written to disk).

    Writes to ``cfg.out_dir``: ``episodes.jsonl`` (one trajectory per line, in
    panel order once complete), ``summary.json``, ``report.md``, ``success.png``.

    Raises:
        GameDataError: missing data path or unknown split.
        ValueError: bad protocol or policy config.
        RuntimeError: a worker process died (the episodes finished before it are kept).
        PolicyFailure: the policy's endpoint does not answer before the first episode, or
            ``policy.max_consecutive_errors`` calls in a row failed (finished episodes are kept).
        Any error a worker raised (e.g. FileNotFoundError for a missing model directory).
    """
    return evaluate_many([cfg], progress)[0]


# what may differ between the evaluations `evaluate_many` plays together: which games, where they go
_PER_PANEL = {"split", "protocol", "limit", "games", "task_types", "out_dir", "seed", "max_steps"}


def _panel_specs(cfg: EvalConfig) -> list[EpisodeSpec]:
    tasks = discover_games(cfg.split, cfg.env.data_path, tuple(cfg.task_types))
    if cfg.games is not None:
        wanted = set(cfg.games)
        tasks = [t for t in tasks if t.task_id in wanted]
        if len(tasks) != len(wanted):
            raise ValueError(
                f"{len(wanted) - len(tasks)} of the {len(wanted)} requested games are not in split {cfg.split!r}"
            )
    specs = build_episodes(tasks, cfg.protocol, cfg.seed)
    return balanced(specs)[: cfg.limit] if cfg.limit else specs


def balanced(specs: list[EpisodeSpec]) -> list[EpisodeSpec]:
    """`specs` interleaved round-robin across task types (each type in panel order), so that any
    prefix (``limit``) has every type: the first 6 of valid_seen are one game of each."""
    pools: dict[str, list[EpisodeSpec]] = {}
    for s in specs:
        pools.setdefault(s.task.task_type, []).append(s)
    out = []
    for i in range(max(map(len, pools.values()), default=0)):
        out += [p[i] for p in pools.values() if i < len(p)]
    return out


def chunk_sizes(n: int, workers: int, batch_size: int) -> list[int]:
    """Sizes of the lock-step chunks `n` episodes are played in: at most `batch_size` each, and
    a multiple of `workers` chunks of near-equal size, so no worker idles while another plays
    a second chunk (60 games on 2 workers: 30 + 30, not 60 + 0)."""
    if n <= 0:
        return []
    rounds = -(-n // (max(1, workers) * batch_size))
    k = max(1, workers) * rounds
    k = min(k, n)
    return [n // k + (i < n % k) for i in range(k)]


def evaluate_many(cfgs: list[EvalConfig], progress: bool = True) -> list[dict]:
    """Play several evaluations of one system as one pool of lock-step batches (a model policy
    answers the episodes of every panel in the same forward passes); returns their summaries.

    Each config writes its own ``out_dir`` exactly as `evaluate` would (and resumes from it). The
    configs may differ only in which games they play and where they write (`_PER_PANEL`); policy,
    harness, env, step cap, early stopping, workers and batch size come from the first. A system
    evaluated on valid_seen and on a development set this way skips one worker start-up and one
    tail of lock-step batches (the longest episode of each batch) per extra panel. An episode in
    several panels (same id and seed) is played once and recorded in each. Every episode is
    recorded as it ends, so a worker that dies loses only the episodes it was still playing.

    Raises:
        ValueError: configs that differ in the system played or the step cap, an episode id with
            two seeds, or a directory holding another evaluation's episodes (nothing is written
            then); and what `evaluate` raises.
    """
    from evoharness.eval.report import summarize, write_report

    if not cfgs:
        return []
    base = cfgs[0]

    def shared(c: EvalConfig) -> dict:
        return {k: v for k, v in _flat(json.loads(c.model_dump_json())).items() if k.split(".")[0] not in _PER_PANEL}

    for c in cfgs[1:]:
        if shared(c) != shared(base) or c.step_cap != base.step_cap:
            raise ValueError(
                f"evaluations played together must share the system and step cap: {c.out_dir} "
                f"differs from {base.out_dir}"
            )
    specs_of = [_panel_specs(c) for c in cfgs]
    seeds: dict[str, int] = {}
    for specs in specs_of:
        for s in specs:
            if seeds.setdefault(s.episode_id, s.seed) != s.seed:
                raise ValueError(f"episode {s.episode_id} is in two of the evaluations with different seeds")
    for c in cfgs:
        check_trackers(c.tracking)  # a tracker without its package fails before any episode
    if base.policy.kind == "openai":  # a dead endpoint fails here, before any episode or file
        probe = make_policy(base.policy)
        try:
            probe_policy(probe)
        finally:
            probe.close()
    for c in cfgs:  # every check before anything is written
        if c.resume:
            check_resumable(Path(c.out_dir), c)
    panels = []  # (cfg, specs, have: episode id -> dict, episodes.jsonl)
    for c, specs in zip(cfgs, specs_of):
        out = Path(c.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(c.model_dump_json(indent=2))
        jsonl = out / "episodes.jsonl"
        if not c.resume and jsonl.exists():
            jsonl.unlink()
        panels.append((c, specs, {d["episode_id"]: d for d in read_jsonl(jsonl)} if c.resume else {}, jsonl))
    in_panels: dict[str, list[int]] = {}
    for i, (_, specs, _, _) in enumerate(panels):
        for s in specs:
            in_panels.setdefault(s.episode_id, []).append(i)
    known = {k: d for _, _, have, _ in panels for k, d in have.items() if k in in_panels}
    todo = list({s.episode_id: s for specs in specs_of for s in specs if s.episode_id not in known}.values())
    n_total = sum(len(specs) for specs in specs_of)
    t0 = time.perf_counter()
    bar = tqdm(
        total=n_total,
        desc=f"eval {'+'.join(c.split for c in cfgs)}",
        unit="ep",
        disable=not progress,
        dynamic_ncols=True,
    )
    files = [open(jsonl, "a") for *_, jsonl in panels]
    try:

        def record(d: dict) -> None:  # one finished episode, into every panel that lacks it
            for i in in_panels.get(d["episode_id"], []):
                have, f = panels[i][2], files[i]
                if d["episode_id"] in have:
                    continue
                f.write(json.dumps(d) + "\n")
                f.flush()
                os.fsync(f.fileno())
                have[d["episode_id"]] = d
                bar.update(1)
            won = sum(d["won"] for _, _, have, _ in panels for d in have.values())
            bar.set_postfix(success=f"{won}/{sum(len(have) for _, _, have, _ in panels)}")

        bar.update(sum(len(have) for _, _, have, _ in panels))
        for d in known.values():  # played for another panel (an earlier run): not played again
            record(d)
        chunks, at = [], 0
        for size in chunk_sizes(len(todo), base.workers, base.batch_size):
            chunks.append(todo[at : at + size])
            at += size
        if base.workers <= 1:
            _init_worker(base.model_dump_json(), record)
            try:
                for chunk in chunks:
                    _play_chunk(chunk)
            finally:
                _WORKER["policy"].close()
        elif chunks:
            _play_pool(base, chunks, record, ", ".join(str(jsonl) for *_, jsonl in panels))
    except PolicyFailure as e:
        kept = sum(len(have) for _, _, have, _ in panels)
        raise PolicyFailure(f"{e}; stopped with {kept} finished episodes kept (a rerun resumes)") from e
    finally:
        for f in files:
            f.close()
    bar.close()
    wall = round(time.perf_counter() - t0, 2)
    summaries = []
    for c, specs, have, jsonl in panels:
        order = {s.episode_id: i for i, s in enumerate(specs)}
        episodes = sorted((d for d in have.values() if d["episode_id"] in order), key=lambda d: order[d["episode_id"]])
        tmp = jsonl.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(d) + "\n" for d in episodes))
        os.replace(tmp, jsonl)
        summary = summarize([Trajectory.from_dict(d) for d in episodes], c)
        summary["wall_s"] = wall  # of the whole pool when panels were played together
        write_report(summary, out=jsonl.parent)
        with Tracker(c.tracking, jsonl.parent, f"eval-{c.split}", json.loads(c.model_dump_json())) as tracker:
            tracker.log({"overall": summary["overall"], "by_type": summary["by_type"]}, step=0)
        summaries.append(summary)
    return summaries


def _play_pool(cfg: EvalConfig, chunks: list[list[EpisodeSpec]], record: Callable[[dict], None], logs: str) -> None:
    """Play `chunks` on ``cfg.workers`` spawned processes; every episode reaches `record` as it ends
    (through a queue), and a chunk's returned episodes once more (`record` keeps the first)."""
    ctx = mp.get_context("spawn")
    finished = ctx.Queue()
    # concurrent.futures, not multiprocessing.Pool: a worker that dies (killed, out of memory,
    # a script without a __main__ guard re-running this at import) breaks the executor with
    # an error, where a Pool would start replacement workers forever
    pool = ProcessPoolExecutor(
        cfg.workers, mp_context=ctx, initializer=_init_pool_worker, initargs=(cfg.model_dump_json(), finished)
    )
    pending = {pool.submit(_play_chunk, chunk) for chunk in chunks}
    try:
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(finished, record)
            for fut in done:
                for d in fut.result():  # raises the chunk's error
                    record(d)
    except BrokenProcessPool as e:
        raise RuntimeError(
            f"an evaluation worker process died (the episodes finished before it are recorded in "
            f"{logs}; the same evaluation rerun resumes from them). If evaluate() was called "
            'from a script, its entry point needs `if __name__ == "__main__":` (workers are '
            "spawned and import it)."
        ) from e
    finally:
        # chunks already running when something failed play on until shutdown: keep what they finish
        _shutdown_draining(pool, finished, record)


def _drain(finished: mp.Queue, record: Callable[[dict], None], timeout: float = 0.0) -> None:
    """Record every episode in the queue (waiting up to `timeout` s for the first)."""
    try:
        record(finished.get(timeout=timeout) if timeout else finished.get_nowait())
        while True:
            record(finished.get_nowait())
    except queue.Empty:
        return


def _shutdown_draining(pool: ProcessPoolExecutor, finished: mp.Queue, record: Callable[[dict], None]) -> None:
    """Shut `pool` down (unstarted chunks cancelled) while reading `finished`: a worker process
    exits only after its queue's feeder thread has written everything it put, which blocks on a
    full pipe until this process reads it, so a shutdown that only waits would wait forever (an
    episode put just before its chunk returned, or one of a chunk still running at an error)."""
    closer = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "cancel_futures": True}, daemon=True)
    closer.start()
    while closer.is_alive():
        _drain(finished, record, timeout=0.1)
    _drain(finished, record)
