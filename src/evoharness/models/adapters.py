"""The peft adapter tensors of a model (`train.lora`).

A model with adapters changes only in them, so an RL weights sync moves those tensors alone
(`runtime.cell.sync_tensors`). Here, not in `train.lora`, because the runtime reads them and knows
nothing of training. peft is imported only once a model was wrapped (no import cost otherwise).
"""

from __future__ import annotations

import sys

import torch


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every peft adapter parameter of `model` by its name in ``model.state_dict()`` (peft's
    ``adapter_layer_names`` of each tuner layer: ``lora_A``, ``lora_B``, ...); empty for a model
    without adapters. Works on the Hugging Face model or its ``PeftModel`` (names differ by prefix)."""
    if "peft" not in sys.modules:  # nothing in this process was ever wrapped: no import cost
        return {}
    from peft.tuners.tuners_utils import BaseTunerLayer

    out: dict[str, torch.nn.Parameter] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            for layer in module.adapter_layer_names:
                for name, p in getattr(module, layer).named_parameters():
                    out[f"{prefix}.{layer}.{name}"] = p
    return out
