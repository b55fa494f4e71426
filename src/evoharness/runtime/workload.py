"""Workloads and clusters for the simulator: typed configs, TOML and JSONL traces.

A *workload* is what one RL step asks for: ``groups_per_step`` GRPO groups of
``group_size`` executions. An execution is a sequence of turns; a turn is one
model call (new prompt tokens to prefill, completion tokens to decode) followed
by tool/environment latency in seconds. Lengths are drawn from distributions
(`Dist`: fixed, lognormal, Pareto, uniform, each clippable), and an optional
``timeout_s`` caps an execution's *nominal* duration (completion tokens at
``timeout_ref_tps`` tokens/s per sequence plus tool latency), so that long
tails pile up just under the timeout, as QwenGyre (arXiv 2609.33848) describes
for hours-long NL2Repo executions. The cap is applied when the workload is
drawn, not in simulated time, so every schedule runs exactly the same work.

Or a JSONL *trace* of real executions, one line per model call
(``{"execution", "group"?, "start", "end", "prompt_tokens", "completion_tokens"}``,
seconds and tokens) or one line per trajectory as written by
`evoharness.rollout.records.Trajectory.to_dict` (turns with ``prompt_tokens``,
``completion_tokens``, optional ``start``/``end``). Prompt tokens are full
prompts: the new part is what exceeds the previous call's prompt + completion
(prefix caching); tool latency is the gap to the next call.

A *cluster* is K identical cells (see `runtime.cells`) with a generation
throughput model ``tps(n) = gen_tps_single * n ** gen_concurrency_exponent``
tokens/s for n concurrent sequences (sublinear, n <= capacity), a training
throughput in tokens/s, weight-sync and role-switch costs in seconds
(QwenGyre measured 8.52 s rollout -> train and 3.46 s back), and whether a
weight update invalidates the rollout cells' KV caches (``sync_flushes_kv``,
default True: executions that span an update re-prefill their context).

Every random draw depends only on (seed, step), never on the schedule.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evoharness.config.base import ConfigError, load_config
from evoharness.config.sim import SimConfig, WorkloadConfig

# ---- traces -----------------------------------------------------------------


@dataclass
class TraceExecution:
    group: str
    prompt: np.ndarray  # new prompt tokens per turn
    completion: np.ndarray  # completion tokens per turn
    tool_s: np.ndarray  # seconds after each call before the next one
    step: int | None = None  # the RL step it was played in (a run's own trace, `runtime/trace.jsonl`)


def _turns_to_execution(group: str, turns: list[dict[str, Any]], wall_s: float | None, where: str) -> TraceExecution:
    if not turns:
        raise ConfigError(f"{where}: execution has no turns")
    try:
        p = [float(t["prompt_tokens"]) for t in turns]
        c = [float(t["completion_tokens"]) for t in turns]
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: each turn needs numeric prompt_tokens and completion_tokens ({e})") from None
    new = [p[0]] + [p[k] - (p[k - 1] + c[k - 1]) if p[k] >= p[k - 1] + c[k - 1] else p[k] for k in range(1, len(p))]
    if all("start" in t and "end" in t for t in turns):
        tool = [max(0.0, float(turns[k + 1]["start"]) - float(turns[k]["end"])) for k in range(len(turns) - 1)]
        tool.append(0.0)
    else:  # no per-call timing: spread the wall time over the turns (an upper bound)
        tool = [float(wall_s or 0.0) / len(turns)] * len(turns)
    return TraceExecution(group, np.asarray(new), np.asarray(c), np.asarray(tool))


def load_trace(path: str | Path) -> list[TraceExecution]:
    """Parse a JSONL trace (see module docstring) into executions, in file order."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"trace file not found: {p}")
    calls: dict[str, list[dict[str, Any]]] = {}
    groups: dict[str, str] = {}
    out: list[TraceExecution] = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{i}: not valid JSON: {e}") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"{p}:{i}: expected a JSON object")
        if "turns" in rec:
            key = str(rec.get("task_id", rec.get("episode_id", i)))
            out.append(_turns_to_execution(key, rec["turns"], rec.get("wall_s"), f"{p}:{i}"))
            out[-1].step = rec.get("step")
        elif "execution" in rec:
            eid = str(rec["execution"])
            calls.setdefault(eid, []).append(rec)
            groups.setdefault(eid, str(rec.get("group", eid)))
        else:
            raise ConfigError(f"{p}:{i}: a line needs 'execution' (one model call) or 'turns' (one trajectory)")
    for eid, turns in calls.items():
        turns.sort(key=lambda t: float(t.get("start", 0.0)))
        out.append(_turns_to_execution(groups[eid], turns, None, f"{p} execution {eid}"))
    if not out:
        raise ConfigError(f"{p}: trace holds no executions")
    return out


