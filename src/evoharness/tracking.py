"""Experiment tracking beside the JSONL metrics: TensorBoard, Weights & Biases, MLflow.

``metrics.jsonl`` stays the source of truth (atomic, resumable, read by the reports); a `Tracker`
mirrors each record's numeric fields to the trackers a run names (``tracking = ["tensorboard",
"wandb", "mlflow"]``, any combination), all writing under the run's directory:

- ``tensorboard``: event files in ``<out>/tensorboard`` (`torch.utils.tensorboard.SummaryWriter`);
- ``wandb``: offline unless ``WANDB_MODE`` says otherwise, files in ``<out>/wandb`` (``wandb sync``
  uploads them later);
- ``mlflow``: a SQLite store ``<out>/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` names a server
  (``mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db`` browses it).

Each needs its package (``pip install -e '.[tracking]'``); a tracker named without its package is
an error at start, not a silent no-op. A resumed run logs its later steps to the same directories
(TensorBoard and MLflow show one curve; W&B offline starts a new run file for the resumed part).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "wandb", "mlflow")
_PACKAGE = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def check_trackers(kinds: Sequence[str]) -> list[str]:
    """`kinds` validated (order kept, duplicates dropped).

    Raises:
        ValueError: an unknown tracker, or one whose package is not installed (with the install line).
    """
    out: list[str] = []
    for k in kinds:
        if k not in TRACKERS:
            raise ValueError(f"unknown tracker {k!r}; choose from {', '.join(TRACKERS)}")
        if importlib.util.find_spec(_PACKAGE[k]) is None:
            raise ValueError(f"tracking {k!r} needs the {_PACKAGE[k]} package: pip install -e '.[tracking]'")
        if k not in out:
            out.append(k)
    return out


def scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numeric fields of `record` (nested dicts flattened with ``/``; bools and text dropped)."""
    out: dict[str, float] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(scalars(v, f"{key}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


class Tracker:
    """The trackers of one run (module docstring).

    Args:
        kinds: tracker names (`TRACKERS`); empty: a no-op tracker.
        out_dir: the run's directory (each tracker writes under it).
        name: the run's name in the trackers (e.g. ``sft``, ``rl``, ``eval-valid_seen``).
        config: the run's settings, recorded once (hyper-parameters).

    Raises:
        ValueError: as `check_trackers`.
    """

    def __init__(self, kinds: Sequence[str], out_dir: str | Path, name: str, config: Mapping[str, Any] | None = None):
        self.kinds = check_trackers(kinds)
        self.out = Path(out_dir)
        self._tb = self._wandb = self._mlflow = None
        flat = {k: v for k, v in _flat(config or {}).items() if isinstance(v, (str, int, float, bool))}
        if "tensorboard" in self.kinds:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.out / "tensorboard"))
            if flat:
                self._tb.add_text("config", "\n".join(f"    {k} = {v}" for k, v in sorted(flat.items())))
        if "wandb" in self.kinds:
            import wandb

            (self.out / "wandb").mkdir(parents=True, exist_ok=True)
            self._wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "evoharness"),
                name=name,
                dir=str(self.out),
                config=flat,
                mode=os.environ.get("WANDB_MODE", "offline"),
                reinit="create_new",
            )
        if "mlflow" in self.kinds:
            import mlflow

            self.out.mkdir(parents=True, exist_ok=True)  # MLflow's file store is deprecated: a SQLite store
            uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(self.out / 'mlflow.db').resolve()}"
            self._mlflow = mlflow.MlflowClient(tracking_uri=uri)
            exp = self._mlflow.get_experiment_by_name("evoharness")
            exp_id = exp.experiment_id if exp else self._mlflow.create_experiment("evoharness")
            self._mlflow_run = self._mlflow.create_run(exp_id, run_name=name).info.run_id
            for k, v in list(flat.items())[:500]:  # MLflow caps a run's params
                self._mlflow.log_param(self._mlflow_run, k[:250], str(v)[:6000])

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Mirror `record`'s numeric fields (`scalars`) at `step` to every tracker."""
        if not self.kinds:
            return
        values = scalars(record)
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        if self._mlflow is not None:
            from mlflow.entities import Metric

            ms = int(1000 * time.time())
            metrics = [Metric(k[:250], v, ms, step) for k, v in values.items()]
            for i in range(0, len(metrics), 1000):  # the REST API's batch limit
                self._mlflow.log_batch(self._mlflow_run, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.set_terminated(self._mlflow_run)
        self._tb = self._wandb = self._mlflow = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
