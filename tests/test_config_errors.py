"""A misspelt key is refused with the nearest keys of its own section."""

import pytest

from evoharness.config.base import ConfigError, load_config
from evoharness.config.rl import RLConfig


def test_unknown_keys_suggest_their_sections_nearest_names():
    with pytest.raises(ConfigError) as e:
        load_config(RLConfig, overrides=["runtime.cels=2", "grpo.micro_batch=4", "maxsteps=3", "zzz=1"])
    msg = str(e.value)
    assert "runtime.cels: unknown key (did you mean 'cells'?)" in msg
    assert "grpo.micro_batch: unknown key (did you mean 'micro_batch_size'" in msg
    assert "maxsteps: unknown key (did you mean 'max_steps'" in msg
    assert "zzz: unknown key\n" in msg + "\n"
