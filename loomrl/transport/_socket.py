"""Pickled messages over Unix domain sockets between processes of one node.

A Ray actor call costs a few milliseconds of dispatch, object-store traffic and, for results
passed on by reference, a trip through the driver. Two workers that exchange a message every few
milliseconds (the env <-> policy cycle) can instead hold one stream socket between them for a
whole rollout: a message is an 8-byte length and a protocol-5 pickle, and a hand-off costs two
system calls and a copy. A stream also says when its peer is gone: a dead process's end closes,
and the reader gets end-of-file at once instead of waiting for a timeout.

``Listener`` binds an address ``connect`` reaches from another process of the same node. On Linux
the address is in the abstract namespace: no file, and it goes away with the process however that
ends (a worker removed with ``ray.kill`` runs no cleanup). Elsewhere it is a socket file in a
private temporary directory, removed by ``close``, at garbage collection or at exit. This module
never imports torch.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import struct
import sys
import tempfile
import uuid
import weakref
from typing import Any

__all__ = ["Conn", "Listener", "PeerClosed", "connect"]

_HEAD = struct.Struct("!Q")
# Socket buffers sized so that a step's observations (hundreds of KB of pixels) go out in one
# write without waiting for the reader; the kernel caps the request at net.core.wmem_max.
_BUFFER_BYTES = 4 << 20
# A length beyond this is a stream out of step (a write cut off midway), not a message.
MAX_MESSAGE_BYTES = 1 << 34


class PeerClosed(ConnectionError):
    """The other end closed the connection (its process exited or died)."""


class Conn:
    """One end of a connected stream socket carrying whole pickled objects. ``timeout``: how
    long a send may wait for the reader to make room, and a recv's default wait (None: for
    ever); either raises ``TimeoutError`` when it runs out."""

    def __init__(self, sock: socket.socket, timeout: float | None):
        self.sock = sock
        self.timeout = timeout
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, _BUFFER_BYTES)
            except OSError:  # a smaller buffer only means more, shorter writes
                pass

    def send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=5)
        self.sock.settimeout(self.timeout)
        if len(data) < 65536:  # one write; large payloads are not copied again to prepend
            self.sock.sendall(_HEAD.pack(len(data)) + data)
        else:
            self.sock.sendall(_HEAD.pack(len(data)))
            self.sock.sendall(data)

    def recv(self, timeout: float | None = None, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
        """The next object; ``TimeoutError`` after ``timeout`` seconds (default: the
        connection's) without one, ``PeerClosed`` when the other end has closed or announces
        more than ``max_bytes``."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        (n,) = _HEAD.unpack(self._exactly(_HEAD.size))
        if n > max_bytes:
            raise PeerClosed(f"a message of {n} bytes announced: the stream is out of step")
        return pickle.loads(self._exactly(n))

    def last_error(self, timeout: float = 1.0) -> str | None:
        """After a send failed because the peer closed its end: the message of the
        ``("error", message)`` it sent before closing, read past whatever it sent earlier;
        None where it closed without one (or went silent for ``timeout`` seconds)."""
        try:
            while True:
                msg = self.recv(timeout)
                if isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "error":
                    return str(msg[1])
        except (OSError, pickle.UnpicklingError):
            return None

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
    """A listening Unix socket at ``address`` (see the module's note on where it lives)."""

    def __init__(self, backlog: int = 64):
        self.dir: str | None = None
        if sys.platform.startswith("linux"):
            self.address = f"\0loomrl_sock_{os.getpid()}_{uuid.uuid4().hex}"
            self._cleanup = weakref.finalize(self, lambda: None)
        else:  # short (socket paths are limited to about 100 bytes) and private (mode 0700)
            self.dir = tempfile.mkdtemp(prefix="loomrl_sock_")
            self.address = os.path.join(self.dir, "s")
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(backlog)

    def accept(self, timeout: float | None, conn_timeout: float | None = None) -> Conn:
        """The next connection (its sends and receives waiting ``conn_timeout`` seconds);
        ``TimeoutError`` when none comes within ``timeout`` seconds. On Linux a peer of
        another user is refused with ``PermissionError``: an abstract address has no file
        permissions, and what arrives is unpickled."""
        self.sock.settimeout(timeout)
        s, _ = self.sock.accept()
        if hasattr(socket, "SO_PEERCRED"):
            _pid, uid, _gid = struct.unpack(
                "3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            )
            if uid != os.getuid():
                s.close()
                raise PermissionError(f"a connection from user {uid} refused")
        return Conn(s, conn_timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self._cleanup()


def connect(address: str, timeout: float | None = 30.0) -> Conn:
    """Connect to a ``Listener`` of this node; the connection's sends and receives wait
    ``timeout`` seconds. ``FileNotFoundError`` or ``ConnectionRefusedError`` where nothing
    listens at ``address`` (the listener is on another node, or has closed)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(address)
    except BaseException:
        s.close()
        raise
    return Conn(s, timeout)
