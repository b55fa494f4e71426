"""Test-only workloads and fault injection for the runtime (tests/runtime/).

- `TokenAgents`: synthetic multi-turn agents with real tokens for cells with a real (micro)
  model (`recipes.engine_cell.EngineCell`): a seeded random prompt, then per turn one model call
  (``max_new_tokens``) followed by ``tool_tokens`` seeded random "tool output" ids; the turn count
  is the simulator workload's draw capped at ``max_turns``, the tool delays the draw's, scaled.
  Reward: the share of even token ids among the completion tokens (a signal the policy can learn);
  advantages group-relative (GRPO, `train.step.score_rewards`); rows and updates as every
  workload makes them (`train.step`: streamed micro-batches weighted 1/(N·N_j), or the whole
  batch's updates at the sync).
- `token_backend`: a `CellBackend` of `EngineCell` model cells playing `TokenAgents`.
- `KillOnCommand`: wraps any backend; kills a cell's worker right after a chosen command reaches it.
- `DiesMidReply`: a timed cell worker that dies half-way through writing a reply on request.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from evoharness.config.rl import GRPOConfig
from evoharness.config.sim import SimConfig
from evoharness.runtime.cell import ModelCell, TimedCell, WeightStore
from evoharness.runtime.synthetic import WorkloadDraw


class TokenAgents:
    """Synthetic token agents (module docstring; `runtime.cell_backend.AgentWorkload`).

    Args:
        sim: the batch shape, the workload draw (turns, tool delays) and the seed.
        tokenizer_dir: the model's tokenizer (prompts and tool outputs avoid its special ids).
        grpo: the loss settings (streamed when one update per step).
        keep_weights: ``(store, directory)``: at each step copy the published weights of the new
            version into `directory` (a `WeightStore` keeps only the newest two).
    """

    def __init__(
        self,
        sim: SimConfig,
        tokenizer_dir: str | Path,
        grpo: GRPOConfig,
        max_new_tokens: int = 6,
        prompt_tokens: int = 12,
        tool_tokens: int = 3,
        max_turns: int = 3,
        time_scale: float = 1e-3,
        keep_weights: tuple[WeightStore, Path] | None = None,
    ):
        from evoharness.models.init import load_tokenizer

        tok = load_tokenizer(tokenizer_dir)
        special = set(tok.all_special_ids)
        self.ids = [i for i in range(len(tok)) if i not in special]
        self.seed, self.steps, self.grpo = sim.seed, sim.steps, grpo
        self.draw = WorkloadDraw(sim)
        self.N, self.G = self.draw.N, sim.workload.group_size
        self.max_new, self.prompt_len, self.tool_len, self.max_turns = (
            max_new_tokens,
            prompt_tokens,
            tool_tokens,
            max_turns,
        )
        self.scale, self.keep = time_scale, keep_weights
        self.x_ctx: dict[int, list[int]] = {}
        # execution -> per answered call (prompt ids, completion ids, behaviour log-probs, weights version)
        self.x_rec: dict[int, list[tuple[list[int], list[int], list[float], int]]] = {}
        self.x_t: dict[int, float] = {}
        self.records: list[dict[str, Any]] = []  # what `step_done` returned, in order

    # ---- executions --------------------------------------------------------------------------
    def _random_ids(self, n: int, *key: int) -> list[int]:
        idx = np.random.default_rng([self.seed, *key]).integers(0, len(self.ids), n)
        return [self.ids[i] for i in idx]

    def n_turns(self, e: int) -> int:
        return min(self.draw.turns(e)[2], self.max_turns)

    def start(self, e: int) -> None:
        self.x_ctx[e], self.x_rec[e], self.x_t[e] = self._random_ids(self.prompt_len, e), [], time.monotonic()

    def request(self, e: int) -> tuple | None:
        if self.finished(e):
            return None
        k = len(self.x_rec[e])
        return (
            list(self.x_ctx[e]),
            self.max_new,
            (self.seed * 1_000_003 + e * 101 + k) & 0x7FFFFFFF,
            self.grpo.temperature,
        )

    def reply(self, e: int, result: dict[str, Any]) -> None:
        ids, logprobs, version = result["result"]
        k = len(self.x_rec[e])
        self.x_rec[e].append((list(self.x_ctx[e]), list(ids), list(logprobs), int(version)))
        self.x_ctx[e] = self.x_ctx[e] + list(ids) + self._random_ids(self.tool_len, e, k, 1)

    def tool_delay(self, e: int) -> float:
        b, off, _ = self.draw.turns(e)
        return float(b.tool_s[off + len(self.x_rec[e]) - 1]) * self.scale

    def finished(self, e: int) -> bool:
        return e in self.x_rec and len(self.x_rec[e]) >= self.n_turns(e)

    def woken(self) -> list[int]:
        return []

    def tokens(self, e: int) -> int:
        return len(self.x_ctx.get(e, ()))

    def calls(self, e: int) -> list[dict[str, Any]]:
        return [
            {"prompt_tokens": len(p), "completion_tokens": len(c), "policy_version": v}
            for p, c, _, v in self.x_rec.get(e, [])
        ]

    def trace_key(self, e: int) -> tuple[str, str, float]:
        return f"tokens-g{(e % self.N) // self.G}", f"e{e}", round(time.monotonic() - self.x_t.get(e, 0.0), 4)

    def turn_versions(self) -> dict[int, list[int]]:
        """Per execution, the weights version of each model call (its behaviour versions)."""
        return {e: [r[3] for r in recs] for e, recs in self.x_rec.items()}

    # ---- training ------------------------------------------------------------------------------
    def reward(self, e: int) -> float:
        comp = [t for r in self.x_rec[e] for t in r[1]]
        return sum(t % 2 == 0 for t in comp) / len(comp) if comp else 0.0

    def _rows(self, e: int) -> list:
        from evoharness.train.grpo import TurnSample
        from evoharness.train.step import score_rewards

        g = e // self.G
        members = range(g * self.G, (g + 1) * self.G)
        if missing := [m for m in members if not self.finished(m)]:
            raise RuntimeError(f"execution {e} trained before its group's {missing} finished (GRPO needs the group)")
        adv = score_rewards([self.reward(m) for m in members], self.grpo).advantages[e - g * self.G][0]
        return [TurnSample(list(p), list(c), list(lp), adv, f"e{e}", group=g) for p, c, lp, _ in self.x_rec[e] if c]

    def micro_batch(self, executions: tuple[int, ...], version: int) -> list | None:
        from evoharness.train.step import streamed_rows, streams

        if not streams(self.grpo):
            return None
        return streamed_rows([r for e in executions for r in self._rows(e)], self.N)

    def sync(self, version: int, executions: list[int], ranks: int) -> list[dict[str, Any]]:
        from evoharness.train.step import lr_at, plan_updates, stream_scale, streams

        step = version - 1
        plan = {"lr": lr_at(self.grpo, step, self.steps), "step": step}
        if streams(self.grpo):
            m = sum(1 for e in executions if self._rows(e))
            return [dict(plan, updates=[], scale=stream_scale(self.N, m)) for _ in range(ranks)]
        updates = plan_updates([r for e in sorted(executions) for r in self._rows(e)], self.grpo)
        return [dict(plan, updates=[u[r::ranks] for u in updates], scale=1.0) for r in range(ranks)]

    def step_done(
        self, version: int, executions: list[int], stats: dict[str, Any], timing: dict[str, float]
    ) -> dict[str, Any]:
        """The step's record: `train.step.merged_update_metrics` of `stats`, the micro-batches that
        reached the update, the completion tokens of its executions (what the update must have
        trained, each once) and the per-rank update metrics."""
        from evoharness.train.step import merged_update_metrics

        if self.keep is not None and self.keep[0].path(version).is_file():
            self.keep[1].mkdir(parents=True, exist_ok=True)
            shutil.copy(self.keep[0].path(version), self.keep[1] / f"v{version}.safetensors")
        rec = {
            "step": version,
            "executions": len(executions),
            "micro_batches": len(stats["micro"]),
            "completion_tokens": sum(len(c) for e in executions for _, c, _, _ in self.x_rec[e]),
            "reward": sum(self.reward(e) for e in executions) / max(1, len(executions)),
            "ranks": stats["ranks"],
            **merged_update_metrics(**stats),
        }
        self.records.append(rec)
        return rec

    def state(self) -> dict[str, Any]:
        return {"x_ctx": self.x_ctx, "x_rec": self.x_rec}

    def restore(self, st: dict[str, Any]) -> None:
        self.x_ctx, self.x_rec = dict(st["x_ctx"]), dict(st["x_rec"])
        self.x_t = {e: time.monotonic() for e in self.x_rec}

    def close(self) -> None:
        pass


def token_grpo(lr: float = 1e-2, **over: Any) -> GRPOConfig:
    """The synthetic agents' loss: plain GRPO (no KL), clip 1, sampling at temperature 1."""
    return GRPOConfig(**{"kl_beta": 0.0, "lr": lr, "grad_clip": 1.0, "temperature": 1.0, "off_policy": "ppo", **over})


