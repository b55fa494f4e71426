"""Data-parallel replicas: a `train.trainer.Trainer` whose gradient is summed over a group.

Each member of a fixed group of train ranks holds a full replica of the weights and the AdamW
state. At every update each rank backpropagates its share of the update's rows (token weights
set over the whole update), then `AllReduce.reduce` sums the gradients over the group (one
``torch.distributed`` all-reduce: gloo on CPU, NCCL on GPUs), so every rank clips and applies the
same update to the same weights: DDP-style data parallelism, no gradient files, no weight
reloads on the members.

A lost member fails the job (its gradient lived only in its memory; a collective with a dead
rank fails under gloo and blocks until its timeout under NCCL): the job resumes from its last
checkpoint, where a fresh group forms.

The other kind of group is FSDP2 ranks that hold one sharded model (`train.sharded.ShardGroup`):
both are a `DataParallelGroup`, what a `Trainer` needs of its ``reducer``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch


class DataParallelGroup(Protocol):
    """What `train.trainer.Trainer` needs of a data-parallel group (its ``reducer``).

    Attributes:
        rank: this member (rank 0 alone runs the SFT anchor in a replica group).
        sharded: False: full replicas, forwards are local (`AllReduce`); True: FSDP ranks, every
            forward and backward is a collective (`train.sharded.ShardGroup`, which adds
            ``lockstep`` and ``averaged``).
    """

    rank: int
    sharded: bool

    def reduce(self, model: Any) -> None:
        """Make every rank's ``.grad`` the sum of the ranks' gradients (a collective)."""


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` that returns a float: the global L2 norm of the gradients
    before clipping, also over sharded (DTensor) gradients, whose norm torch reduces over the
    ranks (a collective then: every rank calls it with the same parameters)."""
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor: the partial norms all-reduced
        norm = norm.full_tensor()
    return float(norm)


class AllReduce:
    """One rank's membership of a data-parallel group (joined at its first `reduce`).

    Args:
        rank / world: this rank and the group size.
        init_method: the rendezvous (e.g. a ``file://`` path unique to the group).
        backend: ``gloo`` or ``nccl``; None: NCCL for CUDA models, gloo otherwise.
    """

    sharded = False  # full replicas: forwards are local, gradients are all-reduced in `reduce`

    def __init__(self, rank: int, world: int, init_method: str, backend: str | None = None):
        self.rank, self.world, self.init_method, self.backend = rank, world, init_method, backend
        self._ready = False
        self._group: Any = None  # None: the default group

    def reduce(self, model: Any) -> None:
        """Sum every trainable parameter's ``.grad`` over the group, in place. A parameter no
        rank has a gradient for keeps ``grad = None`` (AdamW then leaves it alone). A collective:
        every member calls it for the same update."""
        import torch.distributed as dist

        params = [p for p in model.parameters() if p.requires_grad]
        if not self._ready:
            backend = self.backend or ("nccl" if params and params[0].is_cuda else "gloo")
            if dist.is_initialized():
                # the process has a default group already: an in-process vLLM engine's world of 1
                # (`recipes.vllm_cell`); this group forms beside it, on a store of its own
                store, _, _ = next(dist.rendezvous(self.init_method, self.rank, self.world))
                make = dist.ProcessGroupNCCL if backend == "nccl" else dist.ProcessGroupGloo
                self._group = make(dist.PrefixStore("allreduce", store), self.rank, self.world)
            else:
                dist.init_process_group(backend, init_method=self.init_method, rank=self.rank, world_size=self.world)
            self._ready = True
        # one bucket (DDP buckets by size) plus one flag per parameter
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
            + [torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)]
        )
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self._group)
        has, i = flat[-len(params) :], 0
        for k, p in enumerate(params):
            p.grad = flat[i : i + p.numel()].view_as(p).clone() if has[k] > 0 else None
            i += p.numel()

    def close(self) -> None:
        import torch.distributed as dist

        if self._ready and self._group is None and dist.is_initialized():
            dist.destroy_process_group()
        self._ready, self._group = False, None