def _by_step(execs: list[TraceExecution], n: int) -> list[list[TraceExecution]] | None:
    """A run's trace cut into its RL steps (in step order), when every execution names its
    step and every step holds `n` of them; else None."""
    if any(e.step is None for e in execs):
        return None
    steps: dict[int, list[TraceExecution]] = {}
    for e in execs:
        steps.setdefault(int(e.step), []).append(e)
    if len(steps) < 2 or any(len(v) != n for v in steps.values()):
        return None
    return [steps[k] for k in sorted(steps)]


def trace_grouping(execs: list[TraceExecution]) -> tuple[int, int]:
    """(groups, group_size) of a trace replayed as is: its groups when they are
    all the same size, else every execution its own group."""
    sizes: dict[str, int] = {}
    for e in execs:
        sizes[e.group] = sizes.get(e.group, 0) + 1
    if len(set(sizes.values())) == 1:
        return len(sizes), next(iter(sizes.values()))
    return len(execs), 1


# ---- one step's executions --------------------------------------------------


@dataclass
class StepBatch:
    """The executions of one step as flat per-turn arrays.

    Turn k of execution i is index ``offsets[i] + k``. ``prompt`` (new prompt
    tokens, turn 0 including the initial prompt), ``completion`` (tokens) and
    ``tool_s`` (seconds) are per turn; ``tokens`` (trajectory tokens to train)
    per execution.
    """

    n_turns: np.ndarray
    offsets: np.ndarray
    prompt: np.ndarray
    completion: np.ndarray
    tool_s: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        per_turn = self.prompt + self.completion
        return np.add.reduceat(per_turn, self.offsets[:-1]).round().astype(np.int64)

    @property
    def tool_total_s(self) -> np.ndarray:
        """Per-execution tool/environment seconds (no model time)."""
        return np.add.reduceat(self.tool_s, self.offsets[:-1])


def _flat(n_turns: np.ndarray, prompt: np.ndarray, completion: np.ndarray, tool: np.ndarray) -> StepBatch:
    offsets = np.zeros(len(n_turns) + 1, dtype=np.int64)
    np.cumsum(n_turns, out=offsets[1:])
    return StepBatch(n_turns.astype(np.int64), offsets, prompt, completion, tool)


