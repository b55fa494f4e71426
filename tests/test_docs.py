"""The documentation site builds with no warning (`mkdocs build --strict`), and its configuration
reference covers every config field with a description."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _reference():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (the dev extra)")
def test_site_builds_strictly(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    page = (tmp_path / "site" / "config" / "index.html").read_text()
    assert "max_consecutive_errors" in page and "{{ config_reference }}" not in page


def test_every_config_field_is_described():
    mod = _reference()
    text = mod.render()
    for _, cls in mod._sections():
        for name in cls.model_fields:
            assert f"| `{name}` |" in text, (cls.__name__, name)
    undescribed = [line for line in text.splitlines() if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert not undescribed, undescribed[:10]
