"""`PackedLinear`: ``y = x @ W^T + b`` with the weight pre-packed for oneDNN.

Why: `F.linear` on CPU re-lays the weight out for the GEMM kernel on every call;
for the decoder's shapes (a few dozen rows against a 128-2048-wide weight)
that repacking is as costly as the product itself. oneDNN (bundled with torch,
the path inductor's ``freezing`` takes for CPU linears) packs the weight once.
Measured on this machine (one AVX-512 core, fp32, 2026-11-30): [32, 256] x
[2048, 256] 368 -> 161 us (91 -> 209 GFLOP/s), [4096, 128] x [1024, 128]
11.9 -> 4.4 ms; the outputs equal `F.linear`'s (bit-identical from ~8 rows).
A oneDNN call costs ~10 us more than `F.linear` regardless of size, so
products under `min_macs` multiply-adds (~1M: e.g. a batch-8 decode step's
projections) run through `F.linear` instead (measured crossover).

Where oneDNN is unavailable (not CPU, not fp32, a torch build without it),
and for inputs that are not fp32 or run under autocast, `PackedLinear` is
plain `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def onednn_ok(weight: torch.Tensor) -> bool:
    """Whether `weight` can be packed for oneDNN (fp32 on CPU, torch built with oneDNN)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedLinear:
    """A linear map with weight [out, in] and optional bias [out]; call with x [..., in] -> [..., out].

    Args:
        weight: [out, in]; read once (a later in-place change is not seen: build a new one).
        bias: [out] or None.
        min_macs: products with fewer multiply-adds (rows x in x out) use `F.linear`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, min_macs: int = 1 << 20):
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.min_numel = -(-min_macs // self.weight.shape[0])  # input elements (rows x in) at the crossover
        self.packed = None
        if onednn_ok(self.weight):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)
            except RuntimeError:  # a oneDNN build without this CPU's kernels: F.linear is still right
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # under autocast (bf16 rollouts of a bf16 run) F.linear casts as autocast says; the packed
        # fp32 kernel is not autocast-aware and would mix dtypes
        if (
            self.packed is None
            or x.numel() < self.min_numel
            or x.dtype != torch.float32
            or torch.is_autocast_enabled(x.device.type)
        ):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
