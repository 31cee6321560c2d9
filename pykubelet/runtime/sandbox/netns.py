"""A TCP socket made in another network namespace (a pod sandbox's), for `kubectl port-forward`.

A socket belongs to the network namespace of the thread that created it, for its whole life; so
only its creation needs the pod's namespace, and the connect, the reads and the writes happen
on the event loop as for any other socket. `socket_in(path)` makes one: a new thread enters the
namespace with setns(2), creates the socket and goes back to the agent's namespace. The thread
is its own, not the loop's or a pool's: setns changes the calling thread only, and a thread that
could not go back (it cannot happen with a namespace fd we hold open, but if it did) ends with
the call instead of serving other work in the pod's network.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
# The calling thread's own namespace (not the process's: the thread is the unit of setns).
OWN_NAMESPACE = "/proc/thread-self/ns/net"


def _setns(fd: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns to {what}: {os.strerror(err)}")


def _socket_in(path: str) -> socket.socket:
    own = os.open(OWN_NAMESPACE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target, path)
            try:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                _setns(own, "the agent's network namespace")
        finally:
            os.close(target)
    finally:
        os.close(own)


def _deliver(future: asyncio.Future[socket.socket], sock: socket.socket) -> None:
    if future.done():  # the caller was cancelled meanwhile
        sock.close()
    else:
        future.set_result(sock)


def _fail(future: asyncio.Future[socket.socket], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


async def socket_in(path: str) -> socket.socket:
    """An unconnected IPv4 TCP socket in the network namespace at `path` (a
    /proc/<pid>/ns/net, or a bind-mounted namespace such as /var/run/netns/<name>). OSError
    if the namespace cannot be opened or entered."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[socket.socket] = loop.create_future()

    def run() -> None:
        try:
            sock = _socket_in(path)
        except BaseException as exc:  # handed to the caller, whatever it is
            loop.call_soon_threadsafe(_fail, future, exc)
        else:
            loop.call_soon_threadsafe(_deliver, future, sock)

    threading.Thread(target=run, name="netns-socket", daemon=True).start()
    return await future
