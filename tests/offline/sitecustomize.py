"""No network, at the socket level, for every Python process started with this folder on PYTHONPATH.

The tests start the book's build, its kernels and the chapters' runs this way
(``conftest.offline_env``). Python imports ``sitecustomize`` at start-up, so the guard is in
place before any of the book's code runs: a connection, a datagram or a name lookup for
anything but this machine (the loopback addresses, ``localhost``, Unix sockets) raises
``OSError(ENETUNREACH)``, as on a machine with no network. The kernels' own channels (ZeroMQ
over loopback) are untouched.

Each refused attempt is also appended to the file named by ``D2LMINI_OFFLINE_LOG``, with the
stack that made it, so that a test sees an attempt even when the code that made it caught
the error and carried on (a library that falls back to a local copy, say).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import traceback

_LOG = os.environ.get("D2LMINI_OFFLINE_LOG")
_INET = (socket.AF_INET, socket.AF_INET6)


def _is_local(host) -> bool:
    if host is None:
        return True  # getaddrinfo(None, port): the local wildcard, no lookup
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").split("%")[0].lower()
    if host in ("", "localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: looking it up would ask a DNS server
    return address.is_loopback or address.is_unspecified


def _refuse(what: str, target) -> None:
    if _LOG:
        stack = "".join(traceback.format_stack(limit=15)[:-2])
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"pid {os.getpid()}: {what} {target!r}\n{stack}\n")
    raise OSError(errno.ENETUNREACH, f"network access is blocked in this run ({what} {target!r})")


_connect, _connect_ex, _sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto
_getaddrinfo = socket.getaddrinfo


def _connect_guarded(self, address):
    if self.family in _INET and not _is_local(address[0]):
        _refuse("connect", address)
    return _connect(self, address)


def _connect_ex_guarded(self, address):
    if self.family in _INET and not _is_local(address[0]):
        _refuse("connect", address)
    return _connect_ex(self, address)


def _sendto_guarded(self, data, *args):
    address = args[-1]
    if self.family in _INET and not _is_local(address[0]):
        _refuse("sendto", address)
    return _sendto(self, data, *args)


def _getaddrinfo_guarded(host, *args, **kwargs):
    if not _is_local(host):
        _refuse("getaddrinfo", host)
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _connect_guarded
socket.socket.connect_ex = _connect_ex_guarded
socket.socket.sendto = _sendto_guarded
socket.getaddrinfo = _getaddrinfo_guarded
