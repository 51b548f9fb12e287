"""Where the ranks of a run meet: the c10d store the launcher chose, for engine ranks and for the
user's own script alike.

The launcher names it in ``DDPTUI_RENDEZVOUS``. ``file://PATH`` (one node): a file store in the run
directory, so no process of the run listens on a socket for it. ``tcp://HOST:PORT`` (several
nodes): rank 0 serves a TCP store bound to HOST only (torch's own binds every interface), the
others connect. Unset (a rank started by torchrun): torch's env:// as usual.

A user's script calls ``init_process_group`` with env:// and never names our store; its rank
(``engine.train.script_rank``) routes env:// here with ``route_env_rendezvous`` once the script
imports torch, so a script run listens no wider than an engine run.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from engine.core.common.run_environment import RENDEZVOUS_ENV

if TYPE_CHECKING:  # nothing of torch.distributed is touched while it may still be importing
    StoreTriple = tuple[dist.Store, int, int]


def rendezvous_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store | None:
    """The c10d store the launcher chose (``DDPTUI_RENDEZVOUS``), or None for env:// (torchrun)."""
    url = os.environ.get(RENDEZVOUS_ENV, "")
    if url.startswith("file://"):
        return dist.FileStore(url.removeprefix("file://"), world_size)
    if not url.startswith("tcp://"):
        return None
    host, _, port_text = url.removeprefix("tcp://").rpartition(":")
    port = int(port_text)
    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(address)
    listener.listen(max(128, world_size))
    return dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store owns and closes it
    )


def route_env_rendezvous(rendezvous_module: ModuleType) -> bool:
    """Make ``init_process_group``'s env:// meet at the launcher's store (torch's env:// handler
    still serves a process without ``DDPTUI_RENDEZVOUS``). False when this torch keeps its
    handlers elsewhere: the script then meets as torch does, through a TCP store on MASTER_PORT.

    torch refuses to register a second handler for a scheme, so the table is written directly.
    """
    handlers = getattr(rendezvous_module, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or not callable(handlers.get("env")):
        return False
    handlers["env"] = launcher_store_handler(handlers["env"])
    return True


def launcher_store_handler(
    torch_env_handler: Callable[..., Iterator[StoreTriple]],
) -> Callable[..., Iterator[StoreTriple]]:
    def handler(
        url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any
    ) -> Iterator[StoreTriple]:
        if not os.environ.get(RENDEZVOUS_ENV):
            yield from torch_env_handler(url, timeout=timeout, **kwargs)
            return
        query = parse_qs(urlparse(url).query)
        rank = int(query.get("rank", [os.environ.get("RANK", "0")])[0])
        world_size = int(query.get("world_size", [os.environ.get("WORLD_SIZE", "1")])[0])
        store = rendezvous_store(rank, world_size, timeout)
        assert store is not None  # DDPTUI_RENDEZVOUS is set
        yield store, rank, world_size
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")

    return handler
