"""The backend's connections to the daemon and its failure handling (private to statepool.sglang).

SGLang calls a storage backend from several threads at once (prefetch, prefetch I/O, backup,
scheduler) and takes no lock around it. Each calling thread gets a ``_Session`` of its own
(``threading.local``): a connection, the arenas opened on it, the memory of SGLang's lent to the
daemon on it, and its staging buffer, so that no thread waits for another's round trip. A
session that loses its connection drops all of it and connects again on a later call, at most
once per ``retry_interval``. ``_Reporter`` logs the first failure of a kind (shared by every
session: one warning, not one per thread) and its recovery; ``_Down``: no connection now.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Callable, Dict, Optional

import statepool

from ._sglang_arenas import _KvArena, _StagingArea, _StateArena, register_region
from ._sglang_pools import _Unsupported
from ._sglang_settings import Settings
from ._sglang_shm import SharedRegion

# The public module's logger: the backend logs under the name "statepool.sglang".
logger = logging.getLogger("statepool.sglang")

# Failure kinds a call that went through clears.
CALL_KINDS = ("daemon", "capacity", "refused", "error")


class _Down(Exception):
    """No connection right now (the failure was reported when it was lost)."""


class _Reporter:
    """The first failure of a kind is logged as a warning, then nothing until it recovers
    (logged once too). Shared by every session; ``count`` counts every failure."""

    def __init__(self, count: Callable[[], None]):
        self._lock = threading.Lock()
        self._reported: Dict[str, str] = {}
        self._count = count

    def report(self, kind: str, message: str) -> None:
        self._count()
        with self._lock:
            if kind in self._reported:
                return
            self._reported[kind] = message
        logger.warning("statepool HiCache storage: %s (further %s failures are not logged "
                       "until it recovers)", message, kind)

    def recovered(self, *kinds: str) -> None:
        if not self._reported:  # the usual case, without the lock
            return
        with self._lock:
            back = [k for k in kinds if self._reported.pop(k, None) is not None]
        for kind in back:
            logger.warning("statepool HiCache storage: recovered (%s)", kind)


class _Session:
    """One thread's connection and what is set up on it; dropped whole when it is lost."""

    def __init__(self, staging_cap: int):
        self.conn: Optional[statepool.Connection] = None
        self.generation = -1
        self.next_connect = 0.0
        self.connects = 0
        self.kv_arena: Optional[_KvArena] = None
        self.state_arena: Optional[_StateArena] = None
        # fd of SGLang's memory file -> the registration (None: the daemon refused it)
        self.memory: Dict[int, Optional[statepool.Staging]] = {}
        self.staging = _StagingArea(staging_cap)

    def memory_id(self, region: Optional[SharedRegion], name: str,
                  reporter: _Reporter) -> Optional[int]:
        """The staging id of ``region`` lent to the daemon on this connection (registered at
        its first use), or None: one copy (not shared memory, or the daemon refused it)."""
        if region is None or self.conn is None:
            return None
        if region.fd not in self.memory:
            try:
                self.memory[region.fd] = register_region(self.conn, region, name)
            except statepool.DaemonError as e:
                reporter.report("zero_copy", f"the daemon refused to map {name} ({e}): one copy "
                                "through a staging buffer on this connection instead")
                self.memory[region.fd] = None
        staging = self.memory[region.fd]
        return None if staging is None else staging.id

    def forget_memory(self) -> None:
        """After a broken loan: register again at the next use."""
        for staging in self.memory.values():
            if staging is not None:
                try:
                    staging.close()
                except Exception:  # noqa: BLE001
                    pass
        self.memory = {}

    def drop_resources(self) -> None:
        self.kv_arena = None
        self.state_arena = None
        self.forget_memory()
        self.staging.close()

    def close(self) -> None:
        # What lives on the connection first (views keep mappings), then the socket.
        self.drop_resources()
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self.conn = None


class _Sessions:
    """The sessions of one backend, one per calling thread."""

    def __init__(self, settings: Settings, reporter: _Reporter,
                 on_reconnect: Callable[[], None]):
        self.settings = settings
        self.reporter = reporter
        self._on_reconnect = on_reconnect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: "weakref.WeakSet[_Session]" = weakref.WeakSet()
        self.generation = 0
        self.closed = False

    def invalidate(self) -> None:
        """The host pools changed: every session sets its arenas and memory up again."""
        with self._lock:
            self.generation += 1

    def mine(self) -> _Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = _Session(self.settings.staging_mib * 2**20)
            self._local.session = s
            with self._lock:
                self._all.add(s)
        return s

    def current(self) -> _Session:
        """This thread's session, connected (``_Down`` when it cannot be now)."""
        s = self.mine()
        if self.closed:
            raise _Down()
        if s.generation != self.generation:
            s.drop_resources()
            s.generation = self.generation
        if s.conn is not None:
            return s
        if time.monotonic() < s.next_connect:
            raise _Down()
        try:
            conn = statepool.connect(self.settings.socket, tenant=self.settings.tenant,
                                     client_name="sglang-hicache", timeout=self.settings.timeout)
        except Exception as e:  # noqa: BLE001
            s.next_connect = time.monotonic() + self.settings.retry_interval
            self.fail("connect", e)
            raise _Down() from None
        if conn.max_batch_keys == 0:
            conn.close()
            s.next_connect = time.monotonic() + self.settings.retry_interval
            self.reporter.report("daemon", f"the daemon ({conn.server}) speaks protocol "
                                 "version 1; statepool.sglang needs version 2 (batched snapshot "
                                 "requests): upgrade statepoold")
            raise _Down()
        if s.connects:
            self._on_reconnect()
        s.connects += 1
        s.conn = conn
        self.reporter.recovered("daemon")
        return s

    def fail(self, what: str, exc: BaseException) -> None:
        """Reports a failed call of this thread; a lost connection is closed."""
        if isinstance(exc, statepool.TransportError):
            s = self.mine()
            self.reporter.report("daemon", f"daemon unreachable during {what}: {exc}")
            s.close()
            s.next_connect = time.monotonic() + self.settings.retry_interval
        elif isinstance(exc, (statepool.PoolExhausted, statepool.QuotaExceeded)):
            self.reporter.report("capacity", f"{what}: {exc}")
        elif isinstance(exc, statepool.DaemonError):
            self.reporter.report("refused", f"{what} refused: {exc}")
        elif isinstance(exc, _Unsupported):
            self.reporter.report("unsupported", f"{what}: {exc}")
        else:
            self.reporter.report("error", f"{what}: {type(exc).__name__}: {exc}")

    def close_all(self) -> None:
        self.closed = True
        with self._lock:
            sessions = list(self._all)
        for s in sessions:
            s.close()