def token_backend(
    sim: SimConfig,
    roles: list,
    model_dir: str | Path,
    work_dir: str | Path,
    backend: str = "local",
    grpo: GRPOConfig | None = None,
    training: Any = None,
    via_gateway: bool = False,
    state: dict[str, Any] | None = None,
    version: int = 0,
    keep_weights: Path | None = None,
    time_scale: float = 1e-3,
    ready_timeout_s: float = 300.0,
    **ray: Any,
) -> Any:
    """A `CellBackend` of bare-engine model cells (one torch thread each) playing `TokenAgents`:
    weights versions in ``work_dir/weights``, the core alone training by default
    (`ModelTraining("single")`)."""
    from evoharness.recipes.engine_cell import EngineCellFactory
    from evoharness.runtime.cell_backend import CellBackend, ModelTraining
    from evoharness.runtime.transport import make_transport

    grpo = grpo or token_grpo()
    weights = WeightStore(Path(work_dir) / "weights")
    make_worker = functools.partial(
        ModelCell, factory=EngineCellFactory(str(model_dir), grpo, threads=1), weights=weights, version=version
    )
    agents = TokenAgents(
        sim,
        model_dir,
        grpo,
        time_scale=time_scale,
        keep_weights=(weights, Path(keep_weights)) if keep_weights else None,
    )
    gateway = None
    if via_gateway:
        from evoharness.runtime.gateway_cells import CellGateway

        gateway = CellGateway(sim.cluster.cells)
    return CellBackend(
        sim,
        roles,
        make_transport(backend, **ray),
        make_worker,
        agents,
        training or ModelTraining("single"),
        work_dir,
        gateway=gateway,
        state=state,
        ready_timeout_s=ready_timeout_s,
    )


