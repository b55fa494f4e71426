"""Training at scale: LoRA adapters, sharded (FSDP2) trainer ranks, the model layout the memory
planner reads. Shared by ``[sft]`` and ``[rl]`` (``lora``, ``shard``) and the memory planner (``layout``)."""

from __future__ import annotations

from pydantic import Field

from evoharness.config.base import Strict

# Qwen3's attention and MLP projections: LoRA's usual targets on a Qwen3 checkpoint
QWEN3_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoRAConfig(Strict):
    """Low-rank adapters through peft (Hu et al. 2021): only the adapters train and sit in the
    optimizer; the KL reference is the base model with its adapters disabled. ``r = 0``: off
    (full fine-tuning)."""

    r: int = Field(0, ge=0, description="adapter rank; 0: LoRA off (full fine-tuning)")
    alpha: float = Field(32.0, gt=0, description="scaling numerator (the update is alpha / r * B A)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: list(QWEN3_LORA_TARGETS), min_length=1, description="module names that get adapters"
    )

    @property
    def enabled(self) -> bool:
        return self.r > 0


class ShardConfig(Strict):
    """FSDP2 trainer ranks (`torch.distributed.fsdp.fully_shard`): parameters, gradients and AdamW
    state sharded over ``ranks``, fp32 masters with ``dtype`` compute (MixedPrecisionPolicy).
    ``ranks = 1``: one unsharded trainer. Under ``torchrun`` the launcher's world size wins."""

    ranks: int = Field(1, ge=1, description="trainer ranks the model is sharded over (1: no sharding)")
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer's activations in backward")
    reshard_after_forward: bool = Field(True, description="free gathered parameters after forward (ZeRO-3)")


# The memory planner reads the architecture from model_path/config.json; where the weights are not
# on this machine (a config written for a GPU cluster) a named layout stands in (`evoharness plan
# --list-layouts`).
LAYOUT_DESCRIPTION = "a named model layout for the memory planner (e.g. qwen3-8b); None: model_path/config.json"
