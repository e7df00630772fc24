"""The few reads of Redis that ``fleet status`` makes, over Redis's own protocol (RESP2) on a plain socket.

Reading a broker's queues through kombu imports Celery, kombu and redis-py (which imports OpenTelemetry when it is
installed): about 0.2 s of CPU, most of a status command on a small database. These reads need four commands, so
this module speaks them itself. ``rediss://`` (TLS) URLs are left to kombu: :func:`connect` returns None for them.
``tests/integration/test_queues.py`` holds these counts to kombu's on the same broker.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

TIMEOUT = 5.0
"""Seconds to connect and for each reply, as the kombu path waits."""


class RespError(Exception):
    """Redis answered with an error, or not as the protocol says."""


class Connection:
    """One connection to Redis, for commands answered one at a time.

    Parameters
    ----------
    sock:
        A connected socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.replies: BinaryIO = sock.makefile("rb")

    def close(self) -> None:
        self.replies.close()
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def command(self, *args: str | bytes | int) -> Any:
        """Send one command; its reply: bytes, an int, None, or a list of them."""
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self.sock.sendall(b"".join(parts))
        return self._reply()

    def _reply(self) -> Any:
        line = self.replies.readline()
        if not line.endswith(b"\r\n"):
            raise RespError("the connection closed mid-reply")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self.replies.read(size + 2)
            if len(data) != size + 2:
                raise RespError("the connection closed mid-reply")
            return data[:-2]
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise RespError(f"not a Redis reply: {line[:40]!r}")

    def scan(self, match: str, kind: str | None = None) -> Iterator[bytes]:
        """Every key that ``match`` matches (of type ``kind`` only, where given), as SCAN walks them."""
        cursor = b"0"
        while True:
            args: list[str | bytes | int] = ["SCAN", cursor, "MATCH", match, "COUNT", 1000]
            if kind:
                args += ["TYPE", kind]
            cursor, keys = self.command(*args)
            yield from keys
            if cursor == b"0":
                return


def connect(url: str) -> Connection | None:
    """A connection to the Redis of ``url`` (``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` or
    ``redis+socket:///PATH[?virtual_host=DB]``), authenticated and on its database; None for a URL this module
    leaves to kombu (TLS).

    Raises OSError or :class:`RespError` where Redis cannot be reached or refuses.
    """
    parts = urlsplit(url)
    if parts.scheme == "redis+socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(unquote(parts.path))
        except OSError:
            sock.close()
            raise
        db = (parse_qs(parts.query).get("virtual_host") or ["0"])[0]
    elif parts.scheme == "redis":
        sock = socket.create_connection((parts.hostname or "localhost", parts.port or 6379), timeout=TIMEOUT)
        db = parts.path.strip("/") or "0"
    else:
        return None
    connection = Connection(sock)
    try:
        if parts.password is not None:
            user = unquote(parts.username or "")
            connection.command("AUTH", *([user] if user else []), unquote(parts.password))
        if db != "0":
            connection.command("SELECT", db)
    except Exception:
        connection.close()
        raise
    return connection
