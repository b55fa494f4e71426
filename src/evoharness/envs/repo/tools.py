"""The agent's tools, as OpenAI function-calling schemas, executed against one workspace.

``run_shell`` runs in the sandbox (`sandbox.Sandbox`); the file tools run on the
host but only on paths whose real path (symlinks resolved) lies inside the
workspace, so a symlink the agent planted cannot lead them out. Between two tool
calls nothing of the agent's runs (every sandbox is torn down when its command
ends), so a path checked is the path used.

Every result is text shown to the agent, cut to ``output_chars`` with a visible
``[... N characters truncated ...]`` marker. Bad arguments (not JSON, missing or
mistyped fields, unknown tool, a path outside the workspace) come back as an
error result the agent sees; `ToolBox.call` never raises for them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evoharness.envs.repo.sandbox import WORKSPACE, Sandbox, SandboxError, dir_usage, truncate_middle

MAX_WRITE_BYTES = 1 << 20


def shown_name(name: str) -> str:
    """A file name as text for the model: bytes that are not UTF-8 (kept by the OS as
    lone surrogates) become U+FFFD, which every JSON encoder and HTTP body can carry."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunShell(_Args):
    """Run a bash command in the workspace (cwd /workspace, no network; each call is a fresh shell:
    `cd` and background processes do not persist). Returns the exit code and the combined output."""

    command: str = Field(description="The bash command line.")
    timeout_s: int | None = Field(None, ge=1, description="Seconds before the command is killed (capped).")


class ReadFile(_Args):
    """Read a text file of the workspace, with line numbers."""

    path: str = Field(description="Path relative to the workspace root.")
    offset: int = Field(1, ge=1, description="First line to show (1-based).")
    limit: int = Field(400, ge=1, le=5000, description="Lines to show at most.")


class WriteFile(_Args):
    """Create or overwrite a file (parent directories are created)."""

    path: str = Field(description="Path relative to the workspace root.")
    content: str = Field(description="The whole new content of the file.")


class EditFile(_Args):
    """Replace one exact occurrence of `old_str` with `new_str` in a file."""

    path: str = Field(description="Path relative to the workspace root.")
    old_str: str = Field(min_length=1, description="Exact text to replace; must occur exactly once.")
    new_str: str = Field(description="Replacement text.")


class ListDir(_Args):
    """List a directory of the workspace (directories end with /, links show their target)."""

    path: str = Field(".", description="Path relative to the workspace root.")
    depth: int = Field(2, ge=1, le=5, description="Levels to descend.")


class Finish(_Args):
    """Declare the work done; the workspace is then scored. Nothing can be changed afterwards."""

    summary: str = Field("", description="One paragraph on what was built.")


TOOLS: dict[str, type[_Args]] = {
    "run_shell": RunShell,
    "read_file": ReadFile,
    "write_file": WriteFile,
    "edit_file": EditFile,
    "list_dir": ListDir,
    "finish": Finish,
}


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def tool_schemas() -> list[dict[str, Any]]:
    """The tools in the OpenAI ``tools`` format (``{"type": "function", "function": {...}}``)."""
    out = []
    for name, model in TOOLS.items():
        params = _strip_titles(model.model_json_schema())
        out.append(
            {
                "type": "function",
                "function": {"name": name, "description": " ".join(model.__doc__.split()), "parameters": params},
            }
        )
    return out


@dataclass
class ToolResult:
    """What one tool call returned.

    Attributes:
        name: the tool called (as the agent spelled it).
        content: text for the agent (already truncated).
        is_error: the call was rejected or failed (bad arguments, path outside, ...).
        finished: the agent called ``finish``.
        seconds: wall time of the call.
        exit_code: ``run_shell`` only.
    """

    name: str
    content: str
    is_error: bool = False
    finished: bool = False
    seconds: float = 0.0
    exit_code: int | None = None


class ToolError(Exception):
    """A tool call the agent got wrong; the message is shown to it."""


