"""Where a group of trainer ranks meets: a ``tcp://`` address on the core's host.

``torch.distributed.init_process_group(init_method="tcp://host:port")`` makes rank 0 serve the
group's key-value store on that port and the other ranks connect to it: no shared filesystem (a
``file://`` rendezvous needs one). The core (rank 0) picks the port on its own host, where it
knows what is free; the exchange says which of its addresses the other cells reach
(`runtime.exchange.Exchange.host`).
"""

from __future__ import annotations

import socket


def free_tcp_address(host: str) -> str:
    """``tcp://host:port`` with a port free on `host` now (the OS picks it; rank 0 binds it again
    when the group forms, a moment later, as `torch.distributed.run` picks its ports).

    Raises:
        OSError: `host` is not an address of this machine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return f"tcp://[{host}]:{port}" if family == socket.AF_INET6 else f"tcp://{host}:{port}"
