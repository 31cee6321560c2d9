"""The service manager's notification protocol (sd_notify(3)), for `Type=notify` units.

systemd passes `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace) and, with
`WatchdogSec=`, `$WATCHDOG_USEC` (and `$WATCHDOG_PID`, the process it is meant for). A message is
one datagram of newline-separated `KEY=value` lines: `READY=1`, `STATUS=...`, `WATCHDOG=1`,
`STOPPING=1`. Without `$NOTIFY_SOCKET` every call is a no-op.

The socket is non-blocking, so a send never stalls the event loop; a message the manager cannot
take at once (its queue full, the socket gone) is dropped, as sd_notify drops it, and said once
in the log. As sd_notify(unset_environment=1), the variables are removed from the environment
once read, so the containers the process runtime starts do not inherit them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

log = logging.getLogger(__name__)

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"


class NotifyError(ValueError):
    """$NOTIFY_SOCKET or $WATCHDOG_USEC holds something this protocol cannot use."""


def socket_address(value: str) -> str | bytes:
    """The AF_UNIX address of a $NOTIFY_SOCKET value: `@name` is abstract, `/path` a file."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    raise NotifyError(
        f"NOTIFY_SOCKET={value!r}: not a socket path or an abstract (@) name "
        "(vsock addresses are not supported)"
    )


def watchdog_interval(env: MutableMapping[str, str], pid: int) -> float | None:
    """How often to send WATCHDOG=1: half of $WATCHDOG_USEC, as the kubelet does; None when the
    watchdog is off or meant for another process ($WATCHDOG_PID)."""
    usec = env.get(WATCHDOG_USEC, "")
    if not usec:
        return None
    owner = env.get(WATCHDOG_PID, "")
    if owner and owner != str(pid):
        return None
    try:
        micros = int(usec)
    except ValueError:
        raise NotifyError(f"WATCHDOG_USEC={usec!r}: not a whole number of microseconds") from None
    if micros <= 0:
        raise NotifyError(f"WATCHDOG_USEC={usec!r}: must be positive")
    return micros / 2_000_000


class Notifier:
    """Sends notifications to the service manager, if there is one."""

    def __init__(
        self,
        address: str | bytes | None,
        watchdog_every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._address = address
        self._every = watchdog_every if address is not None else None
        self._clock = clock
        self._socket: socket.socket | None = None
        self._last_ping: float | None = None
        self._failed = False

    @classmethod
    def from_environment(cls, env: MutableMapping[str, str] | None = None) -> Notifier:
        """The notifier of this process's service manager; the variables are taken out of `env`
        (default: os.environ). A value it cannot use is logged and notification left off."""
        env = os.environ if env is None else env
        try:
            raw = env.get(NOTIFY_SOCKET, "")
            address = socket_address(raw) if raw else None
            every = watchdog_interval(env, os.getpid())
        except NotifyError as exc:
            log.warning("not notifying the service manager: %s", exc)
            address, every = None, None
        for name in (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID):
            env.pop(name, None)
        return cls(address, every)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_every(self) -> float | None:
        return self._every

    def notify(self, *lines: str) -> bool:
        """One message of these `KEY=value` lines; True if the manager took it."""
        if self._address is None:
            return False
        message = "\n".join(lines).encode()
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
                )
            self._socket.sendto(message, self._address)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot notify the service manager at %r: %s", self._address, exc)
                self._failed = True
            return False
        if self._failed:
            log.info("notifying the service manager again")
            self._failed = False
        return True

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.notify(f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.notify("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> None:
        """WATCHDOG=1 if half the watchdog's timeout passed since the last one: call it as often
        as the loop that must stay alive turns."""
        if self._every is None:
            return
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < self._every:
            return
        self._last_ping = now
        self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
