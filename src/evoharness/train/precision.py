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
"""

from __future__ import annotations

from contextlib import AbstractContextManager

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
        raise ValueError(f"trainable parameters must be fp32 master weights, found {low}; "
                         "use a low-precision compute dtype through autocast instead")
