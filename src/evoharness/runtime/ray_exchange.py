"""The Ray transport's `runtime.exchange.Exchange`: tensors through Ray's object store, no shared filesystem.

A keeper actor on the driver's node (no CPU reserved) owns every stored object: a cell ``put``s
by handing the keeper its tensors, which the keeper ``ray.put``s and holds under the key, so a
stored gradient outlives the satellite that computed it (a Ray object dies with the worker that
put it) and a reader on any node pulls it from the driver's node by key. The keeper also reads
the driver's checkpoint directories for cells on other nodes (`RayExchange.local_dir`), one file
per call, so a resumed cell anywhere starts from the checkpoint without a shared mount.

Tensors travel as raw bytes (numpy ``uint8`` views: Ray serialises numpy arrays out of band,
without pickling copies) plus dtype and shape, so any dtype (bfloat16 included) round-trips.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

KEEPER_THREADS = 16  # keeper calls served at once (puts and gets of several cells)


def pack(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...], Any]]:
    """``name -> (dtype name, shape, numpy uint8 bytes)``: what Ray stores without a pickle copy."""
    out = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        out[name] = (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy())
    return out


def unpack(packed: dict[str, tuple[str, tuple[int, ...], Any]]) -> dict[str, torch.Tensor]:
    """`pack`'s tensors, copied out of the (read-only, shared) object store buffers."""
    out = {}
    with warnings.catch_warnings():  # the buffer is read-only; it is copied at once
        warnings.simplefilter("ignore", UserWarning)
        for name, (dtype, shape, data) in packed.items():
            out[name] = torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape).clone()
    return out


class _Keeper:
    """The stored objects' owner, on the driver's node (module docstring)."""

    def __init__(self) -> None:
        self._refs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def put(self, key: str, value: Any) -> None:
        import ray

        ref = ray.put(value)  # owned by this actor: lives until dropped, whoever put it
        with self._lock:
            self._refs[key] = ref

    def ref(self, key: str) -> list | None:
        """``[ObjectRef]`` (in a list, so Ray hands over the reference, not the value), None if absent."""
        with self._lock:
            ref = self._refs.get(key)
        return None if ref is None else [ref]

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._refs)

    def drop(self, keys: list[str]) -> None:
        with self._lock:
            for k in keys:
                self._refs.pop(k, None)

    def list_dir(self, path: str) -> list[str]:
        """The files under `path` (relative paths), on the driver's node.

        Raises:
            FileNotFoundError: no such directory there.
        """
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"{path} is not a directory on the driver's node")
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def read_file(self, path: str) -> bytes:
        return Path(path).read_bytes()


class RayExchange:
    """An `Exchange` through Ray's object store (module docstring). Made in the driver by the Ray
    transport after `ray.init` (`start` places the keeper); pickled into every cell actor.

    Raises:
        RuntimeError: Ray is not initialised in this process.
    """

    def __init__(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            raise RuntimeError("RayExchange needs ray.init() first (the Ray transport calls it)")
        self.driver_node = ray.get_runtime_context().get_node_id()
        self.keeper = (
            ray.remote(_Keeper)
            .options(
                num_cpus=0,
                max_concurrency=KEEPER_THREADS,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self.driver_node, soft=False),
            )
            .remote()
        )
        self._copies: list[str] = []  # local_dir's copies in this process

    def __getstate__(self) -> dict[str, Any]:
        return {"driver_node": self.driver_node, "keeper": self.keeper}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.driver_node, self.keeper, self._copies = st["driver_node"], st["keeper"], []

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        import ray

        ray.get(self.keeper.put.remote(key, pack(tensors)))  # stored once this returns

    def get(self, key: str) -> dict[str, torch.Tensor]:
        import ray

        ref = ray.get(self.keeper.ref.remote(key))
        if ref is None:
            raise KeyError(f"no tensors under {key!r} in the Ray object store")
        return unpack(ray.get(ref[0]))

    def keys(self) -> list[str]:
        import ray

        return ray.get(self.keeper.keys.remote())

    def drop(self, keys: list[str]) -> None:
        import ray

        if keys:
            ray.get(self.keeper.drop.remote(list(keys)))

    def host(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def local_dir(self, path: str) -> str:
        """`path` on the driver's node; elsewhere a copy in a temporary directory of this node,
        fetched file by file through the keeper (removed by `close`)."""
        import ray

        if ray.get_runtime_context().get_node_id() == self.driver_node:
            return path
        copy = tempfile.mkdtemp(prefix="evoharness-init-")
        self._copies.append(copy)
        for rel in ray.get(self.keeper.list_dir.remote(path)):
            dest = Path(copy, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(ray.get(self.keeper.read_file.remote(os.path.join(path, rel))))
        return copy

    def close(self) -> None:
        for copy in self._copies:
            shutil.rmtree(copy, ignore_errors=True)
        self._copies = []

    def shutdown(self) -> None:
        """Kill the keeper (the driver's transport closes): every stored object goes with it."""
        import ray

        ray.kill(self.keeper, no_restart=True)
