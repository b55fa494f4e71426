"""Experiment tracking: what each tracker wrote is read back with its own reader, and equals the
records logged (the JSONL stays the source of truth; the trackers mirror its numbers)."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest

from evoharness.tracking import Tracker, check_trackers, scalars

RECORDS = [
    {"step": s, "loss": 1.0 / (s + 1), "reward": {"solved": 0.5 * s}, "policy": "x", "won": True} for s in (1, 2, 3)
]
need = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("tensorboard", "wandb", "mlflow")),
    reason="the tracking extra is not installed",
)


def test_scalars_flatten_and_drop_non_numbers():
    assert scalars({"a": 1, "b": {"c": 2.5, "d": "x"}, "e": True, "f": float("nan")}) == {"a": 1.0, "b/c": 2.5}


def test_unknown_tracker_is_refused():
    with pytest.raises(ValueError, match="unknown tracker 'neptune'"):
        check_trackers(["neptune"])


def _wandb_history(run_file: Path) -> list[dict[str, float]]:
    """History rows of an offline W&B run file (LevelDB log format: 32 KiB blocks of records, each with
    a 7-byte header crc32/length/type; type 1 a whole record, 2-4 its first/middle/last part)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, parts, rows = run_file.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            rec = pb.Record.FromString(parts)
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): float(i.value_json) for i in rec.history.item})
    return rows


@need
def test_each_tracker_reads_back_what_was_logged(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with Tracker(["tensorboard", "wandb", "mlflow"], tmp_path, "rl", {"grpo": {"lr": 1e-4}}) as t:
        for r in RECORDS:
            t.log(r, step=r["step"])
    loss_want = {r["step"]: r["loss"] for r in RECORDS}
    solved_want = {r["step"]: r["reward"]["solved"] for r in RECORDS}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {e.step: e.value for e in acc.Scalars("loss")} == pytest.approx(loss_want)  # float32 events
    assert {e.step: e.value for e in acc.Scalars("reward/solved")} == pytest.approx(solved_want)

    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")  # offline by default
    rows = [r for r in _wandb_history(run_file) if "loss" in r]
    assert {int(r["_step"]): r["loss"] for r in rows} == loss_want
    assert {int(r["_step"]): r["reward/solved"] for r in rows} == solved_want

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("evoharness").experiment_id])
    assert run.data.params["grpo.lr"] == "0.0001" and run.info.status == "FINISHED"
    hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert hist == loss_want


@need
def test_evaluation_mirrors_its_summary(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from evoharness.config.eval import EvalConfig
    from evoharness.eval.evaluate import evaluate

    cfg = EvalConfig.model_validate(
        {"limit": 2, "out_dir": str(tmp_path), "policy": {"kind": "teacher"}, "tracking": "tensorboard"}
    )
    summary = evaluate(cfg, progress=False)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    (point,) = acc.Scalars("overall/success")
    assert point.value == pytest.approx(summary["overall"]["success"]) and point.step == 0