class ToolBox:
    """Executes tool calls against `sandbox`'s workspace.

    Args:
        sandbox: confines ``run_shell``; its workspace is the file tools' root.
        output_chars: characters of a result shown at most.
        max_shell_s: cap on ``run_shell``'s wall time (default: the sandbox's limit).
    """

    def __init__(self, sandbox: Sandbox, output_chars: int = 8000, max_shell_s: float | None = None) -> None:
        self.sandbox = sandbox
        self.root = Path(os.path.realpath(sandbox.workspace))
        self.output_chars = output_chars
        self.max_shell_s = max_shell_s or sandbox.limits.wall_s

    def call(self, name: str, arguments: str | dict[str, Any] | None) -> ToolResult:
        """Run one tool call; bad input becomes an error result, never an exception."""
        t0 = time.monotonic()
        try:
            if name not in TOOLS:
                raise ToolError(f"unknown tool {name!r}; available: {', '.join(TOOLS)}")
            args = self._parse(name, arguments)
            res = getattr(self, f"_{name}")(args)
        except ToolError as e:
            res = ToolResult(name, f"error: {e}", is_error=True)
        except SandboxError:
            raise  # the harness's fault: the episode records it, the agent is not blamed
        except OSError as e:
            res = ToolResult(name, f"error: {e.strerror or e}", is_error=True)
        res.name = name
        res.content = truncate_middle(res.content, self.output_chars)
        res.seconds = round(time.monotonic() - t0, 4)
        return res

    @staticmethod
    def _parse(name: str, arguments: str | dict[str, Any] | None) -> _Args:
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as e:
                raise ToolError(f"arguments of {name} are not valid JSON ({e.msg} at char {e.pos})") from None
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments of {name} must be a JSON object")
        try:
            args = TOOLS[name].model_validate(arguments)
        except ValidationError as e:
            msgs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(root)'}: {err['msg']}" for err in e.errors())
            raise ToolError(f"bad arguments for {name}: {msgs}") from None
        for key, value in args:  # JSON may carry lone surrogates ("\ud800"): no file, path or argv can hold them
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ToolError(
                        f"bad arguments for {name}: {key}: not valid Unicode ({e.reason} at character {e.start})"
                    ) from None
        return args

    def resolve(self, path: str) -> Path:
        """Host path of a workspace path; symlinks resolved, must stay inside.

        Raises:
            ToolError: empty path, or one that leads outside the workspace.
        """
        if not path or "\x00" in path:
            raise ToolError("path is empty or invalid")
        rel = path[len(WORKSPACE) :].lstrip("/") if path == WORKSPACE or path.startswith(WORKSPACE + "/") else path
        if os.path.isabs(rel):
            raise ToolError(f"{path}: absolute paths must be under {WORKSPACE}")
        real = os.path.realpath(self.root / rel)
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise ToolError(f"{path}: leads outside the workspace")
        return Path(real)

    # ---- the tools ------------------------------------------------------------------

    def _run_shell(self, a: RunShell) -> ToolResult:
        wall = min(float(a.timeout_s or self.max_shell_s), self.max_shell_s)
        r = self.sandbox.run(a.command, wall_s=wall)
        note = {
            "wall_time": f"[killed: wall-time limit of {wall:g} s]",
            "memory": "[killed: memory limit]",
            "disk": "[killed: workspace disk limit]",
            "files": "[killed: too many files in the workspace]",
        }.get(r.killed or "", "")
        text = f"exit code: {r.exit_code}\n{note + chr(10) if note else ''}{r.output}"
        return ToolResult("run_shell", text, is_error=False, exit_code=r.exit_code)

    def _read_file(self, a: ReadFile) -> ToolResult:
        p = self.resolve(a.path)
        if not p.exists():
            raise ToolError(f"{a.path}: no such file")
        if not p.is_file():
            raise ToolError(f"{a.path}: not a regular file")
        with open(p, "rb") as f:
            data = f.read(4 * MAX_WRITE_BYTES)
        lines = data.decode("utf-8", "replace").splitlines()
        chunk = lines[a.offset - 1 : a.offset - 1 + a.limit]
        body = "\n".join(f"{i:6d}\t{ln}" for i, ln in enumerate(chunk, a.offset))
        more = len(lines) - (a.offset - 1 + len(chunk))
        if more > 0:
            body += f"\n[... {more} more lines; read with offset={a.offset + len(chunk)} ...]"
        return ToolResult("read_file", body or "(empty file)")

    def _write_file(self, a: WriteFile) -> ToolResult:
        data = a.content.encode()
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content is {len(data)} bytes; at most {MAX_WRITE_BYTES} per write")
        p = self.resolve(a.path)
        if p == self.root or p.is_dir():
            raise ToolError(f"{a.path}: is a directory")
        if p.exists() and not p.is_file():  # a FIFO the agent made would block the host's open() forever
            raise ToolError(f"{a.path}: not a regular file")
        self._check_room(p, len(data))
        self._mkdirs(p.parent)
        p.write_bytes(data)
        self.sandbox.own_tree(p)
        return ToolResult("write_file", f"wrote {len(data)} bytes to {p.relative_to(self.root)}")

    def _edit_file(self, a: EditFile) -> ToolResult:
        p = self.resolve(a.path)
        if not p.is_file():
            raise ToolError(f"{a.path}: {'not a regular file' if p.exists() else 'no such file'}")
        text = p.read_text(errors="replace")
        n = text.count(a.old_str)
        if n != 1:
            raise ToolError(
                f"old_str occurs {n} times in {a.path}; it must occur exactly once"
                + (" (add surrounding lines to make it unique)" if n else "")
            )
        new = text.replace(a.old_str, a.new_str, 1)
        if len(new.encode()) > 4 * MAX_WRITE_BYTES:
            raise ToolError("the edited file would be too large")
        self._check_room(p, len(new.encode()))
        p.write_text(new)
        line = text[: text.index(a.old_str)].count("\n") + 1
        return ToolResult("edit_file", f"edited {p.relative_to(self.root)} at line {line}")

    def _list_dir(self, a: ListDir) -> ToolResult:
        p = self.resolve(a.path)
        if not p.is_dir():
            raise ToolError(f"{a.path}: not a directory")
        lines: list[str] = []

        def walk(d: Path, depth: int, indent: str) -> None:
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError as e:
                lines.append(f"{indent}[unreadable: {e.strerror}]")
                return
            for e in entries:
                if len(lines) >= 500:
                    return
                name = shown_name(e.name)
                if e.is_symlink():
                    lines.append(f"{indent}{name} -> {shown_name(os.readlink(e.path))}")
                elif e.is_dir():
                    lines.append(f"{indent}{name}/")
                    if depth > 1 and e.name != "__pycache__":
                        walk(Path(e.path), depth - 1, indent + "  ")
                else:
                    lines.append(f"{indent}{name}  ({e.stat(follow_symlinks=False).st_size} B)")

        walk(p, a.depth, "")
        if len(lines) >= 500:
            lines.append("[... listing truncated at 500 entries ...]")
        return ToolResult("list_dir", "\n".join(lines) or "(empty directory)")

    def _finish(self, a: Finish) -> ToolResult:
        return ToolResult("finish", "finished; the workspace will now be scored", finished=True)

    def _check_room(self, p: Path, size: int) -> None:
        """The host writes too: `p` becoming `size` bytes must keep the workspace within the
        sandbox's disk and entry bounds, as a command must."""
        lim = self.sandbox.limits
        used, n = dir_usage(self.root, stop_bytes=lim.disk_mb << 20, stop_entries=lim.max_files)
        grows = size - (p.stat().st_size if p.exists() else 0)
        if grows > 0 and used + grows > lim.disk_mb << 20:
            raise ToolError(f"the workspace would pass its disk limit of {lim.disk_mb} MiB; delete files first")
        new_entries = sum(1 for q in (p, *p.parents) if q.is_relative_to(self.root) and not q.exists())
        if new_entries and n + new_entries > lim.max_files:
            raise ToolError(f"the workspace would pass its limit of {lim.max_files} entries; delete files first")

    def _mkdirs(self, d: Path) -> None:
        missing = []
        while not d.exists():
            missing.append(d)
            d = d.parent
        if not d.is_dir():
            raise ToolError(f"{d.relative_to(self.root)}: not a directory")
        for m in reversed(missing):
            m.mkdir()
            self.sandbox.own_tree(m)
