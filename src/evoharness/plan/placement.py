"""Which process holds which role on which device, read from an RL or SFT config.

RL (`evoharness rl`): ``runtime.cells`` cells, each a process (or this process, in-process)
holding one model. Its roles follow the schedule: ``colocate`` and the elastic schedules train
and roll out on every cell (in turn, so a cell's peak is its resident state plus the larger of
its two phases); ``async`` trains on cells ``0 .. async_train_cells - 1`` (default K // 4, at least
one) and rolls out on the others. AdamW moments live on every train cell (``allreduce``), only
on the core, cell 0 (``single``: the others send it their gradients), or sharded over the train
cells (``fsdp``, one FSDP2 rank per train cell). Devices: with ``runtime.gpus_per_cell = g > 0``
cell c owns GPUs ``c·g .. c·g + g - 1`` and ``device`` / ``ref_device`` index into its own slice
(``cuda:1`` = the cell's second GPU); with g = 0 every cell runs on ``device`` itself. A vLLM
engine runs on its cell's first GPU (`recipes.vllm_cell.engine_settings`: no tensor parallelism).
CPU runs put everything in host RAM (one device).

SFT (`evoharness sft`): ``shard.ranks`` trainer ranks (one process each under torchrun), rank i
on GPU i; on CPU all in host RAM.
"""

from __future__ import annotations

from dataclasses import dataclass

from evoharness.config.rl import RLConfig
from evoharness.config.sft import SFTConfig


@dataclass(frozen=True)
class Slot:
    """One process's roles and devices.

    Attributes:
        name: ``cell 0``, ``rank 0``, ``driver``.
        trains: holds a trainer (weights being trained, gradients, activations).
        optimizer: holds AdamW moments (its shard under FSDP).
        rolls_out: answers rollout calls.
        devices: the global device indices the process uses (its model's first).
        model_device / ref_device: where its model and its KL reference sit.
    """

    name: str
    trains: bool
    optimizer: bool
    rolls_out: bool
    devices: tuple[int, ...]
    model_device: int
    ref_device: int


def device_index(device: str | None, default: int = 0) -> int:
    """``cuda:1`` -> 1, ``cuda`` / ``cpu`` -> `default`.

    Raises:
        ValueError: a device string that is neither.
    """
    if device is None or device in ("cuda", "cpu"):
        return default
    kind, _, idx = device.partition(":")
    if kind not in ("cuda", "cpu") or not idx.isdigit():
        raise ValueError(f"device {device!r} is not cpu, cuda or cuda:N")
    return int(idx)


def rl_on_cuda(cfg: RLConfig) -> bool:
    """The run's models sit on GPUs (``device`` cuda, or GPU cells)."""
    return cfg.runtime.gpus_per_cell > 0 or cfg.device.startswith("cuda")


def train_cell_count(cfg: RLConfig) -> int:
    """Cells that train (the FSDP ranks under ``runtime.trainer = "fsdp"``)."""
    rt = cfg.runtime
    if rt.schedule == "async" and rt.cells > 1:
        return rt.async_train_cells or max(1, rt.cells // 4)
    return rt.cells


def rl_slots(cfg: RLConfig) -> tuple[list[Slot], int]:
    """The RL run's cells and how many devices they need (1 on CPU: host RAM).

    Raises:
        ValueError: a device string that is not cpu / cuda / cuda:N.
    """
    rt = cfg.runtime
    trainer = rt.resolved_trainer()
    n_train = train_cell_count(cfg)
    both = rt.schedule != "async" or rt.cells == 1
    model_local = device_index(cfg.device)
    ref_local = device_index(cfg.ref_device, model_local)
    slots = []
    for c in range(rt.cells):
        trains = both or c < n_train
        if rl_on_cuda(cfg) and rt.gpus_per_cell > 0:
            base, g = c * rt.gpus_per_cell, rt.gpus_per_cell
            devices = tuple(range(base, base + g))
            model, ref = base + model_local, base + ref_local
        elif rl_on_cuda(cfg):
            model, ref = model_local, ref_local
            devices = tuple(dict.fromkeys((model, ref)))
        else:
            model = ref = 0
            devices = (0,)
        slots.append(
            Slot(
                name=f"cell {c}",
                trains=trains,
                optimizer=trains and (trainer != "single" or c == 0),
                rolls_out=both or not trains,
                devices=devices,
                model_device=model,
                ref_device=ref,
            )
        )
    needed = 1 + max(max(s.devices + (s.model_device, s.ref_device)) for s in slots)
    return slots, needed


def sft_slots(cfg: SFTConfig) -> tuple[list[Slot], int]:
    """The SFT run's trainer ranks and how many devices they need (1 on CPU)."""
    on_cuda = cfg.device.startswith("cuda")
    first = device_index(cfg.device)
    slots = [
        Slot(f"rank {r}", True, True, False, (first + r,) if on_cuda else (0,), first + r if on_cuda else 0, 0)
        for r in range(cfg.shard.ranks)
    ]
    return slots, (first + cfg.shard.ranks) if on_cuda else 1