class Workload:
    """Draws each step's executions deterministically from (seed, step)."""

    def __init__(self, cfg: WorkloadConfig, seed: int = 0, base_dir: Path | None = None):
        self.cfg, self.seed = cfg, seed
        self.trace: list[TraceExecution] | None = None
        self.by_step: list[list[TraceExecution]] | None = None
        if cfg.trace:
            tp = Path(cfg.trace)
            if not tp.is_absolute() and base_dir is not None:
                tp = base_dir / tp
            self.trace = load_trace(tp)
            self.by_step = _by_step(self.trace, self.executions_per_step)
            if cfg.trace_replay and len(self.trace) != self.executions_per_step and self.by_step is None:
                raise ConfigError(
                    f"trace replay: {len(self.trace)} executions, but groups_per_step x "
                    f"group_size = {self.executions_per_step} (or that many per recorded step)"
                )

    @property
    def executions_per_step(self) -> int:
        return self.cfg.groups_per_step * self.cfg.group_size

    def sample_step(self, step: int) -> StepBatch:
        rng = np.random.default_rng([self.seed, step])
        if self.trace is not None:
            return self._from_trace(rng, step)
        c, n = self.cfg, self.executions_per_step
        turns = np.maximum(1, np.round(c.turns.sample(rng, n))).astype(np.int64)
        total = int(turns.sum())
        comp = np.round(c.completion_tokens.sample(rng, total))
        prompt = np.round(c.prompt_tokens.sample(rng, total))
        tool = c.tool_latency_s.sample(rng, total)
        b = _flat(turns, prompt, comp, tool)
        b.prompt[b.offsets[:-1]] += np.round(c.initial_prompt_tokens.sample(rng, n))
        if c.timeout_s is not None:
            b = self._cap(b, c.timeout_s, c.timeout_ref_tps)
        return b

    @staticmethod
    def _cap(b: StepBatch, timeout_s: float, ref_tps: float) -> StepBatch:
        """Keep each execution's turns that end within the nominal timeout
        (at least one)."""
        t = b.completion / ref_tps + b.tool_s
        cs = np.cumsum(t)
        start = np.repeat(np.concatenate([[0.0], cs[b.offsets[1:-1] - 1]]), b.n_turns)
        keep = (cs - start) <= timeout_s
        keep[b.offsets[:-1]] = True
        turns = np.add.reduceat(keep.astype(np.int64), b.offsets[:-1])
        return _flat(turns, b.prompt[keep], b.completion[keep], b.tool_s[keep])

    def _from_trace(self, rng: np.random.Generator, step: int) -> StepBatch:
        assert self.trace is not None
        if self.cfg.trace_replay and self.by_step is not None:  # step u replays the run's step u (cycling)
            chosen = self.by_step[step % len(self.by_step)]
        elif self.cfg.trace_replay:
            chosen = self.trace
        else:
            chosen = [self.trace[i] for i in rng.integers(0, len(self.trace), self.executions_per_step)]
        turns = np.array([len(e.prompt) for e in chosen], dtype=np.int64)
        return _flat(
            turns,
            np.concatenate([e.prompt for e in chosen]).astype(np.float64),
            np.concatenate([e.completion for e in chosen]).astype(np.float64),
            np.concatenate([e.tool_s for e in chosen]).astype(np.float64),
        )


def load_sim_config(path: str | Path, overrides: list[str] | None = None) -> tuple[SimConfig, Path]:
    """A `SimConfig` from a TOML file or a bare JSONL trace (replayed as is,
    default cluster). Returns it with the directory relative paths resolve
    against.

    Raises:
        ConfigError: missing or malformed file.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"workload file not found: {p}")
    if p.suffix == ".jsonl":
        groups, size = trace_grouping(load_trace(p))
        base = {
            "workload": {
                "name": p.stem,
                "trace": str(p.resolve()),
                "trace_replay": True,
                "groups_per_step": groups,
                "group_size": size,
            }
        }
        return load_config(SimConfig, None, overrides, base=base), p.parent
    if p.suffix != ".toml":
        raise ConfigError(f"workload must be a .toml file or a .jsonl trace, got {p.name}")
    return load_config(SimConfig, p, overrides), p.parent


def nominal_summary(b: StepBatch) -> dict[str, float]:
    """Quick facts on one drawn step: tokens and turn counts."""
    tok = b.tokens
    return {
        "executions": float(len(b.n_turns)),
        "turns_mean": float(b.n_turns.mean()),
        "tokens_mean": float(tok.mean()),
        "tokens_p50": float(np.median(tok)),
        "tokens_max": float(tok.max()),
        "tool_s_mean": float(b.tool_total_s.mean()),
        "log10_total_tokens": math.log10(max(1.0, float(tok.sum()))),
    }
