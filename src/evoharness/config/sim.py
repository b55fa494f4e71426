"""The simulator's workloads and clusters (`runtime.sim`; the RL runtime's batch shape)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from evoharness.config.base import Strict


class Dist(Strict):
    """A non-negative random quantity; a bare number in TOML means fixed.

    kind ``fixed``: ``value``; ``lognormal``: ``median`` and ``sigma`` (std of
    the log); ``pareto``: ``scale`` (minimum x_m) and ``shape`` (tail index α,
    smaller = heavier); ``uniform``: ``low``..``high``. Samples are clipped to
    [``min``, ``max``].
    """

    kind: Literal["fixed", "lognormal", "pareto", "uniform"] = "fixed"
    value: float = 0.0
    median: float = 1.0
    sigma: float = Field(0.0, ge=0)
    scale: float = Field(1.0, gt=0)
    shape: float = Field(2.0, gt=0)
    low: float = 0.0
    high: float = 1.0
    min: float = Field(0.0, ge=0)
    max: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, data: Any) -> Any:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"kind": "fixed", "value": float(data)}
        return data

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            x = np.full(n, self.value, dtype=np.float64)
        elif self.kind == "lognormal":
            x = self.median * np.exp(self.sigma * rng.standard_normal(n))
        elif self.kind == "pareto":
            x = self.scale * (1.0 + rng.pareto(self.shape, n))
        else:
            x = rng.uniform(self.low, self.high, n)
        return np.clip(x, self.min, self.max if self.max is not None else np.inf)


class WorkloadConfig(Strict):
    """One RL step's work. Units: tokens, seconds. See the module docstring."""

    name: str = "workload"
    groups_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1)
    initial_prompt_tokens: Dist = Dist(value=0.0)
    turns: Dist = Dist(value=10.0)
    completion_tokens: Dist = Dist(value=500.0)
    prompt_tokens: Dist = Dist(value=500.0)
    tool_latency_s: Dist = Dist(value=5.0)
    timeout_s: float | None = Field(None, gt=0)
    timeout_ref_tps: float = Field(30.0, gt=0)
    trace: str | None = None
    trace_replay: bool = False


