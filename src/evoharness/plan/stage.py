"""Which stage a config file configures (RL or SFT), and loading it as that stage's config."""

from __future__ import annotations

import tomllib
from pathlib import Path

from evoharness.config.base import ConfigError, load_config, parse_override
from evoharness.config.rl import RLConfig
from evoharness.config.sft import SFTJobConfig

STAGES = {"rl": RLConfig, "sft": SFTJobConfig}


def detect_stage(keys: set[str]) -> str:
    """``rl`` or ``sft``: the config type whose fields the top-level `keys` belong to.

    Raises:
        ConfigError: keys of neither type, or keys both types share only (name the stage).
    """
    rl, sft = set(RLConfig.model_fields), set(SFTJobConfig.model_fields)
    fits = [name for name, fields in (("rl", rl), ("sft", sft)) if keys <= fields]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise ConfigError(
            f"keys {sorted(keys - rl - sft) or sorted(keys)} belong to neither an RL config (`evoharness rl`) nor an "
            "SFT config (`evoharness sft`); name the stage with --stage rl|sft"
        )
    raise ConfigError(f"keys {sorted(keys)} fit both an RL and an SFT config: name the stage with --stage rl|sft")


def load_stage_config(
    path: str | Path | None, overrides: list[str], stage: str | None = None
) -> RLConfig | SFTJobConfig:
    """The RL or SFT config in `path` (TOML) with ``--set`` `overrides`; `stage` None: detected
    from the file's and the overrides' top-level keys.

    Raises:
        ConfigError: a missing or malformed file, an unknown stage, keys of neither stage.
    """
    if stage is not None and stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r} (rl | sft)")
    if stage is None:
        keys = {parse_override(o)[0][0] for o in overrides if parse_override(o)[0]}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file not found: {p}")
            try:
                keys |= set(tomllib.loads(p.read_text()))
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{p}: not valid TOML: {e}") from e
        stage = detect_stage(keys)
    return load_config(STAGES[stage], path, overrides)
