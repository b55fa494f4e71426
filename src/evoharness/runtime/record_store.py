"""Where the gateway keeps its `CallRecord`s: one JSONL file per execution.

Layout: ``<dir>/<quoted execution id>.jsonl`` (the id percent-encoded so any
string is a safe file name; ids longer than 150 characters are shortened with
a SHA-1 suffix). Every record also carries its ``execution_id``, so files can
be concatenated. Each record is one line written with a single ``write`` on a
file opened ``O_APPEND``: concurrent appends never interleave, and a crash can
at worst leave a torn last line, which `read` skips. Without a directory the
records live in memory only (tests, throwaway gateways).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from urllib.parse import quote, unquote

from evoharness.rollout.records import CallRecord


def execution_file_name(execution_id: str) -> str:
    q = quote(execution_id, safe="")
    if len(q) > 150:
        q = q[:100] + "~" + hashlib.sha1(execution_id.encode()).hexdigest()
    return q + ".jsonl"


class RecordStore:
    """Append-only `CallRecord` storage, per execution.

    Args:
        directory: where the JSONL files go (created); None keeps records in memory.
        fsync: fsync after every append (durable across power loss; slower).
    """

    def __init__(self, directory: str | Path | None = None, fsync: bool = False):
        self.directory = Path(directory) if directory else None
        if self.directory:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._mem: dict[str, list[dict]] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def append(self, rec: CallRecord) -> None:
        d = rec.to_dict()
        with self._lock:
            self._counts[rec.execution_id] = self._counts.get(rec.execution_id, 0) + 1
            if self.directory is None:
                self._mem.setdefault(rec.execution_id, []).append(d)
                return
            line = (json.dumps(d, separators=(",", ":")) + "\n").encode()
            fd = os.open(self.directory / execution_file_name(rec.execution_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def read(self, execution_id: str, offset: int = 0) -> list[CallRecord]:
        """The execution's records in call-completion order, from index `offset`."""
        if self.directory is None:
            with self._lock:
                rows = list(self._mem.get(execution_id, []))
        else:
            path = self.directory / execution_file_name(execution_id)
            rows = []
            if path.is_file():
                for line in path.read_text().splitlines():
                    try:
                        rows.append(json.loads(line))
                    except ValueError:  # a torn last line after a crash
                        continue
        return [CallRecord.from_dict(r) for r in rows[offset:]]

    def executions(self) -> dict[str, int]:
        """Execution id -> number of records (this process's appends plus files found on disk)."""
        with self._lock:
            out = dict(self._counts)
        if self.directory is not None:
            for f in self.directory.glob("*.jsonl"):
                eid = unquote(f.name[:-len(".jsonl")])
                if eid not in out and "~" not in f.name:
                    out[eid] = sum(1 for _ in f.open())
        return out
