"""EvoHarness: harness policy learning (EvoHarness-RL) on an elastic long-horizon RL runtime (QwenGyre)."""

__version__ = "0.1.0"
