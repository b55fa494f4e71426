"""The top-level Python API: every public name resolves, and the code blocks of docs/api.md run as
written (on real bundled games)."""

from __future__ import annotations

import re
from pathlib import Path

import evoharness

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_every_public_name_resolves():
    for name in evoharness.__all__:
        assert getattr(evoharness, name) is not None, name


def test_docs_api_blocks_run(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), scope)
    out = capsys.readouterr().out.splitlines()
    assert sum(" steps " in line for line in out) == 3  # the custom policy's three episodes
    assert out[-1] == "2 of 2"  # the scripted teacher wins both panel games
    assert (tmp_path / "runs" / "api_eval" / "report.md").is_file()
