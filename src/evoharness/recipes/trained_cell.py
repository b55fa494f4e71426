"""The training half of a cell with a model: its `train.trainer.Trainer`, gradients and saves.

`TrainedCell` holds what every model cell of a recipe trains with (`runtime.cell.CellParts` less
``serve``): the trainer is built on the first training job, so a rollout-only cell never loads
the KL reference or the SFT anchor's data; a cell started from a checkpoint directory restores
the optimizer's moments and the RNG states from its ``trainer_state.pt``. The recipes' cells add
who answers the model calls: `recipes.alfworld.PolicyCell` (a `LocalHFPolicy`),
`recipes.engine_cell.EngineCell` (the bare engine).

With LoRA (``lora.r > 0``, `train.lora`) every cell holds the base model from ``model_path`` in the
compute dtype plus the same seeded adapters (`base_weights`, `adapt`): only the adapters train, the
KL reference is the cell's own model with its adapters off, a weights sync moves the adapters
alone (`runtime.cell.WeightStore`), and a save is the merged model with the adapters in
``adapter/`` (a checkpoint's cells load the base again and those adapters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from evoharness.config.rl import GRPOConfig
from evoharness.config.scale import LoRAConfig
from evoharness.config.sft import SFTAnchorConfig


def base_weights(
    model_path: str, init_dir: str | None, lora: LoRAConfig, compute: torch.dtype
) -> tuple[str, torch.dtype]:
    """Where a cell's model loads from and in what dtype. Full fine-tuning: the checkpoint
    (`init_dir`, else `model_path`) as fp32 master weights. LoRA: the base, always `model_path`
    (a checkpoint's merged weights would count its adapters twice), frozen, so in the `compute`
    dtype (bf16 on GPUs: half the memory); the adapters are the fp32 masters (`adapt`)."""
    if lora.enabled:
        return str(model_path), compute
    return str(init_dir or model_path), torch.float32


def adapt(model: Any, lora: LoRAConfig, seed: int, init_dir: str | None) -> Any:
    """`lora`'s adapters on `model` (`train.lora.apply_lora`, seeded so that every cell's are the
    same), loaded from ``init_dir/adapter`` when the cell starts from a checkpoint; None when LoRA is off."""
    if not lora.enabled:
        return None
    from evoharness.train.lora import ADAPTER_DIR, apply_lora

    return apply_lora(model, lora, seed, Path(init_dir, ADAPTER_DIR) if init_dir else None)


class TrainedCell:
    """A cell's model, trainer and saves (module docstring).

    Args:
        model: the cell's weights (fp32 masters).
        tokenizer: the model's tokenizer.
        grpo: the trainer's settings (as the run trains them: `recipes.alfworld.train_grpo`).
        model_path: the initial weights: the KL reference (``grpo.kl_beta > 0``) and the export dtype.
        init_dir: the checkpoint directory the cell started from (None: `model_path`).
        device / dtype / ref_device: where the model runs, its compute dtype (autocast; None: auto),
            where the KL reference runs (None: `device`).
        anchor: the SFT anchor's settings (None: GRPO alone); `seed` draws its batches.
        lora: `model`'s adapters (`train.lora.LoRAModel`, from `adapt`); None: full fine-tuning.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        grpo: GRPOConfig,
        model_path: str,
        init_dir: str | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        ref_device: str | None = None,
        anchor: SFTAnchorConfig | None = None,
        seed: int = 0,
        lora: Any = None,
    ):
        from evoharness.train.precision import autocast, compute_dtype

        self.model, self.tokenizer, self.grpo = model, tokenizer, grpo
        self.model_path, self.init_dir, self.anchor_cfg, self.seed = str(model_path), init_dir, anchor, seed
        self.device, self.ref_device, self.lora = device, ref_device, lora
        self.compute = compute_dtype(dtype, device)
        self.amp = lambda: autocast(device, self.compute)
        self._trainer: Any = None
        self._reducer: Any = None

    @property
    def trainer(self) -> Any:
        """The cell's `Trainer` (built on first use)."""
        if self._trainer is None:
            from evoharness.models.init import load_model
            from evoharness.train.checkpoint import load_trainer_state, set_rng_state
            from evoharness.train.trainer import Trainer

            ref, anchor = None, None
            if self.grpo.kl_beta > 0 and self.lora is not None:
                ref = self.lora.reference()  # the same weights, adapters off: no second model (ref_device unused)
            elif self.grpo.kl_beta > 0:
                ref = load_model(self.model_path, self.ref_device or self.device, self.compute)
                ref.eval().requires_grad_(False)
            if self.anchor_cfg is not None:
                from evoharness.train.sft_anchor import SFTAnchor

                anchor = SFTAnchor(
                    self.anchor_cfg, self.tokenizer, self.seed, self.grpo.epochs * self.grpo.mini_batches
                )
            self._trainer = Trainer(
                self.model, self.tokenizer, self.grpo, ref_model=ref, amp=self.amp, anchor=anchor, reducer=self._reducer
            )
            state = Path(self.init_dir or "", "trainer_state.pt")
            if self.init_dir and state.is_file():  # a resumed run: the optimizer's moments and the RNGs
                saved = load_trainer_state(state)
                self._trainer.load_state_dict(saved["optimizer"])
                set_rng_state(saved["rng"])
        return self._trainer

    def accumulate(self, rows: list) -> dict[str, float]:
        return self.trainer.accumulate(rows)

    def step(self, plan: dict[str, Any]) -> list[dict[str, float]]:
        from evoharness.train.step import run_updates

        return run_updates(self.trainer, plan["updates"], plan["lr"], plan["step"], plan["scale"])

    def gradients(self) -> dict[str, torch.Tensor]:
        return self.trainer.gradients()

    def add_gradients(self, grads: dict[str, torch.Tensor]) -> None:
        self.trainer.add_gradients(grads)

    def join_group(self, rank: int, world: int, init_method: str) -> None:
        from evoharness.train.distributed import AllReduce

        self._reducer = AllReduce(rank, world, init_method)
        if self._trainer is not None:
            self._trainer.reducer = self._reducer

    def save(self, directory: str, optimizer: bool, export: bool = False) -> None:
        """An HF directory of the weights (fp32 masters; with `export`, in `model_path`'s dtype)
        and the tokenizer; with `optimizer` also ``trainer_state.pt`` (AdamW moments, RNG states).
        With LoRA the weights are the merged model and the adapters are in ``adapter/``."""
        from evoharness.train.checkpoint import get_rng_state
        from evoharness.train.precision import export_dtype, save_exported

        if self.lora is not None:
            # a checkpoint's merged weights in the base's dtype: a resume reads the fp32 adapters
            self.lora.export(directory, export_dtype(self.model_path) if export else None)
        elif export:
            save_exported(self.model, directory, export_dtype(self.model_path))
        else:
            self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        if optimizer:
            torch.save(
                {"optimizer": self.trainer.state_dict(), "rng": get_rng_state()}, Path(directory) / "trainer_state.pt"
            )
