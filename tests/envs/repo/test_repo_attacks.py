"""Issue 49: every attack of `attacks.ATTACKS` run for real; each defence must hold.

The magic-module attack covers the whole pack (its CI check: at most 0.05 on every task)."""

from __future__ import annotations

import pytest
from attacks import ATTACKS


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_defeated(name, pack, tmp_path):
    verdict, note = ATTACKS[name](pack, tmp_path)
    assert verdict in ("contained", "scored", "scored 0", "refused"), (verdict, note)
