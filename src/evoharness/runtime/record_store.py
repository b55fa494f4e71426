"""Where the gateway keeps its `CallRecord`s: one JSONL file per execution.

Layout: ``<dir>/<quoted execution id>.jsonl`` (the id percent-encoded so any
string is a safe file name, ``~`` included; ids longer than 150 characters are
shortened to ``<first 100 quoted characters>~<SHA-256 of the id>``: only those
names hold a ``~``, so no execution id can name another's file). Every record
also carries its ``execution_id``, and reads keep only the records of the
execution asked for, so files can be concatenated and a shared file (a
shortened name's hash collision) still reads right. Each record is one line written with a single ``write`` on a
file opened ``O_APPEND``: concurrent appends never interleave, and a crash can
at worst leave a torn last line, which `read` skips (and the next store to
append to the file ends it first). Without a directory the
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
    """The file name of `execution_id`'s records: injective, safe for any string.

    Raises:
        ValueError: the id is not valid Unicode (a lone surrogate).
    """
    try:
        raw = execution_id.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"execution id is not valid Unicode ({e.reason})") from None
    q = quote(raw, safe="").replace("~", "%7E")  # `quote` never escapes "~": the shortened names' mark
    if len(q) > 150:
        q = q[:100] + "~" + hashlib.sha256(raw).hexdigest()
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
        self._opened: set[str] = set()  # files this store has checked for a torn last line

    def append(self, rec: CallRecord) -> None:
        d = rec.to_dict()
        with self._lock:
            self._counts[rec.execution_id] = self._counts.get(rec.execution_id, 0) + 1
            if self.directory is None:
                self._mem.setdefault(rec.execution_id, []).append(d)
                return
            line = (json.dumps(d, separators=(",", ":")) + "\n").encode()
            name = execution_file_name(rec.execution_id)
            fd = os.open(self.directory / name, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if name not in self._opened:  # after a crash: end the torn line, or this record would join it
                    self._opened.add(name)
                    size = os.fstat(fd).st_size
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        line = b"\n" + line
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
                        row = json.loads(line)
                    except ValueError:  # a torn last line after a crash
                        continue
                    if isinstance(row, dict) and row.get("execution_id") == execution_id:
                        rows.append(row)
        return [CallRecord.from_dict(r) for r in rows[offset:]]

    def executions(self) -> dict[str, int]:
        """Execution id -> number of records (on disk: every file there, earlier runs' appends included)."""
        if self.directory is None:
            with self._lock:
                return dict(self._counts)
        out: dict[str, int] = {}
        for f in self.directory.glob("*.jsonl"):
            eid = unquote(f.name[: -len(".jsonl")]) if "~" not in f.name else _first_execution_id(f)
            if eid is not None:  # its lines that parse: a torn line after a crash is no record
                out[eid] = sum(1 for line in f.open() if _execution_of(line) == eid)
        return out


def _execution_of(line: str) -> str | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("execution_id") if isinstance(row, dict) else None


def _first_execution_id(path: Path) -> str | None:
    """The execution id inside a file whose name was shortened (ids over 150 characters)."""
    with path.open() as fh:
        try:
            return json.loads(fh.readline())["execution_id"]
        except (ValueError, KeyError, TypeError):
            return None
