"""The backend's connection to the daemon and its failure handling (private to statepool.sglang).

``_Session``: a connection and the arenas set up on it, dropped whole when it is lost.
``_Connection``: the part of ``StatepoolHiCacheStorage`` that reports failures (the first of a
kind as a warning, then nothing until it recovers) and connects again, at most once per
``retry_interval``. ``_Down``: no connection right now.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import statepool

from ._sglang_arenas import _SmallArena, _StateArena
from ._sglang_pools import _Unsupported

# The public module's logger: the backend logs under the name "statepool.sglang".
logger = logging.getLogger("statepool.sglang")


class _Down(Exception):
    """No connection right now (the failure was reported when it was lost)."""


class _Session:
    """A connection and what was set up on it; dropped whole when the connection is lost."""

    def __init__(self, conn: statepool.Connection):
        self.conn = conn
        self.small: Optional[_SmallArena] = None
        self.state: Optional[_StateArena] = None

    def close(self) -> None:
        # Views first (they keep the mappings), then the objects, then the socket.
        self.small = None
        self.state = None
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - already broken
            pass


class _Connection:
    """Failure reporting and the connection, a base of StatepoolHiCacheStorage (whose
    __init__ sets what these use: settings, counters, _session, _next_connect, _connects and
    _reported). Called with the backend's lock held."""

    # -- failure reporting ----------------------------------------------------------------

    def _report(self, kind: str, message: str) -> None:
        self.counters["failures"] += 1
        if kind not in self._reported:
            self._reported[kind] = message
            logger.warning("statepool HiCache storage: %s (further %s failures are not logged "
                           "until it recovers)", message, kind)

    def _recovered(self, *kinds: str) -> None:
        for kind in kinds:
            if self._reported.pop(kind, None) is not None:
                logger.warning("statepool HiCache storage: recovered (%s)", kind)

    def _fail(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, statepool.TransportError):
            self._report("daemon", f"daemon unreachable during {what}: {exc}")
            if self._session is not None:
                self._session.close()
                self._session = None
            self._next_connect = time.monotonic() + self.settings.retry_interval
        elif isinstance(exc, (statepool.PoolExhausted, statepool.QuotaExceeded)):
            self._report("capacity", f"{what}: {exc}")
        elif isinstance(exc, statepool.DaemonError):
            self._report("refused", f"{what} refused: {exc}")
        elif isinstance(exc, _Unsupported):
            self._report("unsupported", f"{what}: {exc}")
        else:
            self._report("error", f"{what}: {type(exc).__name__}: {exc}")

    # -- sessions -------------------------------------------------------------------------

    def _connected(self) -> Optional[_Session]:
        if self._session is not None:
            return self._session
        if time.monotonic() < self._next_connect:
            return None
        try:
            conn = statepool.connect(self.settings.socket, tenant=self.settings.tenant,
                                     client_name="sglang-hicache", timeout=self.settings.timeout)
        except Exception as e:  # noqa: BLE001
            self._fail("connect", e)
            self._next_connect = time.monotonic() + self.settings.retry_interval
            return None
        if self._connects:
            self.counters["reconnects"] += 1
        self._connects += 1
        self._session = _Session(conn)
        self._recovered("daemon")
        return self._session
