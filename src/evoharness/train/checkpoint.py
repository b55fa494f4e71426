"""Trainer checkpoints: step directories, RNG state, resumable JSONL metrics.

A checkpoint directory is written atomically (`files.atomic_dir`), so a crash
leaves either the old or the new checkpoint, never a torn one. ``checkpoints/latest`` names the newest; writing
it is the commit point of a step.

Step commit (metrics and checkpoint agree after any kill): a trainer appends
the step's metrics record first, then writes the checkpoint with a copy of
``metrics.jsonl`` inside (`snapshot_metrics`), then moves ``latest``. On resume
`restore_metrics` puts back exactly the checkpoint's copy, so a record
appended after the last commit (or torn by a kill) is dropped with the step it
belongs to, and the step is redone.

Loading: `load_checkpoint` tries the committed checkpoint, then older ones,
saying why it falls back; only data this module wrote is read back (JSON,
safetensors, and `torch.load(weights_only=True)`: no arbitrary unpickling).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from evoharness.files import atomic_write_text, truncate_jsonl

T = TypeVar("T")
METRICS_COPY = "metrics.jsonl"


def get_rng_state() -> dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


_STEP_DIR_RE = re.compile(r"step_\d+")


def _read_pointer(ptr: Path, warn: bool) -> str | None:
    """The ``step_*`` name in pointer file `ptr`; None when there is no pointer or it does
    not name an existing checkpoint directory (torn, garbage, a path, or a deleted
    directory), with a warning when `warn`."""
    if not ptr.is_file():
        return None
    raw = ptr.read_bytes()
    name = raw.decode("utf-8", "replace").strip()
    if _STEP_DIR_RE.fullmatch(name) and (ptr.parent / name).is_dir():
        return name
    if warn:
        warnings.warn(
            f"{ptr} does not name a checkpoint ({raw[:60]!r}); resuming from the newest step_* directory instead",
            stacklevel=3,
        )
    return None


def checkpoint_candidates(out_dir: str | Path) -> list[Path]:
    """Checkpoints to resume from, best first: the one ``checkpoints/latest``
    names, then the older ``step_*`` directories, newest first. Directories
    newer than ``latest`` were never committed and are left out. Without a
    usable pointer (none, or one that names no checkpoint directory: a warning
    says so), every ``step_*`` directory counts: each was swapped in whole by
    `atomic_dir` and holds its own metrics copy, so it is a consistent point."""
    ckpts = Path(out_dir) / "checkpoints"
    steps = sorted((p for p in ckpts.glob("step_*") if p.is_dir()), reverse=True)
    name = _read_pointer(ckpts / "latest", warn=True)
    if name is None:
        return steps
    return [ckpts / name] + [p for p in steps if p.name < name]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The directory ``checkpoints/latest`` names, or None (no usable pointer, or no ``state.json`` there)."""
    ptr = Path(out_dir) / "checkpoints" / "latest"
    name = _read_pointer(ptr, warn=False)
    if name is None:
        return None
    path = ptr.parent / name
    return path if (path / "state.json").is_file() else None


def load_checkpoint(out_dir: str | Path, load: Callable[[Path], T]) -> tuple[Path, T] | None:
    """``(path, load(path))`` for the first candidate (`checkpoint_candidates`) that loads.

    A candidate whose `load` raises is reported (a `UserWarning` naming the
    checkpoint, the error and the fallback) and the previous one is tried.

    Returns:
        None when there is no checkpoint at all (a fresh run).

    Raises:
        RuntimeError: checkpoints exist but none loads (never silently restart).
    """
    tried = []
    cands = checkpoint_candidates(out_dir)
    for i, path in enumerate(cands):
        try:
            return path, load(path)
        except Exception as e:  # noqa: BLE001 -- any unreadable checkpoint: fall back
            tried.append(f"{path.name}: {type(e).__name__}: {e}")
            nxt = f"falling back to {cands[i + 1].name}" if i + 1 < len(cands) else "no older checkpoint"
            warnings.warn(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:300]}); {nxt}", stacklevel=2)
    if tried:
        raise RuntimeError(f"no readable checkpoint in {Path(out_dir) / 'checkpoints'}: " + "; ".join(tried))
    return None


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume_config(saved: Path, current: dict[str, Any], free: tuple[str, ...]) -> None:
    """Refuse to resume a run directory started with another config.

    Args:
        saved: the JSON config the directory's run wrote when it started.
        current: this run's config (``model_dump(mode="json")``).
        free: dotted keys a resume may change (e.g. ``steps``, ``max_minutes``);
            a section name frees all its keys.

    Keys in only one of the two (a field added or removed by another version of
    the code) are not compared.

    Raises:
        ValueError: a differing key, named with both values.
    """
    if not saved.is_file():
        return
    old, new = _flat(json.loads(saved.read_text())), _flat(current)
    diff = sorted(
        k
        for k in old.keys() & new.keys()
        if old[k] != new[k] and not any(k == f or k.startswith(f + ".") for f in free)
    )
    if diff:
        shown = ", ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in diff[:4])
        raise ValueError(
            f"{saved.parent} holds checkpoints of another run ({shown}{', ...' if len(diff) > 4 else ''}); "
            "use a new out_dir"
        )


def load_trainer_state(path: Path) -> dict[str, Any]:
    """A ``torch.save``d dict of tensors and plain values (optimizer, scheduler, RNG
    states), read with ``weights_only=True``: nothing else is unpickled."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Copy an HF directory's safetensors weights (all ``model*.safetensors`` shards)
    into `model`'s parameters, converting to their dtype. A tied weight (the LM head
    sharing the embedding) may be absent.

    Raises:
        FileNotFoundError: no weights file. KeyError: weights that do not fit the model.
    """
    from safetensors.torch import load_file

    files = sorted(ckpt.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{ckpt}: no model*.safetensors")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    own = model.state_dict()
    res = model.load_state_dict(weights, strict=False)
    given = {own[k].data_ptr() for k in weights if k in own}
    missing = [k for k in res.missing_keys if own[k].data_ptr() not in given]
    if missing or res.unexpected_keys:
        raise KeyError(
            f"{ckpt}: weights do not fit the model: missing {missing[:5]}, unexpected {res.unexpected_keys[:5]}"
        )


def snapshot_metrics(metrics: Path, ckpt_tmp: Path) -> None:
    """Copy the metrics file, as of this step's commit, into a checkpoint being written."""
    if metrics.is_file():
        shutil.copyfile(metrics, ckpt_tmp / METRICS_COPY)


def restore_metrics(metrics: Path, ckpt: Path, step: int) -> None:
    """Make ``metrics.jsonl`` exactly what it was when `ckpt` was committed
    (its copy; older checkpoints without one: `truncate_jsonl` to `step`)."""
    copy = ckpt / METRICS_COPY
    if copy.is_file():
        atomic_write_text(metrics, copy.read_text())
    else:
        truncate_jsonl(metrics, step)
