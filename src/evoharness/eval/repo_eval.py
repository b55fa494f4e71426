"""Evaluate a policy on repository tasks: one execution per task, a report with a plot.

Executions run on ``workers`` threads (each spends its time in sandboxed
subprocesses and HTTP calls). Each finished execution is appended to
``episodes.jsonl``; a rerun with the same output directory resumes, skipping
tasks already there. Also written: ``trace.jsonl`` (model-call durations for
``evoharness simulate``), ``summary.json``, ``report.md``, ``scores.png`` and
``workspaces/<task_id>/workspace`` (what each agent left, scored on a copy).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from evoharness.config.eval import RepoEvalConfig
from evoharness.envs.repo.policies import make_chat_policy
from evoharness.envs.repo.sandbox import require_bwrap
from evoharness.envs.repo.scaffold import run_repo_episode
from evoharness.envs.repo.task import load_tasks
from evoharness.envs.repo.trace import TraceWriter
from evoharness.files import read_jsonl


class RepoEvalError(RuntimeError):
    """Some executions raised (a harness fault); every other one is saved and reported."""


def evaluate_repo(cfg: RepoEvalConfig, progress: bool = True) -> dict:
    """Run the evaluation `cfg` describes; returns the summary (also written to ``out_dir``).

    Raises:
        TaskFormatError: bad task path or task.
        ValueError: unknown task id, bad policy config.
        SandboxUnavailable: bwrap missing.
        RepoEvalError: an execution raised; raised after the others finished and the
            report was written (a rerun with ``resume`` retries only the failed ones).
    """
    from evoharness.eval.repo_report import summarize_repo, write_repo_report

    require_bwrap()
    tasks = load_tasks(cfg.repo.tasks)
    if cfg.repo.task_ids:
        known = {t.task_id for t in tasks}
        missing = sorted(set(cfg.repo.task_ids) - known)
        if missing:
            raise ValueError(f"unknown task ids {missing}; known: {sorted(known)}")
        tasks = [t for t in tasks if t.task_id in cfg.repo.task_ids]
    if cfg.limit:
        tasks = tasks[: cfg.limit]
    policy_kw = cfg.policy.model_dump(exclude={"kind"}) if cfg.policy.kind == "openai" else {}
    policy = make_chat_policy(cfg.policy.kind, **policy_kw)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    jsonl = out / "episodes.jsonl"
    if not cfg.resume:
        for f in (jsonl, out / "trace.jsonl"):
            f.unlink(missing_ok=True)
    have = {d["task_id"]: d for d in read_jsonl(jsonl)}
    todo = [t for t in tasks if t.task_id not in have]
    trace = TraceWriter(out / "trace.jsonl")
    t0 = time.perf_counter()
    failures: list[str] = []
    bar = tqdm(
        total=len(tasks),
        initial=len(tasks) - len(todo),
        desc="eval repo",
        unit="task",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        with open(jsonl, "a") as f, ThreadPoolExecutor(cfg.workers) as pool:
            futs = {
                pool.submit(
                    run_repo_episode, t, policy, out / "workspaces" / t.task_id, cfg.repo.agent, trace, f"{t.task_id}#0"
                ): t.task_id
                for t in todo
            }
            for fut in as_completed(futs):
                try:
                    d = fut.result().to_dict()
                except Exception as e:  # a harness fault in one execution: the others still land
                    failures.append(f"{futs[fut]}: {type(e).__name__}: {e}"[:500])
                    bar.update(1)
                    continue
                f.write(json.dumps(d) + "\n")
                f.flush()
                os.fsync(f.fileno())
                have[d["task_id"]] = d
                bar.update(1)
                bar.set_postfix(mean_score=f"{sum((e['reward'] or 0) for e in have.values()) / len(have):.2f}")
    finally:
        bar.close()
        policy.close()
    order = {t.task_id: i for i, t in enumerate(tasks)}
    episodes = sorted((d for d in have.values() if d["task_id"] in order), key=lambda d: order[d["task_id"]])
    tmp = jsonl.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(d) + "\n" for d in episodes))
    os.replace(tmp, jsonl)
    summary = summarize_repo(episodes)
    summary.update(
        policy=cfg.policy.kind if cfg.policy.kind != "openai" else f"openai:{cfg.policy.model}",
        task_source=cfg.repo.tasks,
        wall_s=round(time.perf_counter() - t0, 2),
    )
    write_repo_report(summary, out)
    if failures:
        raise RepoEvalError(
            f"{len(failures)} of {len(todo)} executions failed (the rest are saved in {jsonl}; "
            f"rerun to retry them): " + "; ".join(failures)
        )
    return summary


def run_cli(config: Path | None, overrides: list[str]) -> str:
    """``evoharness eval --env repo``: run and return the text to print (tables + report path).

    Raises:
        ConfigError / TaskFormatError (ValueError), SandboxUnavailable (RuntimeError).
    """
    from evoharness.config.base import load_config
    from evoharness.eval.repo_report import difficulty_table, repo_table

    cfg = load_config(RepoEvalConfig, config, overrides)
    summary = evaluate_repo(cfg)
    return "\n\n".join([difficulty_table(summary), repo_table(summary), f"report: {Path(cfg.out_dir) / 'report.md'}"])
