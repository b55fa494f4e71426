"""`evoharness simulate` end to end on the smoke workload."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from evoharness.cli import app

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "workloads" / "smoke.toml"


def test_simulate_writes_table_json_png(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "--workload",
            str(SMOKE),
            "--cells",
            "4",
            "--steps",
            "2",
            "--policies",
            "colocate,async,elastic",
            "--seed",
            "3",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "| elastic |" in res.output and "| colocate |" in res.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["policy"] for r in data["results"]] == ["colocate", "async", "elastic"]
    assert all(r["steps"] == 2 and r["aborted_turns"] == 0 for r in data["results"])
    assert (tmp_path / "table.md").read_text().startswith("# smoke")
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_simulate_gated_side_by_side():
    res = CliRunner().invoke(
        app, ["simulate", "--workload", str(SMOKE), "--steps", "1", "--policies", "colocate,elastic,elastic-gated"]
    )
    assert res.exit_code == 0, res.output
    assert "| elastic-gated |" in res.output and "elastic speedup vs this" in res.output


def test_simulate_clear_errors(tmp_path):
    r = CliRunner().invoke(app, ["simulate", "--workload", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "workload file not found" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[workload\n")
    r = CliRunner().invoke(app, ["simulate", "--workload", str(bad)])
    assert r.exit_code == 2 and "not valid TOML" in r.output
    r = CliRunner().invoke(app, ["simulate", "--workload", str(SMOKE), "--policies", "colocate,fifo"])
    assert r.exit_code == 2 and "unknown policy fifo" in r.output


def test_simulate_elastic_async_by_name():
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "--workload",
            str(SMOKE),
            "--steps",
            "2",
            "--policies",
            "async,elastic-async",
            "--set",
            "policy.staleness=1",
        ],
    )
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("| elastic-async |"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[12].endswith("/1") and cells[13] == "0"  # staleness max 1, no aborted turn
