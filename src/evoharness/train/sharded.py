"""FSDP2 trainer ranks: one model sharded over a fixed group of processes.

`shard_model` applies ``torch.distributed.fsdp.fully_shard`` (FSDP2, ZeRO-3) to a Hugging Face
decoder-only causal LM (Qwen3/Llama layout: ``model.model.{embed_tokens, layers, norm}`` and
``lm_head``) over a `ShardGroup` (gloo on CPU, NCCL on CUDA): every parameter, its gradient and
its AdamW moments live as a dim-0 shard (`torch.distributed.tensor.DTensor`) on each rank, and
FSDP all-gathers a unit's parameters before its forward/backward and reduce-scatters its gradient
after. Units: one per decoder layer, and one for the embedding, the final norm and the LM head
together, so tied input/output embeddings (one parameter) stay one parameter in one unit. The
root (the causal LM, no parameters of its own) only ties them into one FSDP tree.

The project's losses call ``model.get_decoder()(...)`` and then ``model.get_output_embeddings()(h)``
on the positions that carry loss (`train.grpo.completion_logits`, `train.packing.target_logits`,
`train.sft.completion_loss`): the decoder and the head are separate calls, not one forward of the
root. FSDP2's grouped units (``fully_shard([embed_tokens, norm, lm_head])``, torch >= 2.13: a
unit whose modules may run as separate calls, as chunked-loss heads do) make that work; the
root's lazy initialisation runs once in `shard_model` (one no-grad forward of the root).

Numerics:
- fp32 master parameters; ``MixedPrecisionPolicy(param_dtype=compute dtype, reduce_dtype=fp32)``
  (the compute dtype is fp32 on CPU, bf16 on CUDA by default: `train.precision`).
- Gradients are SUMMED over ranks, not averaged (FSDP's default divides by the world size): a
  row's token weight is set over the whole update (`train.step.set_token_weights`), so each
  rank's backward of its own rows is already its share of the update's gradient, as with
  `train.distributed.AllReduce`. `shard_model` sets every unit's gradient divide factor to 1
  with sum-only collectives (``set_gradient_divide_factor(1.0)``,
  ``set_force_sum_reduction_for_comms(True)``).
- ``clip_grad_norm`` gives the global norm over the shards (DTensor-aware, one all-reduce).

Collectives in forward: an FSDP forward (and backward) is a collective, so every rank must run
the same number of passes, also when its share of an update yields fewer micro-batches than
another rank's (or none). `ShardGroup.lockstep` counts the policy's decoder forwards in a block
and, where the other ranks still have passes to run, runs zero-weight idle passes (a one-token
forward, and with ``grad`` a backward of 0 x the output: zero gradients, the same collectives).
A pass is one forward of the policy's decoder plus its LM head call(s), and its backward. Each
pass costs one extra one-integer all-reduce; an idle pass costs the all-gathers and
reduce-scatters of a real one (little compute), so balanced shares keep the ranks busy.

Limits: every rank loads the full fp32 model before `shard_model` keeps its shard (start-up
memory: one full model per rank); the KL reference stays an unsharded copy per rank; LoRA
(frozen parameters) is refused; the passes of a block must all go through this model's decoder
(a KL reference that is the same module with adapters off would add uncounted passes).

Measured: benchmarks/bench_sharded.py (results/bench_sharded.txt). Checkpoints and the HF export
of a sharded model: `train.sharded_checkpoint`; local ranks without torchrun: `train.launch`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from evoharness.config.scale import ShardConfig
from evoharness.train.precision import check_master_weights

# A rank that dies mid-collective fails gloo peers at once (closed socket); NCCL peers wait this long
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


class ShardGroup:
    """This process's place in a group of FSDP2 ranks (`init_group` makes it).

    The data-parallel group a `train.trainer.Trainer` takes as ``reducer`` when its model is
    sharded (`train.distributed.DataParallelGroup`): ``sharded`` is True, ``reduce`` has nothing
    to do (FSDP reduce-scattered the gradient in backward), ``lockstep`` keeps the ranks' forward
    passes matched, ``averaged`` averages a gradient every rank computes in full (the SFT anchor).

    Attributes:
        rank / world / local_rank: this rank, the group size, the rank on this machine.
        device: this rank's device (``cuda:<local_rank>`` or ``cpu``).
        mesh: the 1-D device mesh FSDP shards over.
    """

    sharded = True

    def __init__(self, rank: int, world: int, local_rank: int, device: torch.device, mesh: Any, owns_group: bool):
        self.rank, self.world, self.local_rank, self.device, self.mesh = rank, world, local_rank, device, mesh
        self._owns_group = owns_group

    # -- collectives on small values -------------------------------------------------------------

    def _vote(self, mine: int) -> int:
        t = torch.tensor([mine], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def sum(self, values: Sequence[float]) -> list[float]:
        """`values` (the same length on every rank) summed over the group, in float64."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def from_main(self, values: Sequence[float]) -> list[float]:
        """Rank 0's `values` on every rank (a decision only rank 0 can make, e.g. a wall-clock budget)."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0)
        return t.tolist()

    def barrier(self) -> None:
        dist.barrier()

    # -- the trainer's hooks ---------------------------------------------------------------------

    def reduce(self, model: Any) -> None:
        """Nothing to do: FSDP's backward already reduce-scattered (summed) each unit's gradient."""

    @contextmanager
    def lockstep(self, model: Any, grad: bool, idle: Callable[[Any, bool], None] | None = None) -> Iterator[None]:
        """Run a block of forward passes in step with the other ranks' blocks.

        Every forward of ``model.get_decoder()`` in the block first tells the group "one more pass
        here" (an all-reduce MAX of one integer); after the block this rank runs idle passes for
        as long as another rank still announces one. So all ranks run max(passes) passes.

        Args:
            model: the sharded policy (`shard_model`).
            grad: the block's passes run backward (training) or not (no-grad log-probs, evaluation).
            idle: ``idle(model, grad)`` runs one zero-weight pass with the block's pass structure
                (decoder forward, the same number of LM head calls, backward when `grad`); None:
                one decoder forward and one head call (every loss of `train.grpo`,
                `train.tree_loss`, `train.packing` and `sft.completion_loss`).

        An exception in the block propagates without the closing votes (the peers then fail in
        their next collective or at the timeout).
        """

        def announce(module: Any, args: Any) -> None:  # returns None: a pre-hook's value would replace the inputs
            self._vote(1)

        handle = model.get_decoder().register_forward_pre_hook(announce)
        try:
            yield
        finally:
            handle.remove()  # the idle passes below announce nothing
        while self._vote(0):
            (idle or idle_pass)(model, grad)
        if not grad:
            reshard(model)

    @contextmanager
    def averaged(self, model: Any) -> Iterator[None]:
        """Gradients reduced in the block are averaged over the ranks instead of summed: for a loss
        every rank computes in full (the SFT anchor's batch), so the result is the one-rank gradient."""
        units = fsdp_units(model)
        for m in units:
            m.set_gradient_divide_factor(float(self.world))
        try:
            yield
        finally:
            for m in units:
                m.set_gradient_divide_factor(1.0)

    def close(self) -> None:
        """Leave the group (destroys the process group if `init_group` created it)."""
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False


def init_group(
    rank: int | None = None,
    world: int | None = None,
    init_method: str | None = None,
    device: str | torch.device = "cpu",
    backend: str | None = None,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> ShardGroup:
    """Join (or create) the default process group and return this rank's `ShardGroup`.

    Args:
        rank / world: this rank and the group size; None: from ``RANK`` / ``WORLD_SIZE`` (torchrun).
        init_method: the rendezvous (``file://`` path new to this group, ``tcp://host:port``);
            None: ``env://`` (torchrun's ``MASTER_ADDR`` / ``MASTER_PORT``).
        device: ``cpu`` or ``cuda`` (each rank then uses ``cuda:<LOCAL_RANK>``, default its rank).
        backend: ``gloo`` / ``nccl``; None: NCCL on CUDA, gloo on CPU.
        timeout: how long a collective waits for a missing peer.

    A process group that already exists (a launcher made it) is used as it is.

    Raises:
        ValueError: a rank outside ``[0, world)``; a CUDA group with more ranks on this machine than
            GPUs; CUDA asked for on a machine without.
    """
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world = int(os.environ.get("WORLD_SIZE", 1)) if world is None else world
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a group of {world}")
    dev = torch.device(device)
    if dev.type == "cuda":
        n = torch.cuda.device_count()
        if n == 0:
            raise ValueError("a sharded trainer on cuda needs GPUs; this machine has none (use device='cpu')")
        if local_rank >= n:
            raise ValueError(f"rank {rank} would use cuda:{local_rank}, but this machine has {n} GPU(s)")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        raise ValueError(f"sharded trainers run on cpu (gloo) or cuda (nccl), not {dev.type!r}")
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(
            backend or ("nccl" if dev.type == "cuda" else "gloo"),
            init_method=init_method or "env://",
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
    elif (dist.get_rank(), dist.get_world_size()) != (rank, world):
        raise ValueError(
            f"the existing process group is rank {dist.get_rank()} of {dist.get_world_size()}, not {rank} of {world}"
        )
    from torch.distributed.device_mesh import init_device_mesh

    return ShardGroup(rank, world, local_rank, dev, init_device_mesh(dev.type, (world,)), owns)


def fsdp_units(model: torch.nn.Module) -> list[Any]:
    """The modules of `model` that `fully_shard` made FSDP modules (root first)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_model(model: Any, cfg: ShardConfig, group: ShardGroup, compute_dtype: torch.dtype = torch.float32) -> Any:
    """Shard `model` in place over `group` (module docstring) and return it.

    Args:
        model: a Hugging Face decoder-only causal LM on ``group.device``, fp32 trainable parameters,
            the same weights on every rank (each keeps its own shard of them).
        cfg: ``reshard_after_forward`` (free each unit's gathered parameters after its forward and
            gather again in backward: ZeRO-3; False keeps them to backward: ZeRO-2-like memory);
            ``activation_checkpointing`` (recompute each decoder layer in backward, Hugging Face's
            non-reentrant per-layer checkpointing; active in train mode).
        group: the ranks (`init_group`).
        compute_dtype: the dtype FSDP gathers parameters in for forward/backward (bf16 on GPUs);
            gradients are reduced in fp32 and the masters stay fp32.

    Returns:
        `model`, its parameters now DTensor shards; call it and its decoder as before, on every
        rank in step (`ShardGroup.lockstep`). The KL reference model stays an ordinary, unsharded
        module (a full copy per rank, in the compute dtype).

    Raises:
        ValueError: not the decoder layout above (or already sharded); non-fp32 trainable
            parameters; parameters not on ``group.device``; frozen parameters (LoRA adapters are
            not sharded yet).
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None or not all(hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm")):
        raise ValueError(
            "shard_model needs a Hugging Face decoder-only causal LM (model.model.embed_tokens/layers/norm, lm_head)"
        )
    if isinstance(model, FSDPModule):
        raise ValueError("the model is already sharded")
    check_master_weights(model)
    if any(not p.requires_grad for p in model.parameters()):
        raise ValueError("shard_model trains every parameter: frozen parameters (LoRA) are not supported sharded yet")
    if any(p.device != group.device for p in model.parameters()):
        raise ValueError(f"move the model to {group.device} before sharding it")
    if cfg.activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(
        param_dtype=None if compute_dtype == torch.float32 else compute_dtype, reduce_dtype=torch.float32
    )
    kw = dict(mesh=group.mesh, mp_policy=mp)
    for layer in decoder.layers:
        fully_shard(layer, reshard_after_forward=cfg.reshard_after_forward, **kw)
    # one unit: a tied embedding is one parameter and must live in one unit
    fully_shard([decoder.embed_tokens, decoder.norm, head], reshard_after_forward=cfg.reshard_after_forward, **kw)
    fully_shard(model, **kw)
    for unit in fsdp_units(model):
        unit.set_gradient_divide_factor(1.0)  # sum over ranks (module docstring)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    # FSDP picks its root at the first forward; the losses call the decoder and the head
    # separately, so run the root once now, on every rank (a collective)
    with torch.no_grad():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=group.device), use_cache=False)
    reshard(model)
    return model


def reshard(model: Any) -> None:
    """Free every unit's gathered parameters. Needed after no-grad forwards with
    ``reshard_after_forward = False`` (only a backward frees them then): until then
    ``model.parameters()`` yields the gathered copies, which an optimizer step does not update."""
    for unit in fsdp_units(model):
        unit.reshard()


def idle_pass(model: Any, grad: bool) -> None:
    """A zero-weight pass: one token through the decoder and the LM head; with `grad` a backward of
    0 x the output (every parameter's gradient gets exact zeros: the same collectives, no change)."""
    dev = next(model.parameters()).device
    with torch.set_grad_enabled(grad):
        hidden = model.get_decoder()(input_ids=torch.zeros((1, 1), dtype=torch.long, device=dev), use_cache=False)
        out = model.get_output_embeddings()(hidden.last_hidden_state)
        if grad:
            (out.float().sum() * 0.0).backward()
