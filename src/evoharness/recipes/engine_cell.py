"""A cell with the bare decoding engine: token ids in, token ids and behaviour log-probs out.

`EngineCell` is a cell's parts (`runtime.cell.CellParts`) for workloads whose agents tokenize
their own prompts (repository tasks, `recipes.repo`; the runtime tests' synthetic agents): a
`engines.hf.Engine` over the cell's model answers each model call, and a `train.trainer.Trainer`
over the same weights trains the rows the workload makes (`train.step`).

A call's payload is ``(prompt_ids, max_new_tokens, seed, temperature)`` (``temperature``
optional, default 1) and its answer ``(completion_ids, logprobs, version)``: the behaviour
log-probs under the weights ``version`` that decoded it. Each call samples with a generator of
its own seed, so a call re-issued on another cell, or batched with other calls, returns the same
completion from the same weights (`engines.hf`).

`EngineCellFactory` is what travels to the cell (picklable: paths, a `GRPOConfig` and settings);
the cell builds its parts where it runs (``factory(cell, init_dir)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from evoharness.config.rl import GRPOConfig
from evoharness.config.scale import LoRAConfig
from evoharness.recipes.trained_cell import TrainedCell, adapt, base_weights


@dataclasses.dataclass
class EngineCellFactory:
    """Builds a cell's `EngineCell` where the cell runs (``factory(cell, init_dir)``).

    Attributes:
        model_path: the initial weights and tokenizer (a local HF directory); also the KL reference.
        grpo: the loss and optimizer settings of the cell's trainer (resolved: ``off_policy`` and
            ``lr_decay_steps`` as the run trains them).
        threads: torch threads in the cell (None: leave the process's setting).
        device: where the model runs.
        dtype: the compute dtype (autocast over fp32 master weights; None: ``auto``).
        ref_device: where the KL reference runs (None: `device`).
        lora: LoRA adapters (``r > 0``: only they train and sync, `recipes.trained_cell`); r = 0: full weights.
        seed: the adapters' initialisation (the same in every cell).
    """

    model_path: str
    grpo: GRPOConfig
    threads: int | None = None
    device: str = "cpu"
    dtype: str | None = None
    ref_device: str | None = None
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
    seed: int = 0

    def __call__(self, cell: int, init_dir: str | None) -> EngineCell:
        if self.threads:
            torch.set_num_threads(self.threads)
        return EngineCell(
            self.model_path,
            self.grpo,
            init_dir,
            device=self.device,
            dtype=self.dtype,
            ref_device=self.ref_device,
            lora=self.lora,
            seed=self.seed,
        )


class EngineCell(TrainedCell):
    """A cell's parts with the bare engine (module docstring; `runtime.cell.CellParts`).

    Args:
        model_path: the initial weights and tokenizer; the KL reference when ``grpo.kl_beta > 0``.
        grpo: the trainer's settings.
        init_dir: a checkpoint directory to start from (`save`'s: weights, tokenizer and
            ``trainer_state.pt``; with LoRA ``adapter/``); None: `model_path`.
        device / dtype / ref_device / lora / seed: as `EngineCellFactory`'s.
    """

    def __init__(
        self,
        model_path: str,
        grpo: GRPOConfig,
        init_dir: str | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        ref_device: str | None = None,
        lora: LoRAConfig | None = None,
        seed: int = 0,
    ):
        from evoharness.engines.hf import Engine
        from evoharness.models.init import load_model, load_tokenizer
        from evoharness.train.precision import compute_dtype

        lora = lora or LoRAConfig()
        # fp32 master weights (with LoRA: the adapters); low precision only as autocast compute
        tokenizer = load_tokenizer(init_dir or model_path)
        source, weights_dtype = base_weights(model_path, init_dir, lora, compute_dtype(dtype, device))
        model = load_model(source, device, weights_dtype)
        super().__init__(
            model,
            tokenizer,
            grpo,
            model_path,
            init_dir,
            device=device,
            dtype=dtype,
            ref_device=ref_device,
            lora=adapt(model, lora, seed, init_dir),
        )
        self.engine = Engine(self.model, self.tokenizer)

    def serve(self, payloads: list[tuple], version: int) -> list[tuple[list[int], list[float], int]]:
        """Decode a batch of calls ``(prompt_ids, max_new_tokens, seed[, temperature])``; calls
        with the same ``max_new_tokens`` and temperature decode together."""
        from evoharness.engines.grammar import GenRequest

        calls = [(list(p[0]), int(p[1]), int(p[2]), float(p[3]) if len(p) > 3 else 1.0) for p in payloads]
        out: list[Any] = [None] * len(calls)
        self.model.eval()
        for key in dict.fromkeys((m, t) for _, m, _, t in calls):
            idx = [i for i, c in enumerate(calls) if (c[1], c[3]) == key]
            with self.amp():
                res = self.engine.generate(
                    [GenRequest(calls[i][0], seed=calls[i][2]) for i in idx], max_new_tokens=key[0], temperature=key[1]
                )
            for i, r in zip(idx, res, strict=True):
                out[i] = (list(r.token_ids), list(r.logprobs), version)
        return out
