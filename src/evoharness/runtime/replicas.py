"""Data-parallel train replicas: the train cells of a step all-reduce their gradients (torch.distributed).

Two ways the runtime turns micro-batches on several train cells into one
optimizer step, each where its assumptions hold:

- **All-reduce (colocate, async)**: the set of train cells is fixed for the
  whole run (colocate: every cell; async: its fixed train split), so they
  form one `torch.distributed` process group (gloo on CPU, NCCL on GPUs) at
  their first step. Each cell accumulates the gradients of the micro-batches
  it claimed in memory; at the weight sync every member all-reduces (sums) its
  accumulator, clips and applies the same AdamW step to its own replica of the
  optimizer state: standard data parallelism (DDP/FSDP-style), no gradient
  files and no weight reload on the train cells. The core (cell 0, rank 0)
  also writes the new weights and its optimizer state, for the rollout cells
  (async) and for job checkpoints.
- **Core + shared micro-batch queue (elastic, elastic-async)**: cells join
  and leave training within a step (QwenGyre's dynamic membership), which a
  collective cannot follow: every member of a process group must take part in
  every all-reduce, and a group is rebuilt only by all of its members. So a
  satellite writes each micro-batch's gradient to the shared work directory
  and the core, which holds the only optimizer state, sums exactly the
  micro-batches of the step (`runtime.cell_worker`, job ``step``); a joining
  satellite starts from the consistent weights snapshot of the step's
  version. That stays as it is.

`AllReduceAlfworldBackend` is `runtime.alfworld_backend.AlfworldBackend` with
the first mechanism; `ReplicaGroup` is what a cell process holds
(`runtime.cell_worker`, jobs ``train`` and ``dp_step``).

A lost member fails the job at once, with a message naming the resume (the job
checkpoint of the last weight sync; the resumed backend forms a fresh group),
rather than re-forming the group: the gradients of the micro-batches it already
finished this step lived only in its memory (the scheduler knows only the one
it was running, and re-claims that), every survivor would have to tear down
and re-rendezvous its process group together with the replacement (until then
a collective with the dead rank fails under gloo, and blocks until its timeout
under NCCL), and the replacement would need the step's optimizer state. A lost
cell outside the group (an async rollout cell) is handled by the scheduler as
everywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evoharness.runtime.alfworld_backend import AlfworldBackend
from evoharness.runtime.events import SyncWeights


class ReplicaGroup:
    """One train cell's membership: its rank in the group and its gradient accumulator.

    Args:
        rank / world: this cell's rank and the group size.
        init_method: the rendezvous (``file://`` path unique to the run's cells).
        backend: ``gloo`` (CPU) or ``nccl`` (CUDA).
    """

    def __init__(self, rank: int, world: int, init_method: str, backend: str = "gloo"):
        self.rank, self.world, self.init_method, self.backend = rank, world, init_method, backend
        self.acc: dict[str, Any] = {}
        self.micro_batches = 0
        self._ready = False

    def accumulate(self, grads: dict[str, Any]) -> None:
        """Add one micro-batch's gradients (parameter name -> tensor) to the accumulator."""
        for n, g in grads.items():
            self.acc[n] = self.acc[n] + g if n in self.acc else g
        self.micro_batches += 1

    def step(self, model: Any, optimizer: Any, scale: float, grad_clip: float) -> float:
        """All-reduce (sum) the accumulated gradients over the group, times `scale`, clip to
        `grad_clip`, one optimizer step; returns the pre-clip global grad norm. Every member
        must call it for the same step (a collective)."""
        import torch
        import torch.distributed as dist

        if not self._ready:
            dist.init_process_group(self.backend, init_method=self.init_method, rank=self.rank,
                                    world_size=self.world)
            self._ready = True
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # one bucket (the model is small; DDP buckets by size), plus one flag per parameter: a
        # parameter no replica has a gradient for keeps grad None (AdamW then leaves it alone)
        flat = torch.cat([(self.acc[n] if n in self.acc else torch.zeros_like(p)).reshape(-1) for n, p in params]
                         + [torch.tensor([float(n in self.acc) for n, _ in params])])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        has = flat[-len(params):]
        i = 0
        for k, (_, p) in enumerate(params):
            p.grad = flat[i:i + p.numel()].view_as(p) * scale if has[k] > 0 else None
            i += p.numel()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        optimizer.step()
        model.zero_grad(set_to_none=True)
        self.acc, self.micro_batches = {}, 0
        return norm

    def close(self) -> None:
        import torch.distributed as dist

        if self._ready and dist.is_initialized():
            dist.destroy_process_group()


class AllReduceAlfworldBackend(AlfworldBackend):
    """`AlfworldBackend` whose fixed train cells all-reduce gradients (module docstring).

    Args (beyond `AlfworldBackend`'s): members: the cells of the group (they must include
    the core, cell 0, and be the only cells that ever train).
    """

    def __init__(self, *args: Any, members: list[int], **kwargs: Any):
        if 0 not in members:
            raise ValueError("the all-reduce group must include the core (cell 0)")
        self.members = sorted(members)
        self._dp_left: dict[int, list[dict]] = {}
        super().__init__(*args, **kwargs)

    def _cell_args(self, cell: int) -> tuple[str, str, float, dict[str, Any]]:
        model_dir, work_dir, lr, options = super()._cell_args(cell)
        store = Path(work_dir) / "dist" / f"rendezvous_{os.getpid()}_{id(self)}"   # fresh per backend instance
        store.parent.mkdir(parents=True, exist_ok=True)
        dp = {"ranks": {c: r for r, c in enumerate(self.members)}, "init_method": f"file://{store}"}
        return model_dir, work_dir, lr, {**options, "dp": dp}

    def _micro_batch(self, c: Any) -> None:
        if c.cell not in self.members:
            raise RuntimeError(f"cell {c.cell} is outside the all-reduce group {self.members}")
        super()._micro_batch(c)

    def _sync(self, c: SyncWeights) -> None:
        v = c.version - 1
        m = sum(1 for e in self._trained.get(v, ()) if self._samples.get(e))
        self.mb_tokens.pop(v, None)
        self._dp_left[c.version] = []
        for cell in self.members:
            self._send(cell, "dp_step", (v, self.N / m if m else 1.0), key=(c.version, tuple(c.cells)))

    def _on_job(self, cell: int, pid: int, kind: str, token: int, result: Any) -> None:
        if kind != "dp_step":
            return super()._on_job(cell, pid, kind, token, result)
        self.pids_seen[cell].add(pid)
        version, cells = self._jobs.pop(token)[2]
        done = self._dp_left[version]
        done.append(result)
        if len(done) < len(self.members):
            return
        del self._dp_left[version]
        core = next(r for r in done if r["rank"] == 0)
        self.step_stats.append({**core, "micro_batches": sum(r["micro_batches"] for r in done)})
        self.newest = version
        self._load_on([x for x in cells if x not in self.members], version)     # rollout cells: the core's file

    def _lose(self, c: int) -> None:
        """A member of the group died: fail the job (module docstring); another cell: as usual.

        Raises:
            RuntimeError: `c` is a member (the job resumes from its last checkpoint).
        """
        if c in self.members:
            raise RuntimeError(f"cell {c} of the all-reduce group {self.members} failed: its accumulated "
                               "gradients are lost and the group cannot continue; resume the job from its last "
                               "checkpoint (a fresh group forms)")
        super()._lose(c)

    def _job_lost(self, token: int, job: tuple) -> None:
        if job[0] == "dp_step":
            raise RuntimeError("a train replica failed during the all-reduce step: resume from the last checkpoint")
        super()._job_lost(token, job)
