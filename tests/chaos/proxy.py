"""A fault-injecting TCP proxy on loopback, in its own process, in front of every gRPC and etcd
address of a chaos cluster.

Every service advertises the proxy's port instead of its own (storage nodes, controllers and
coordinators take ``--advertise``; etcd members advertise their client and peer URLs), so all
traffic between processes, and from clients, goes through here. The proxy knows *who* is on
each end of a connection: the listening side by the port it accepted on, the dialling side
by looking the client socket up in ``/proc/net/tcp`` and the ``/proc/<pid>/fd`` links of the
processes it was told about. That makes per-pair faults possible on one loopback interface:

- ``stall`` from A to B: bytes A sends to B are no longer read (they wait in the kernel, as
  in a partition where TCP keeps retransmitting); both directions = a partition, one
  direction = a one-way partition. Healing lets the stream continue exactly where it was.
- ``delay`` from A to B: every chunk A sends to B waits ``ms`` before it is written.
- ``reset``: close every matching connection now with an RST (SO_LINGER 0), mid-stream.
- ``stick`` from A to B: the connections A has open to B now go silent both ways, while new
  ones flow (a flow whose state a middlebox lost, or a stream whose retransmissions backed
  off long after a partition healed); ``unstick`` lets them go on where they were.

Control is JSON lines on stdin, one answer line per command on stdout (see ``Proxy.command``):
``{"cmd": "listen", "name": "node-1", "upstream": 31001, "port": 31101}``,
``{"cmd": "pid", "pid": 1234, "name": "node-1"}``,
``{"cmd": "rules", "rules": [{"kind": "stall", "from": ["node-1"], "to": ["etcd-*"]}]}``,
``{"cmd": "reset", "from": ["*"], "to": ["node-2"]}``,
``{"cmd": "stick", "from": ["node-1"], "to": ["controller-*"]}``, ``{"cmd": "unstick"}``,
``{"cmd": "stats"}``.
Names in rules are shell-style patterns (``node-*``); a dialler the proxy cannot identify is
called ``client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNKNOWN = "client"
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Rule:
    """One fault between senders matching ``src`` and receivers matching ``dst``."""

    kind: str  # "stall" | "delay"
    src: tuple[str, ...]
    dst: tuple[str, ...]
    ms: int = 0

    def matches(self, sender: str, receiver: str) -> bool:
        return any(fnmatch.fnmatchcase(sender, p) for p in self.src) and any(
            fnmatch.fnmatchcase(receiver, p) for p in self.dst
        )


@dataclass(eq=False)
class Conn:
    """One proxied connection: the dialler ``client`` and the listener ``server``."""

    client: str
    server: str
    sockets: list[socket.socket] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False
    #: Silent both ways until ``unstick`` (the ``stick`` command).
    stuck: bool = False


def _hex_port(port: int) -> str:
    return f"{port:04X}"


def socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the loopback socket bound to ``local_port`` connected to ``remote_port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        lp, rp = ":" + _hex_port(local_port), ":" + _hex_port(remote_port)
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[1].endswith(lp) and parts[2].endswith(rp):
                return int(parts[9])
    return None


def owner_of(inode: int, pids: dict[int, str]) -> str | None:
    """The name of the registered process holding socket ``inode``."""
    target = f"socket:[{inode}]"
    for pid, name in list(pids.items()):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    return name
    return None


class Proxy:
    """All listeners, the rules and the live connections (one asyncio loop)."""

    def __init__(self) -> None:
        self.pids: dict[int, str] = {}
        self.rules: list[Rule] = []
        self.changed = asyncio.Condition()
        self.conns: set[Conn] = set()
        self.servers: dict[str, asyncio.Server] = {}
        self.upstreams: dict[str, int] = {}
        self.stats = {"accepted": 0, "resets": 0, "stalled_waits": 0, "unidentified": 0}

    # -- control ---------------------------------------------------------------------------

    async def command(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "listen":
            name, upstream, port = msg["name"], int(msg["upstream"]), int(msg.get("port", 0))
            self.upstreams[name] = upstream
            server = await asyncio.start_server(
                lambda r, w, n=name: self._accept(n, r, w), "127.0.0.1", port, reuse_address=True
            )
            self.servers[name] = server
            return {"ok": True, "port": server.sockets[0].getsockname()[1]}
        if cmd == "pid":
            self.pids[int(msg["pid"])] = str(msg["name"])
            return {"ok": True}
        if cmd == "forget":
            self.pids.pop(int(msg["pid"]), None)
            return {"ok": True}
        if cmd == "rules":
            rules = [
                Rule(
                    r["kind"],
                    tuple(r["from"]),
                    tuple(r["to"]),
                    int(r.get("ms", 0)),
                )
                for r in msg["rules"]
            ]
            async with self.changed:
                self.rules = rules
                self.changed.notify_all()
            return {"ok": True, "rules": len(rules)}
        if cmd == "reset":
            src, dst = tuple(msg.get("from", ["*"])), tuple(msg.get("to", ["*"]))
            probe = Rule("reset", src, dst)
            n = 0
            for c in list(self.conns):
                if probe.matches(c.client, c.server) or probe.matches(c.server, c.client):
                    self._reset(c)
                    n += 1
            self.stats["resets"] += n
            return {"ok": True, "reset": n}
        if cmd == "stick":
            probe = Rule("stick", tuple(msg.get("from", ["*"])), tuple(msg.get("to", ["*"])))
            stuck = [c for c in self.conns if probe.matches(c.client, c.server)]
            for c in stuck:
                c.stuck = True
            return {"ok": True, "stuck": len(stuck)}
        if cmd == "unstick":
            async with self.changed:
                for c in self.conns:
                    c.stuck = False
                self.changed.notify_all()
            return {"ok": True}
        if cmd == "stats":
            return {"ok": True, **self.stats, "connections": len(self.conns)}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    # -- connections -------------------------------------------------------------------------

    async def _identify(self, writer: asyncio.StreamWriter) -> str:
        peer = writer.get_extra_info("peername")
        local = writer.get_extra_info("sockname")
        pids = dict(self.pids)

        def lookup() -> str | None:
            inode = socket_inode(peer[1], local[1])
            return None if inode is None else owner_of(inode, pids)

        name = await asyncio.get_running_loop().run_in_executor(None, lookup)
        if name is None:
            self.stats["unidentified"] += 1
        return name or UNKNOWN

    async def _accept(
        self, server: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.stats["accepted"] += 1
        try:
            await self._serve(server, reader, writer)
        except (asyncio.CancelledError, Exception):
            self._rst(writer)

    async def _serve(
        self, server: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        client = await self._identify(writer)
        conn = Conn(client, server, sockets=[writer.get_extra_info("socket")])
        try:
            up_reader, up_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstreams[server]
            )
        except OSError:
            self._rst(writer)
            return
        conn.sockets.append(up_writer.get_extra_info("socket"))
        self.conns.add(conn)
        conn.tasks = [
            asyncio.create_task(self._pump(conn, reader, up_writer, client, server)),
            asyncio.create_task(self._pump(conn, up_reader, writer, server, client)),
        ]
        conn._writers = (writer, up_writer)  # type: ignore[attr-defined]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        self.conns.discard(conn)
        for w in (writer, up_writer):
            with contextlib.suppress(Exception):
                w.close()

    def _stalled(self, sender: str, receiver: str) -> bool:
        return any(r.kind == "stall" and r.matches(sender, receiver) for r in self.rules)

    def _delay_ms(self, sender: str, receiver: str) -> int:
        return max(
            (r.ms for r in self.rules if r.kind == "delay" and r.matches(sender, receiver)),
            default=0,
        )

    async def _wait_flowing(self, conn: Conn, sender: str, receiver: str) -> None:
        if not conn.stuck and not self._stalled(sender, receiver):
            return
        self.stats["stalled_waits"] += 1
        async with self.changed:
            await self.changed.wait_for(
                lambda: conn.closed or not (conn.stuck or self._stalled(sender, receiver))
            )

    async def _pump(
        self,
        conn: Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sender: str,
        receiver: str,
    ) -> None:
        try:
            while not conn.closed:
                await self._wait_flowing(conn, sender, receiver)
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._wait_flowing(conn, sender, receiver)  # a stall that came meanwhile
                delay = self._delay_ms(sender, receiver)
                if delay:
                    # time is the behaviour: the injected network delay (a "delay" rule).
                    await asyncio.sleep(delay / 1000.0)
                if conn.closed:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    writer.write_eof()

    def _reset(self, conn: Conn) -> None:
        conn.closed = True
        for s in conn.sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in conn.tasks:
            t.cancel()
        for w in getattr(conn, "_writers", ()):
            with contextlib.suppress(Exception):
                w.transport.abort()

        async def wake() -> None:
            async with self.changed:
                self.changed.notify_all()

        asyncio.get_running_loop().create_task(wake())

    @staticmethod
    def _rst(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


async def _main() -> None:
    proxy = Proxy()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout
    while True:
        line = await reader.readline()
        if not line:
            return  # the controlling process is gone: so are we
        try:
            answer = await proxy.command(json.loads(line))
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answer["t"] = time.time()
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    asyncio.run(_main())
