"""A JSONL trace of real executions for the schedulers' simulator.

One line per model call, in the format `runtime.workload.load_trace` reads
(``evoharness simulate --workload trace.jsonl`` replays it)::

    {"execution": id, "group": task_id, "start": s, "end": s,
     "prompt_tokens": n, "completion_tokens": n, "role": "main"|"summary",
     "tools": [[name, seconds], ...], "tool_s": s}

``start``/``end`` are seconds since the execution began; the simulator takes
the gap to the next call as tool latency, and ``tools``/``tool_s`` say what
filled it (extra keys the loader ignores). Lines are appended and flushed one
at a time, so a killed run leaves a readable trace.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class TraceWriter:
    """Thread-safe appender of model-call lines (no-op when `path` is None)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def model_call(
        self,
        execution: str,
        group: str,
        start: float,
        end: float,
        prompt_tokens: int,
        completion_tokens: int,
        role: str,
        tools: list[tuple[str, float]],
    ) -> dict[str, Any]:
        """Append one model call and return its record.

        Args:
            execution / group: execution id and its group (the task id).
            start / end: seconds since the execution began.
            prompt_tokens / completion_tokens: the call's usage, tokens.
            role: ``main`` or ``summary`` (a compaction call).
            tools: ``(tool name, seconds)`` of the calls this reply requested, in order.
        """
        rec = {
            "execution": execution,
            "group": group,
            "start": round(start, 4),
            "end": round(end, 4),
            "prompt_tokens": int(prompt_tokens),
            "completion_tokens": int(completion_tokens),
            "role": role,
            "tools": [[n, round(s, 4)] for n, s in tools],
            "tool_s": round(sum(s for _, s in tools), 4),
        }
        if self.path is not None:
            with self._lock, open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return rec
