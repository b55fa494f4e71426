"""N local trainer ranks without torchrun: this process is rank 0, the others are spawned.

`launch_ranks(world, fn, args)` starts ranks ``1 .. world-1`` as fresh processes
(``multiprocessing`` spawn: nothing of this process is forked), each of which joins a process
group (`train.sharded.init_group`, a ``file://`` rendezvous in a new temporary directory) and
runs ``fn(*args)``; this process joins as rank 0 and runs ``fn(*args, **main_kwargs)`` itself,
so rank 0's progress bar, callbacks (``main_kwargs``: they need not be picklable) and exceptions
are the caller's. `current_group` hands ``fn`` its `train.sharded.ShardGroup`.

On CPU each rank runs ``max(1, cpus // world)`` intra-op threads (ranks share the cores; two
2-thread ranks on 2 cores spin against each other, machine-notes.md). On CUDA rank ``r`` uses
``cuda:r``. Under ``torchrun`` nothing is launched: `current_group` joins the launcher's group
(``WORLD_SIZE > 1``).

A rank that fails makes its peers fail in their next collective (gloo: at once; NCCL: at the
group's timeout); rank 0 then stops the others and re-raises. Ranks that finish meet at a barrier
before leaving the group, so none destroys it while a peer's last collective is still in flight.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from evoharness.train.sharded import ShardGroup, init_group

T = TypeVar("T")
_ACTIVE: ShardGroup | None = None


def current_group(device: str | torch.device = "cpu") -> ShardGroup | None:
    """The `ShardGroup` this process runs in: the one `launch_ranks` made, or under torchrun
    (``WORLD_SIZE > 1``) the launcher's, joined on first call; None for one process."""
    global _ACTIVE
    if _ACTIVE is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _ACTIVE = init_group(device=device)
    return _ACTIVE


def _threads(world: int) -> int:
    return max(1, (os.cpu_count() or 1) // world)


def _rank_main(
    rank: int, world: int, init_method: str, device: str, fn: Callable[..., Any], args: Sequence[Any]
) -> None:
    global _ACTIVE
    if torch.device(device).type == "cpu":
        torch.set_num_threads(_threads(world))
    os.environ["LOCAL_RANK"] = str(rank)
    _ACTIVE = init_group(rank, world, init_method, device)
    try:
        fn(*args)
        _ACTIVE.barrier()  # no rank tears gloo down while a peer still has a collective in flight
    finally:
        _ACTIVE.close()
        _ACTIVE = None


def launch_ranks(
    world: int,
    fn: Callable[..., T],
    args: Sequence[Any] = (),
    device: str = "cpu",
    main_kwargs: dict[str, Any] | None = None,
) -> T:
    """Run ``fn(*args)`` on `world` local ranks (module docstring); returns rank 0's result.

    Args:
        world: the number of ranks (>= 1; 1 runs `fn` here in a group of one).
        fn: a module-level function (the spawned ranks import it by name); it finds its group
            with `current_group`.
        args: its arguments, picklable (they are sent to the spawned ranks).
        device: ``cpu`` or ``cuda`` (rank r on ``cuda:r``).
        main_kwargs: keyword arguments for rank 0 only (callbacks, progress).

    Raises:
        ValueError: ``world < 1``; a group is already active in this process; more CUDA ranks
            than GPUs (`train.sharded.init_group`).
        RuntimeError: a spawned rank exited with an error while rank 0 finished.
    """
    global _ACTIVE
    if world < 1:
        raise ValueError(f"launch_ranks needs at least one rank, got {world}")
    if _ACTIVE is not None or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("launch_ranks inside a group of ranks (torchrun or launch_ranks): call fn directly")
    dev = torch.device(device)
    if dev.type == "cuda" and world > torch.cuda.device_count():
        raise ValueError(f"{world} CUDA ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    rdv = Path(tempfile.mkdtemp(prefix="evoharness-rdv-"))
    init_method = f"file://{rdv / 'store'}"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, init_method, device, fn, tuple(args)), daemon=False)
        for r in range(1, world)
    ]
    threads = torch.get_num_threads()
    try:
        for p in procs:
            p.start()
        if dev.type == "cpu":
            torch.set_num_threads(_threads(world))
        _ACTIVE = init_group(0, world, init_method, device)
        peer_error = None
        try:
            result = fn(*args, **(main_kwargs or {}))
            try:
                _ACTIVE.barrier()  # as in `_rank_main`
            except RuntimeError as e:  # a rank failed after rank 0's last collective: its exit code tells below
                peer_error = e
        finally:
            _ACTIVE.close()
            _ACTIVE = None
        for p in procs:
            p.join()
        failed = [(r, p.exitcode) for r, p in enumerate(procs, 1) if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"rank(s) exited with errors: {failed} (their tracebacks are on stderr)") from peer_error
        if peer_error is not None:
            raise peer_error
        return result
    finally:
        torch.set_num_threads(threads)
        for p in procs:  # rank 0 failed: its peers are stuck in (or failing at) a collective
            if p.pid is None:  # never started
                continue
            if p.is_alive():
                p.terminate()
            p.join()
        shutil.rmtree(rdv, ignore_errors=True)
