"""An engine worker process: one model directory served over OpenAI-compatible HTTP on loopback.

``python -m evoharness.runtime.worker --model-path DIR --port 0`` runs a gateway
app with a single `LocalBackend` named ``local`` and no records (the parent
gateway records). Once serving it prints ``EVOHARNESS_WORKER_READY <port>`` on
stdout; `backends.WorkerBackend` starts workers and waits for that line. Its
``/v1/models`` card says ``owned_by: evoharness`` so the parent sends
``action_grammar`` natively and syncs weights through
``POST /admin/backends/local/weights``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m evoharness.runtime.worker")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--served-model-name", default="evoharness")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--max-prompt-tokens", type=int, default=None)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--policy-version", type=int, default=0)
    a = ap.parse_args(argv)

    import uvicorn

    from evoharness.runtime.backends import READY, LocalBackend
    from evoharness.runtime.gateway import Gateway, create_app

    if a.num_threads:
        import torch

        torch.set_num_threads(a.num_threads)
    backend = LocalBackend.from_model_path(
        a.model_path,
        a.device,
        a.dtype,
        max_prompt_tokens=a.max_prompt_tokens,
        max_batch=a.max_batch,
        num_threads=a.num_threads,
        policy_version=a.policy_version,
    )
    gw = Gateway([backend], served_model=a.served_model_name, records=False, max_attempts=1, wait_for_backend_s=0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY: see GatewayServer
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((a.host, a.port))
    server = uvicorn.Server(uvicorn.Config(create_app(gw), log_level="warning", timeout_keep_alive=30, backlog=2048))

    async def run() -> None:
        serve = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serve.done():
            await asyncio.sleep(0.02)
        if server.started:
            print(f"{READY} {sock.getsockname()[1]}", flush=True)
        await serve

    asyncio.run(run())
    sys.exit(0 if server.started else 1)


if __name__ == "__main__":
    main()
