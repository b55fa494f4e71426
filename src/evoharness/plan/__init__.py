"""The memory planner: what a run's configuration holds on each device, before anything loads.

- `layouts`: a model's architecture numbers (from ``config.json``, or a named Qwen3 layout) and
  exact parameter / LoRA adapter counts;
- `memory`: bytes per role (trainer state, activations, logits, KV cache, vLLM, runtime), with
  their formulas and sources;
- `placement`: which process holds which role on which device (RL cells, SFT ranks);
- `planner`: `plan_rl`, `plan_sft`, `plan_run`: the `Plan` per device and its verdict;
- `render`: the plan as a table with footnoted assumptions (`evoharness plan`);
- `stage`: an RL or SFT config file, told apart by its keys;
- `host`: this machine's devices and the check `evoharness rl` / `sft` run before loading.
"""
