"""Files that survive a kill: atomic writes of files and directories, append-only JSONL.

Every writer either replaces a whole file or directory atomically (write a
temporary sibling, fsync, `os.replace`) or appends one JSON record per line and
fsyncs it, so the only damage a kill leaves is a torn last line, which
`read_jsonl` skips with a warning.

Crash tests: `failpoint` SIGKILLs the process at a named point when
``$EVOHARNESS_FAILPOINT`` is ``name:step`` (the idea of etcd's gofail).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAILPOINT_ENV = "EVOHARNESS_FAILPOINT"


def failpoint(name: str, step: int) -> None:
    """SIGKILL this process here if ``$EVOHARNESS_FAILPOINT == f"{name}:{step}"``."""
    if os.environ.get(FAILPOINT_ENV) == f"{name}:{step}":
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


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
    for stale in final.parent.glob(f".tmp-{final.name}-*"):  # left by a killed writer
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
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


def append_jsonl(path: Path, record: dict[str, Any], step: int | None = None) -> None:
    """Append one JSON line and fsync it. With `step` given, the ``torn_metrics``
    failpoint writes half the line and dies (a kill mid-write)."""
    line = json.dumps(record) + "\n"
    with open(path, "a") as f:
        if step is not None and os.environ.get(FAILPOINT_ENV) == f"torn_metrics:{step}":
            f.write(line[: len(line) // 2])
            f.flush()
            os.fsync(f.fileno())
            failpoint("torn_metrics", step)
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the records of steps <= `step` (their ``step`` field; records without one are kept) and drop
    torn lines, atomically: on resume, what was logged after the checkpoint goes with its step."""
    if path.is_file():
        keep = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL file, in order; [] when it does not exist.

    Blank lines are skipped; a line that does not parse (torn by a kill
    mid-write) is skipped with a warning naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for n, ln in enumerate(path.read_text().splitlines(), 1):
        if not ln.strip():
            continue
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            warnings.warn(f"{path}:{n}: dropped a torn line ({ln[:60]!r}...)", stacklevel=2)
    return out
