"""No network, at the socket level, for every Python process started with this folder on PYTHONPATH.

The tests start the book's build, its kernels and the chapters' runs this way
(``conftest.offline_env``). Python imports ``sitecustomize`` at start-up, so the guard is in
place before any of the book's code runs: a connection or a datagram to anything but this
machine (the loopback addresses, ``localhost``, its own host name, Unix sockets) raises
``OSError(ENETUNREACH)``, and a name lookup ``socket.gaierror``, as on a machine with no
network. What Python's ``socket`` module does is guarded; C code that opens its own sockets
is not. The kernels' own channels (ZeroMQ over loopback) are untouched.

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
        return host == socket.gethostname().lower()  # another name: looking it up would ask a DNS server
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is this machine too
    return address.is_loopback or address.is_unspecified or bool(mapped and mapped.is_loopback)


def _log(what: str, target) -> None:
    if _LOG:
        stack = "".join(traceback.format_stack(limit=15)[:-3])
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"pid {os.getpid()}: {what} {target!r}\n{stack}\n")


def _refuse(what: str, target) -> None:
    _log(what, target)
    raise OSError(errno.ENETUNREACH, f"network access is blocked in this run ({what} {target!r})")


def _refuse_lookup(what: str, target) -> None:
    _log(what, target)  # as a machine without a name server answers: the name is not known
    raise socket.gaierror(socket.EAI_NONAME, f"name lookups are blocked in this run ({what} {target!r})")


def _inet_target(sock, address) -> bool:
    return sock.family in _INET and isinstance(address, tuple) and bool(address) and not _is_local(address[0])


_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
_sendto, _sendmsg = socket.socket.sendto, socket.socket.sendmsg


def _connect_guarded(self, address):
    if _inet_target(self, address):
        _refuse("connect", address)
    return _connect(self, address)


def _connect_ex_guarded(self, address):
    if _inet_target(self, address):
        _refuse("connect", address)
    return _connect_ex(self, address)


def _sendto_guarded(self, data, *args):
    if args and _inet_target(self, args[-1]):  # sendto(data, address) or sendto(data, flags, address)
        _refuse("sendto", args[-1])
    return _sendto(self, data, *args)


def _sendmsg_guarded(self, buffers, *args):
    if len(args) >= 3 and _inet_target(self, args[2]):  # sendmsg(buffers, ancdata, flags, address)
        _refuse("sendmsg", args[2])
    return _sendmsg(self, buffers, *args)


def _guard_lookup(name: str, host_argument: int = 0):
    original = getattr(socket, name)

    def guarded(*args, **kwargs):
        host = args[host_argument] if len(args) > host_argument else kwargs.get("host")
        if name == "getnameinfo":
            host = host[0] if isinstance(host, tuple) and host else host
        if not _is_local(host):
            _refuse_lookup(name, host)
        return original(*args, **kwargs)

    guarded.__name__ = name
    setattr(socket, name, guarded)


socket.socket.connect = _connect_guarded
socket.socket.connect_ex = _connect_ex_guarded
socket.socket.sendto = _sendto_guarded
socket.socket.sendmsg = _sendmsg_guarded
for _name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
    _guard_lookup(_name)