class KillOnCommand:
    """Wraps a `CellBackend`: kills a cell's worker (`Transport.kill`: SIGKILL of a cell process,
    ``ray.kill`` of an actor) right after the first command `kill_on(c)` picks reaches it.
    Everything else is the backend's. ``killed``: [that cell]."""

    def __init__(self, backend: Any, kill_on: Callable[[Any], bool]):
        self.backend, self.kill_on, self.killed = backend, kill_on, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def apply(self, c: Any) -> None:
        self.backend.apply(c)
        if not self.killed and self.kill_on(c):
            self.backend.transport.kill(c.cell)
            self.killed.append(c.cell)


def kill_pid(pid: int) -> None:
    """SIGKILL a cell process from another thread (no join: the driver thread reaps it)."""
    os.kill(pid, signal.SIGKILL)


DIE = "die mid-reply"


class DiesMidReply(TimedCell):
    """A timed cell that, given a job whose payload is `DIE`, answers it with a reply larger than
    its pipe holds and is SIGKILLed half a second later, while nobody reads the pipe yet: a cell
    killed (SIGKILL, the OOM killer) half-way through a reply."""

    def submit(self, kind: str, token: int, payload: Any, seconds: float = 0.0) -> None:
        if payload == DIE:

            def die() -> None:
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=die, daemon=True).start()
            payload = b"x" * (1 << 20)
        super().submit(kind, token, payload, seconds)
