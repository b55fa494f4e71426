"""Every typed configuration of the project, in one place that imports nothing else of it.

Sections are pydantic models (`Strict`: unknown keys are errors) loaded from TOML and
overridden from the command line (`load_config`). One module per area:

- `base`: `Strict`, `ConfigError`, `load_config` and the ``--set`` override syntax;
- `harness`: `HarnessConfig` and the shared prompt budget;
- `policy`: `PolicyConfig` (who plays an evaluation or a collection);
- `env`: ALFWorld's `EnvConfig` and task types, the repository tasks' `RepoTasksConfig` and agent's
  `AgentConfig`;
- `collect`: `CollectConfig` (teacher traces), `DistillConfig` (agent logs into SFT examples);
- `eval`: `EvalConfig` (the fixed panel), `RepoEvalConfig`;
- `scale`: `LoRAConfig`, `ShardConfig` (LoRA, FSDP2 ranks; shared by sft and rl);
- `sft`: `SFTConfig`, `SFTJobConfig` (`evoharness sft`), `SFTAnchorConfig`;
- `recipe`: the harness recipe saved with a model (`ModelRecipe`) and with SFT examples;
- `rl`: `RewardConfig`, `AdvantageConfig`, `GRPOConfig`, `RuntimeConfig`, `RLConfig`;
- `sim`: the simulator's `SimConfig` (workload, cluster, schedule knobs);
- `run`: `RunConfig`, the main job.
"""

from evoharness.config.base import ConfigError, Strict, apply_overrides, load_config, parse_override

__all__ = ["ConfigError", "Strict", "apply_overrides", "load_config", "parse_override"]
