"""How a transport's cells hand each other tensors: the `Exchange` interface and its file version.

Cells leave tensors for other cells under a key (the core's published weights ``v<version>``, a
satellite's gradient ``grads/v<version>/mb<n>``), and a reader takes them by key; whoever
consumes a key drops it. The transport chooses the exchange (`runtime.transport.Transport.exchange`):

- `FileExchange`: safetensors files under a directory every cell can read (the in-process and the
  local transports: one machine);
- `runtime.ray_exchange.RayExchange`: Ray's object store (the Ray transport: nodes that share no
  filesystem).

The exchange also says where a cell reads a checkpoint directory of the driver's machine from
(`local_dir`) and the host a rendezvous of the cells' trainer ranks binds to (`host`), the two
other things that differ between one machine and a cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import torch

SUFFIX = ".safetensors"


class Exchange(Protocol):
    """Where cells leave tensors for each other, by key (module docstring). Picklable: it travels
    to every cell with its worker factory."""

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        """Store `tensors` (CPU or CUDA; copied to CPU) under `key` (``/``-separated words), replacing
        what was there; readable by every cell once this returns."""
        ...

    def get(self, key: str) -> dict[str, torch.Tensor]:
        """The tensors stored under `key`, on the CPU, owned by the caller (writable).

        Raises:
            KeyError: nothing stored under `key` (never put, or dropped).
        """
        ...

    def keys(self) -> list[str]:
        """Every key stored now."""
        ...

    def drop(self, keys: list[str]) -> None:
        """Forget `keys` (a missing one is ignored)."""
        ...

    def host(self) -> str:
        """The address the other cells reach this process at (a TCP rendezvous binds it)."""
        ...

    def local_dir(self, path: str) -> str:
        """A directory of the driver's machine (a checkpoint to start from) as this cell reads it:
        `path` itself where the cell shares the driver's filesystem, else a local copy."""
        ...

    def close(self) -> None:
        """Remove what `local_dir` copied (the cell is stopping)."""
        ...


class FileExchange:
    """An `Exchange` of safetensors files ``<root>/<key>.safetensors`` (written atomically), for
    cells on one machine (or a shared mount).

    Args:
        root: the directory.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        """The file of `key`."""
        return self.root / f"{key}{SUFFIX}"

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")  # a reader never sees a torn file
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
        os.replace(tmp, path)

    def get(self, key: str) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        path = self.path(key)
        if not path.is_file():
            raise KeyError(f"no tensors under {key!r} ({path} does not exist)")
        return load_file(str(path))

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root))[: -len(SUFFIX)]
            for p in self.root.rglob(f"*{SUFFIX}")
            if not p.name.startswith(".tmp-")
        )

    def drop(self, keys: list[str]) -> None:
        for key in keys:
            path = self.path(key)
            path.unlink(missing_ok=True)
            for parent in path.parents:  # the empty directories a key made (grads/v3/), not the root
                if parent == self.root or self.root not in parent.parents:
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break  # not empty

    def host(self) -> str:
        return "127.0.0.1"

    def local_dir(self, path: str) -> str:
        return path

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"FileExchange({str(self.root)!r})"


def unique_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` less the aliases of a tensor already in it (tied weights: the LM head that is the
    embedding), first name kept: safetensors refuses tensors that share memory, and an alias need
    not travel twice."""
    seen: set[tuple[Any, ...]] = set()
    out = {}
    for name, t in state.items():
        ident = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if ident not in seen:
            seen.add(ident)
            out[name] = t
    return out
