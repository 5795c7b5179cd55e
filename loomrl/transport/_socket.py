"""Pickled messages over Unix domain sockets between processes of one node.

A Ray actor call costs a few milliseconds of dispatch, object-store traffic and, for results
passed on by reference, a trip through the driver. Two workers that exchange a message every few
milliseconds (the env <-> policy cycle) can instead hold one stream socket between them for a
whole rollout: a message is an 8-byte length and a protocol-5 pickle, and a hand-off costs two
system calls and a copy. A stream also says when its peer is gone: a dead process's end closes,
and the reader gets end-of-file at once instead of waiting for a timeout.

``Listener`` binds a socket file in a fresh private directory (removed by ``close``);
``connect`` reaches it from another process of the same node. This module never imports torch.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import struct
import tempfile
import weakref
from typing import Any

__all__ = ["Conn", "Listener", "PeerClosed", "connect"]

_HEAD = struct.Struct("!Q")
# Socket buffers sized so that a step's observations (hundreds of KB of pixels) go out in one
# write without waiting for the reader; the kernel caps the request at net.core.wmem_max.
_BUFFER_BYTES = 4 << 20


class PeerClosed(ConnectionError):
    """The other end closed the connection (its process exited or died)."""


class Conn:
    """One end of a connected stream socket carrying whole pickled objects."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, _BUFFER_BYTES)
            except OSError:  # a smaller buffer only means more, shorter writes
                pass

    def send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=5)
        if len(data) < 65536:  # one write; large payloads are not copied again to prepend
            self.sock.sendall(_HEAD.pack(len(data)) + data)
        else:
            self.sock.sendall(_HEAD.pack(len(data)))
            self.sock.sendall(data)

    def recv(self, timeout: float | None) -> Any:
        """The next object; ``TimeoutError`` after ``timeout`` seconds without one (None: wait
        for ever), ``PeerClosed`` when the other end has closed."""
        self.sock.settimeout(timeout)
        (n,) = _HEAD.unpack(self._exactly(_HEAD.size))
        return pickle.loads(self._exactly(n))

    def _exactly(self, n: int) -> memoryview:
        buf = memoryview(bytearray(n))
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(buf[got:], n - got)
            except TimeoutError:  # an OSError too, but not the peer's doing
                raise
            except OSError as e:  # a reset from a peer that died mid-write
                raise PeerClosed(str(e)) from None
            if k == 0:
                raise PeerClosed("the other end closed the connection")
            got += k
        return buf

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Listener:
    """A listening Unix socket at ``path`` in a private temporary directory."""

    def __init__(self, backlog: int = 64):
        # Short (Unix socket paths are limited to about 100 bytes) and private (mode 0700).
        self.dir = tempfile.mkdtemp(prefix="loomrl_sock_")
        self.path = os.path.join(self.dir, "s")
        # Also removed when this object is collected or the process exits without close().
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(backlog)

    def accept(self, timeout: float | None) -> Conn:
        """The next connection; ``TimeoutError`` when none comes within ``timeout`` seconds."""
        self.sock.settimeout(timeout)
        s, _ = self.sock.accept()
        s.settimeout(None)
        return Conn(s)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self._cleanup()


def connect(path: str, timeout: float | None = 30.0) -> Conn:
    """Connect to a ``Listener`` of this node. ``FileNotFoundError`` where ``path`` is not there
    (e.g. the listener runs on another node, or has closed)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except BaseException:
        s.close()
        raise
    s.settimeout(None)
    return Conn(s)