class ClusterConfig(Strict):
    """K cells. Units: tokens/s, seconds; capacity in concurrent executions."""

    cells: int = Field(8, ge=1)
    accelerators_per_cell: int = Field(8, ge=1)
    capacity: int = Field(16, ge=1)
    decode_replicas: int = Field(1, ge=1)
    gen_tps_single: float = Field(40.0, gt=0)
    gen_concurrency_exponent: float = Field(0.85, gt=0, le=1)
    gen_per_seq_max: float | None = Field(None, gt=0)
    prefill_speedup: float = Field(100.0, gt=0)
    train_tps: float = Field(50_000.0, gt=0)
    train_seq_tps: float | None = Field(None, gt=0)
    micro_batch_overhead_s: float = Field(0.0, ge=0)  # fixed cost per micro-batch (launch, gradient hand-off)
    weight_sync_s: float = Field(20.0, ge=0)
    switch_to_train_s: float = Field(8.52, ge=0)
    switch_to_rollout_s: float = Field(3.46, ge=0)
    sync_flushes_kv: bool = True  # a weight update makes cached contexts re-prefill

    @model_validator(mode="after")
    def _replicas_divide_capacity(self) -> ClusterConfig:
        if self.capacity % self.decode_replicas:
            raise ValueError(f"capacity {self.capacity} is not a multiple of decode_replicas {self.decode_replicas}")
        return self

    def per_seq_tps(self, n: int) -> float:
        """Decode tokens/s each of n concurrent sequences gets on one inference
        replica (the whole cell unless ``decode_replicas`` > 1, each replica
        then hosting capacity / decode_replicas sequences): tps(n) / n, capped
        at ``gen_per_seq_max`` when set."""
        if n <= 0:
            return 0.0
        r = self.gen_tps_single * n ** (self.gen_concurrency_exponent - 1.0)
        return min(r, self.gen_per_seq_max) if self.gen_per_seq_max is not None else r

    @property
    def full_decode_tps(self) -> float:
        """Decode tokens/s of a cell hosting `capacity` sequences, spread evenly over its replicas."""
        per = self.capacity // self.decode_replicas
        return self.decode_replicas * per * self.per_seq_tps(per)

    @property
    def seq_train_tps(self) -> float:
        """Trained tokens/s of one execution alone on a cell: ``train_seq_tps``
        when set (a cell larger than one training replica cannot spread one
        trajectory over all its accelerators), else ``train_tps``."""
        return min(self.train_tps, self.train_seq_tps) if self.train_seq_tps is not None else self.train_tps

    @property
    def train_replicas(self) -> int:
        """Executions a train cell works on at once (its data-parallel
        replicas, each training one trajectory): train_tps / seq_train_tps."""
        return max(1, round(self.train_tps / self.seq_train_tps))

    def micro_batch_s(self, tokens: list[float] | tuple[float, ...]) -> float:
        """Seconds one train cell takes for a micro-batch of executions with
        these trajectory token counts: the total at ``train_tps``, but never
        less than its longest trajectory at ``seq_train_tps`` (the replicas
        share the executions; one trajectory is not split across replicas),
        plus ``micro_batch_overhead_s``."""
        return self.micro_batch_overhead_s + max(
            sum(tokens) / self.train_tps, max(tokens, default=0.0) / self.seq_train_tps
        )

    def regrouped(self, factor: float) -> ClusterConfig:
        """The same accelerators in cells `factor` times larger (factor 2: half
        as many cells, each with twice the capacity and throughput; factor 1/2:
        twice as many, half as large). A larger cell is `factor` replicas of
        the original one: inference replicas behind one router, each session
        pinned to one replica (``decode_replicas``), and training replicas in
        lockstep on one shared micro-batch queue (``train_seq_tps``): one
        sequence never decodes, and one trajectory never trains, faster than
        on the original cell. A smaller cell is a smaller replica (its
        per-sequence speeds drop with its throughput where they exceed it)."""
        cells = self.cells / factor
        if factor <= 0 or cells != int(cells) or cells < 1:
            raise ValueError(f"cannot regroup {self.cells} cells by {factor}")
        acc, cap = self.accelerators_per_cell * factor, self.capacity * factor
        if acc != round(acc) or cap != round(cap) or acc < 1 or cap < 1:
            raise ValueError(
                f"cannot regroup cells of {self.accelerators_per_cell} accelerators and capacity "
                f"{self.capacity} by {factor}"
            )
        tps = self.train_tps * factor
        reps = self.decode_replicas * factor
        if reps >= 1 and reps == int(reps):  # the same replicas, more (or fewer) of them per cell
            dec = dict(decode_replicas=int(reps))
        else:  # a smaller replica: throughput scales, one sequence no faster
            g = self.gen_tps_single * factor ** (1 - self.gen_concurrency_exponent)
            dec = dict(decode_replicas=1, gen_tps_single=g, gen_per_seq_max=min(self.per_seq_tps(1), g))
        return self.model_copy(
            update=dict(
                cells=int(cells),
                accelerators_per_cell=round(acc),
                capacity=round(cap),
                train_tps=tps,
                train_seq_tps=min(self.seq_train_tps, tps),
                **dec,
            )
        )


class ScheduleConfig(Strict):
    """Schedule knobs: async's fixed split, staleness bound η and streaming
    trainer (False: AReaL-like, a step starts when its batch is in) and batch
    order (``dispatch``: batch j = groups jG..(j+1)G-1; ``completion``: finished
    groups, oldest version first, within η), elastic's
    re-issue switch (False = abort in-flight turns, an ablation), elastic's
    ready-work gate (True: a cell moves to train only when trainable
    micro-batches are waiting for it, ``elastic_gate_ready_per_cell`` per
    train cell; not in the paper, off by default; the ``elastic-gated`` policy
    turns it on), elastic-async's ready-work gate
    (``elastic_async_ready_per_cell``), and when a finished execution may be trained (``group``:
    GRPO waits for its whole group; ``execution``: at once)."""

    async_train_cells: int | None = Field(None, ge=1)
    staleness: int = Field(1, ge=0)
    async_stream: bool = False
    async_batch_order: Literal["dispatch", "completion"] = "dispatch"
    elastic_reissue: bool = True
    elastic_gate_on_ready_work: bool = False
    elastic_gate_ready_per_cell: float = Field(1.0, gt=0)
    elastic_async_ready_per_cell: float = Field(1.0, gt=0)
    train_unit: Literal["group", "execution"] = "group"
    balance_micro_batches: bool = False  # cells of several replicas: longest waiting executions together


class SimConfig(Strict):
    workload: WorkloadConfig = WorkloadConfig()
    cluster: ClusterConfig = ClusterConfig()
    policy: ScheduleConfig = ScheduleConfig()
    steps: int = Field(3, ge=1)
    seed: int = 0
