"""The launcher's half of the rendezvous (``engine.train.rendezvous`` is the ranks' half): the port
a run's ranks meet on, the interface they talk over and the store they meet at, chosen before any
rank starts, and ``LaunchError``, the one sentence a launcher says of bad input before it starts
anything (a port in use among it). Plain Python: no torch.

One node: a file store in the run directory and gloo and NCCL pinned to loopback, so nothing of
the run listens beyond 127.0.0.1. Several nodes: a TCP store rank 0 serves on the master address
only, on the port every node was given.
"""

from __future__ import annotations

import os
import socket

import psutil

from engine.core.common.run_environment import RENDEZVOUS_ENV
from engine.core.common.run_files import open_private
from engine.core.runs.rundir import RunDir


class LaunchError(Exception):
    """Bad input found before any rank started: one sentence for the user."""


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise LaunchError(
                f"--master-port {port} on {host} is in use or not bindable ({err.strerror}); "
                "pick another port or leave it out to get a free one"
            ) from None


def loopback_interface() -> str:
    """The name of the interface holding 127.0.0.1 ("lo" on Linux, "lo0" on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def rendezvous_environment(
    run_dir: RunDir, nnodes: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """Where the ranks meet and which interface they talk over.

    One node: through a file store in the run directory, and gloo and NCCL pinned to loopback, so
    no process of the run holds a listening socket beyond 127.0.0.1 (torch's TCPStore would
    listen on every interface). Several nodes: through a TCP store that rank 0 serves on
    ``master_addr`` only; gloo and NCCL use the interface their own settings pick.
    """
    if nnodes > 1:
        return {RENDEZVOUS_ENV: f"tcp://{master_addr}:{master_port}"}
    loopback = loopback_interface()
    return {
        RENDEZVOUS_ENV: f"file://{run_dir.rendezvous_path.resolve()}",
        "GLOO_SOCKET_IFNAME": loopback,
        "NCCL_SOCKET_IFNAME": loopback,
    }


def prepare_rendezvous_file(run_dir: RunDir) -> None:
    """An empty file store, private whatever the umask (c10d would make it 0644 minus it)."""
    run_dir.rendezvous_path.unlink(missing_ok=True)
    os.close(open_private(run_dir.rendezvous_path, "exclusive"))


def rendezvous_port(nnodes: int, node_rank: int, master_addr: str, master_port: int | None) -> int:
    """The port the ranks meet on: the one given (checked free on node 0), or a free one on a
    single node; several nodes must name theirs."""
    if master_port is None:
        if nnodes > 1:
            raise LaunchError("--nnodes above 1 needs --master-port (the same on every node)")
        return find_free_port(master_addr)
    if node_rank == 0:
        check_port_free(master_addr, master_port)
    return master_port
