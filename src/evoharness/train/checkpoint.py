"""Atomic files and directories, RNG state, resumable JSONL metrics: what every trainer checkpoints with.

A checkpoint directory is written to a temporary sibling, fsynced, then
swapped in with `os.replace`, so a crash leaves either the old or the new
checkpoint, never a torn one. ``checkpoints/latest`` names the newest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")) + [path]:
        _fsync(p)


def atomic_dir(final: Path, write: Callable[[Path], None]) -> Path:
    """Write a directory atomically: `write(tmp)`, fsync, `os.replace` onto `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    _fsync_tree(tmp)
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync(final.parent)
    return final


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The directory ``checkpoints/latest`` names, or None."""
    ptr = Path(out_dir) / "checkpoints" / "latest"
    if not ptr.is_file():
        return None
    path = ptr.parent / ptr.read_text().strip()
    return path if (path / "state.json").is_file() else None


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop metric records logged after the checkpoint's step."""
    if path.is_file():
        keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
        atomic_write_text(path, "".join(ln + "\n" for ln in keep))


