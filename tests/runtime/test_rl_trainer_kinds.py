"""`runtime.trainer = "fsdp"` is planned but not run by rl's cells: rl refuses it before any cell
starts, naming what to use instead (the sharded trainer runs in `sft`)."""

import pytest

from evoharness.config.rl import RLConfig
from evoharness.recipes.rl import train_rl


def test_fsdp_cells_are_refused_before_anything_starts(tmp_path):
    cfg = RLConfig(model_path=str(tmp_path / "model"), out_dir=str(tmp_path / "out"))
    cfg.runtime.trainer = "fsdp"
    with pytest.raises(ValueError, match=r"rl's cells do not run FSDP ranks yet.*allreduce"):
        train_rl(cfg, progress=False)
    assert not (tmp_path / "out" / "runtime").exists()
