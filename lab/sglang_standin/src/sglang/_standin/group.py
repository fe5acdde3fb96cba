"""A multi-node launch of the stand-in: the nodes find each other before loading.

Real SGLang with ``--nnodes N --node-rank R --dist-init-addr HOST:PORT`` starts
torch.distributed with node 0's address as the rendezvous: every node blocks in
"Init torch distributed begin." until all N have joined, and node 0 alone then serves
HTTP (fleet.md section 9). The stand-in keeps that shape with a plain TCP rendezvous on
the same address (COMPOSED: not NCCL's or Gloo's protocol): node 0 listens on
``--dist-init-addr`` and waits for N - 1 peers, each of which connects (retrying while
node 0 is not up yet) and says its rank. Afterwards a node whose peer goes away dies the
way a real rank does when NCCL loses a peer, so systemd restarts it and the group forms
again.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from sglang._standin import logs


def _address(dist_init_addr: str) -> tuple[str, int]:
    host, _, port = dist_init_addr.rpartition(":")
    return host.strip("[]"), int(port)


def join(nnodes: int, rank: int, dist_init_addr: str, on_lost: Callable[[str], None],
         timeout: float = 3600.0) -> list[socket.socket]:
    """Block until the group of ``nnodes`` has formed; return this node's peer sockets.
    ``on_lost`` is called (from a watcher thread) when a peer's connection ends."""
    host, port = _address(dist_init_addr)
    logs.log("Init torch distributed begin.", rank="TP0")
    logs.log(f"multi-node: node {rank} of {nnodes}, rendezvous at {host}:{port}")
    if rank == 0:
        peers = _gather(host, port, nnodes - 1, timeout)
    else:
        peers = [_connect(host, port, rank, timeout)]
    logs.log(f"multi-node: all {nnodes} nodes joined")
    logs.log("Init torch distributed ends. mem usage=0.00 GB", rank="TP0")
    for peer in peers:
        threading.Thread(target=_watch, args=(peer, on_lost), daemon=True).start()
    return peers


def _gather(host: str, port: int, expect: int, timeout: float) -> list[socket.socket]:
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(expect)
    server.settimeout(timeout)
    peers = []
    while len(peers) < expect:
        conn, addr = server.accept()
        hello = conn.recv(64).decode(errors="replace").strip()
        logs.log(f"multi-node: {hello} joined from {addr[0]}")
        peers.append(conn)
    server.close()
    return peers


def _connect(host: str, port: int, rank: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            conn.sendall(f"node {rank}\n".encode())
            conn.settimeout(None)
            return conn
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _watch(peer: socket.socket, on_lost: Callable[[str], None]) -> None:
    try:
        while peer.recv(64):
            pass
    except OSError:
        pass
    on_lost("a peer node's connection ended")
