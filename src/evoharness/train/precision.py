"""Training precision: fp32 master weights, low-precision compute by autocast.

Whatever dtype a run asks for (``bfloat16`` on GPUs), the trained model's
parameters, gradients and AdamW moments stay fp32 and the low precision is
only the *compute* dtype of the forward passes (`torch.autocast`: matmuls in
bf16, reductions and the fp32 leaf gradients as usual). AdamW updates at the
paper's lr 1e-6 are ~1e-6 per weight, far below bf16's resolution near
typical weights (2^-8 relative, ~1e-4 at |w| = 0.02): run on bf16 parameters,
almost every update rounds away (issue 10 fault 1; measured in
``tests/train/test_precision.py``).

Memory per parameter with AdamW: 4 (fp32 weight) + 4 (fp32 grad) + 8 (two fp32
moments) = 16 bytes; a frozen reference model costs 2 bytes in bf16.

Master weights are a training detail: resumable checkpoints keep them fp32
(exact resume), but a run's exported model (``final/``) is written in the dtype
its source checkpoint declared (`export_dtype`; bf16 for Qwen3-8B). An fp32
export would double its size, and servers pick the dtype from the config
(vLLM's ``dtype=auto`` serves a float32 checkpoint in float16).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from evoharness.models.init import resolve_dtype


def compute_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """The forward-pass dtype a run asks for (``auto``: bf16 on CUDA, fp32 elsewhere)."""
    return resolve_dtype(dtype, device)


def autocast(device: str | torch.device, dtype: torch.dtype) -> AbstractContextManager:
    """Forward passes in `dtype` over fp32 parameters; a no-op for fp32."""
    dev = torch.device(device)
    return torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32)


def check_master_weights(model: torch.nn.Module) -> None:
    """Raise ValueError if a trainable parameter is not fp32 (its updates would round away)."""
    low = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad and p.dtype != torch.float32})
    if low:
        raise ValueError(
            f"trainable parameters must be fp32 master weights, found {low}; "
            "use a low-precision compute dtype through autocast instead"
        )


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_dtype(model_dir: str | Path) -> torch.dtype:
    """The dtype the HF model directory `model_dir` declares in its config.json
    (``dtype``, or ``torch_dtype`` in older files); fp32 when it declares none."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").removeprefix("torch.")
    return _DTYPES.get(name, torch.float32)


def save_exported(model: torch.nn.Module, out_dir: str | Path, dtype: torch.dtype) -> None:
    """``save_pretrained`` the finished model in `dtype` (its config then says so).

    The parameters are converted in place (no second copy of a large model in
    memory), so call this last: the model is not for training afterwards.
    """
    if any(p.dtype != dtype for p in model.parameters()):
        model.to(dtype)
    model.save_pretrained(str(out_dir), safe_serialization=True)
