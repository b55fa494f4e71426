"""Checkpoints and exports of a sharded (FSDP2) model, readable at any world size.

A checkpoint is a ``torch.distributed.checkpoint`` (DCP) directory: every rank writes its own
shards of the model and AdamW state (``get_state_dict``: keys are parameter names, values
DTensor shards) and rank 0 the metadata that says which slice of which tensor each file holds.
DCP re-slices on load (``set_state_dict``), so a run saved on 2 ranks resumes on 1 (an ordinary
unsharded model and optimizer: no process group needed) or on 4, and an unsharded run's
checkpoint loads into a sharded one. Every rank needs the directory (one machine, or a shared
filesystem).

An export is a plain Hugging Face model directory (``save_pretrained`` safetensors + tokenizer)
that ``AutoModelForCausalLM.from_pretrained`` and vLLM load: the full state dict is gathered to
rank 0 (in CPU memory), converted to the export dtype and written from a model built on the
meta device (no second copy of the weights).

Both are written atomically (`files.atomic_dir`: a temporary directory, then ``os.replace``), so
a crash leaves the previous checkpoint or export whole.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from evoharness.files import atomic_dir

MODEL, OPTIMIZER = "model", "optimizer"  # the DCP state's top-level keys


def _group_rank() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextmanager
def _one_process_ok() -> Iterator[None]:
    """DCP warns on every single-process save/load; here one process is a supported case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {MODEL: get_model_state_dict(model)}
    msd, osd = get_state_dict(model, optimizer)
    return {MODEL: msd, OPTIMIZER: osd}


def save_sharded(
    path: str | Path, model: Any, optimizer: Any = None, extra: Callable[[Path], None] | None = None
) -> Path:
    """Write a DCP checkpoint of `model` (and `optimizer`'s state) to `path`, atomically.

    A collective when a process group exists: every rank calls it with its own model and
    optimizer; one process with an unsharded model works too.

    Args:
        path: the checkpoint directory (replaced whole if it exists).
        model: the sharded (`train.sharded.shard_model`) or plain model.
        optimizer: its optimizer (AdamW moments and step counts), or None: the weights only.
        extra: ``extra(tmp_dir)`` on rank 0 writes more files into the checkpoint before it is
            committed (scheduler, RNG, run state).

    Returns:
        `path`.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    state = _state(model, optimizer)
    rank, world = _group_rank()

    def write(tmp: Path) -> None:  # rank 0; the other ranks write their shards into the same directory
        if world > 1:
            dist.broadcast_object_list([str(tmp)], src=0)
        with _one_process_ok():
            dcp.save(state, checkpoint_id=str(tmp), no_dist=world == 1)
        if extra is not None:
            extra(tmp)

    if rank == 0:
        atomic_dir(path, write)
    else:
        where: list[Any] = [None]
        dist.broadcast_object_list(where, src=0)
        dcp.save(state, checkpoint_id=where[0])
    if world > 1:
        dist.barrier()  # every rank returns once the checkpoint is committed
    return path


def load_sharded(path: str | Path, model: Any, optimizer: Any = None) -> None:
    """Load a `save_sharded` checkpoint into `model` (and `optimizer`), in place, at this run's world
    size (module docstring). A collective when a process group exists.

    Raises:
        FileNotFoundError: `path` is not a DCP checkpoint. RuntimeError / KeyError (DCP): the
            checkpoint holds other parameter names or shapes, or no optimizer state was saved.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    path = Path(path)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a sharded (DCP) checkpoint: no .metadata")
    state = _state(model, optimizer)
    with _one_process_ok():
        dcp.load(state, checkpoint_id=str(path), no_dist=_group_rank()[1] == 1)
    if optimizer is None:
        set_model_state_dict(model, state[MODEL])
    else:
        set_state_dict(model, optimizer, model_state_dict=state[MODEL], optim_state_dict=state[OPTIMIZER])


def full_state_dict(model: Any) -> dict[str, torch.Tensor] | None:
    """The whole model's weights as plain CPU tensors on rank 0 (None on the other ranks); a
    collective when a process group exists."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return sd if _group_rank()[0] == 0 else None


def export_hf(
    model: Any,
    tokenizer: Any,
    out_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    extra: Callable[[Path], None] | None = None,
) -> Path | None:
    """Write `model` as a plain Hugging Face model directory (weights in `dtype`, its config and
    generation config, `tokenizer`), atomically; a collective when a process group exists (rank 0
    writes).

    Args:
        model: the sharded (or a plain) Hugging Face causal LM.
        tokenizer: saved beside it (None: no tokenizer files).
        out_dir: the directory (replaced whole if it exists).
        dtype: the weights' dtype on disk (`train.precision.export_dtype`: the source's).
        extra: ``extra(tmp_dir)`` on rank 0 writes more files into the directory before it is committed.

    Returns:
        `out_dir` on rank 0, None on the others (once rank 0 has committed it).
    """
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    sd = full_state_dict(model)
    if sd is None:
        dist.barrier()
        return None

    def write(tmp: Path) -> None:
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
        plain.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, assign=True)
        plain.tie_weights()  # assign=True gave the head its own tensor; re-tie as the config says
        plain.generation_config = model.generation_config
        plain.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if extra is not None:
            extra(tmp)

    path = atomic_dir(Path(out_dir), write)
    if _group_rank()[1] > 1:
        dist.barrier()
    return path
