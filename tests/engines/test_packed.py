"""`PackedLinear` (oneDNN pre-packed weights) against `F.linear`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evoharness.engines.packed import PackedLinear, onednn_ok


@pytest.mark.parametrize("shape", [(1, 128), (3, 128), (32, 128), (4, 75, 128)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_equals_f_linear(shape, with_bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(320, 128, generator=g)
    b = torch.randn(320, generator=g) if with_bias else None
    x = torch.randn(*shape, generator=g)
    lin = PackedLinear(w, b, min_macs=0)  # every size through oneDNN
    assert (lin.packed is not None) == onednn_ok(w)
    y = lin(x)
    assert y.shape == (*shape[:-1], 320)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    # a strided input (a slice of a wider activation) gives the same result
    wide = torch.randn(*shape[:-1], 256, generator=g)
    torch.testing.assert_close(lin(wide[..., ::2]), F.linear(wide[..., ::2], w, b), rtol=1e-5, atol=1e-5)


def test_packed_linear_reads_the_weight_once():
    """The packed copy is a snapshot: the decoder rebuilds it when the model's weights change."""
    w = torch.randn(64, 32)
    lin = PackedLinear(w, min_macs=0)
    x = torch.randn(8, 32)
    before = lin(x)
    w.mul_(2)
    if lin.packed is not None:
        torch.testing.assert_close(lin(x), before)
    torch.testing.assert_close(PackedLinear(w)(x), 2 * before, rtol=1e-5, atol=1e-5)


def test_packed_linear_falls_back_off_fp32():
    w = torch.randn(16, 8, dtype=torch.float64)
    lin = PackedLinear(w)
    assert lin.packed is None
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(lin(x), F.linear(x, w))


def test_small_products_take_f_linear():
    """Under `min_macs` the oneDNN call's fixed cost outweighs its speed: `F.linear` runs (reads w live)."""
    w = torch.randn(128, 128)
    lin = PackedLinear(w)  # default threshold ~1M multiply-adds
    small, big = torch.randn(8, 128), torch.randn(128, 128)
    w.mul_(2)  # the packed snapshot keeps the old weight; F.linear sees the new one
    torch.testing.assert_close(lin(small), F.linear(small, w))
    if lin.packed is not None:
        torch.testing.assert_close(lin(big), F.linear(big, w / 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_follows_autocast_and_input_dtype(x_dtype):
    """Under bf16 autocast (a bf16 run's rollouts) and for non-fp32 inputs the product is
    F.linear's, dtype included: the fp32 oneDNN kernel is not autocast-aware (it once
    decoded garbage, 0 completion tokens, in a bf16 RL run)."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(320, 128, generator=g), torch.randn(320, generator=g)
    x = torch.randn(32, 128, generator=g).to(x_dtype)
    lin = PackedLinear(w, b, min_macs=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, ref = lin(x), F.linear(x, w, b)
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref)
