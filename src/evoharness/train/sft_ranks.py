"""`train.sft.train_sft` on sharded (FSDP2) ranks: how a step's rows, passes, sums and files split.

With ``shard.ranks > 1`` (or under torchrun) every rank holds a shard of the model (`train.sharded`)
and trains its share of each step's batch: the batch's rows sorted by length and dealt
round-robin (balanced padded tokens), cut into micro-batches as one process cuts its batch. The
loss keeps one process's normalisation: every rank divides by the whole batch's completion
(and prompt) token counts, which it knows (every rank tokenises all examples), so the ranks'
summed gradient is the one-process gradient. Ranks run their micro-batches in lockstep
(`train.sharded.ShardGroup.lockstep`: a rank with fewer pads with zero-weight passes); the
step's loss sums and token counts are summed over the ranks; decisions made on the wall clock
(time budget, fitted schedule) are rank 0's, broadcast.

Rank 0 writes the metrics, checkpoints' pointer and the final export; a checkpoint is a DCP
directory every rank writes its shards into (`train.sharded_checkpoint`), resumable at another
world size, one process included.

`SFTRanks(None)` is one process: every method is the identity, so `train_sft`'s one-process path
is unchanged.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import torch

from evoharness.files import atomic_write_text
from evoharness.train.checkpoint import get_rng_state
from evoharness.train.sharded import ShardGroup
from evoharness.train.sharded_checkpoint import save_sharded

T = TypeVar("T")


class SFTRanks:
    """This process's part of an SFT step (module docstring); `group` None: one process."""

    def __init__(self, group: ShardGroup | None):
        self.group = group
        self.rank, self.world = (group.rank, group.world) if group is not None else (0, 1)

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes metrics, pointers and the export, and reports progress."""
        return self.rank == 0

    def share(self, rows: Sequence[T]) -> list[T]:
        """This rank's rows of a step's batch (one process: all of them, in their order)."""
        if self.group is None:
            return list(rows)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))  # type: ignore[index]
        return [rows[i] for i in order[self.rank :: self.world]]

    def passes(self, model: Any, grad: bool, idle: Callable[[Any, bool], None] | None = None) -> AbstractContextManager:
        """A block of forward passes, in lockstep with the other ranks' (`ShardGroup.lockstep`)."""
        return nullcontext() if self.group is None else self.group.lockstep(model, grad, idle)

    def sum(self, values: Sequence[float]) -> list[float]:
        """`values` summed over the ranks (one process: as given)."""
        return list(values) if self.group is None else self.group.sum(values)

    def agree(self, values: Sequence[float]) -> list[float]:
        """Rank 0's `values` on every rank (one process: as given)."""
        return list(values) if self.group is None else self.group.from_main(values)

    def save_checkpoint(
        self, out_dir: Path, model: Any, tokenizer: Any, opt: Any, sched: Any, state: dict[str, Any], keep: int
    ) -> Path:
        """The sharded counterpart of `train.sft.save_checkpoint` (same arguments), on every rank:
        ``checkpoints/step_N`` holds the DCP shards of the model and AdamW state
        (`train.sharded_checkpoint.save_sharded`), the tokenizer, the scheduler and rank 0's RNG
        state (``trainer_state.pt``) and ``state.json``; rank 0 then points ``checkpoints/latest``
        at it and prunes to the newest `keep`."""
        ckpts = out_dir / "checkpoints"

        def extra(tmp: Path) -> None:
            tokenizer.save_pretrained(str(tmp))
            torch.save({"scheduler": sched.state_dict(), "rng": get_rng_state()}, tmp / "trainer_state.pt")
            (tmp / "state.json").write_text(json.dumps(state))

        path = save_sharded(ckpts / f"step_{state['step']:07d}", model, opt, extra)
        if self.main:
            atomic_write_text(ckpts / "latest", path.name)
            for old in sorted(ckpts.glob("step_*"))[: -max(1, keep)]:
                shutil.rmtree(old, ignore_errors=True)
        return path


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint `SFTRanks.save_checkpoint` wrote (a DCP directory)."""
    return (path / ".metadata").is_file()
