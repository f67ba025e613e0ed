"""The backend's connections to the daemon and its failure handling (private to statepool.sglang).

SGLang calls a storage backend from several threads at once (prefetch, prefetch I/O, backup,
scheduler) and takes no lock around it. Each calling thread gets a ``_Session`` of its own
(``threading.local``): a connection, the arenas opened on it, the memory of SGLang's lent to the
daemon on it, and its staging buffer, so that no thread waits for another's round trip. A
session that loses its connection drops all of it and connects again on a later call, at most
once per ``retry_interval``. The per-thread sessions, the reconnection, the failure kinds and
their reporting (``Reporter``: the first failure of a kind logged once, not once per thread,
and its recovery; ``Down``: no connection now) are ``_daemon_link``'s, shared with
statepool.vllm; this module adds what an SGLang session holds and the backend's own failure
kind (``unsupported``).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import statepool

from ._daemon_link import Reporter, Session, Sessions
from ._sglang_arenas import _KvArena, _StateArena, register_region
from ._sglang_pools import _Unsupported
from ._sglang_settings import Settings
from ._sglang_shm import SharedRegion

class _Session(Session):
    """One thread's connection and what is set up on it; dropped whole when it is lost."""

    def __init__(self, staging_cap: int):
        super().__init__(staging_cap)
        self.generation = -1
        self.kv_arena: Optional[_KvArena] = None
        self.state_arena: Optional[_StateArena] = None
        # fd of SGLang's memory file -> the registration (None: the daemon refused it)
        self.memory: Dict[int, Optional[statepool.Staging]] = {}

    def memory_id(self, region: Optional[SharedRegion], name: str,
                  reporter: Reporter) -> Optional[int]:
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
        super().drop_resources()


class _Sessions(Sessions):
    """The sessions of one backend, one per calling thread."""

    integration = "statepool.sglang"

    def __init__(self, settings: Settings, reporter: Reporter,
                 on_reconnect: Callable[[], None]):
        super().__init__(settings, reporter, "sglang-hicache", settings.timeout, False,
                         on_reconnect)
        self.generation = 0

    def invalidate(self) -> None:
        """The host pools changed: every session sets its arenas and memory up again."""
        with self._lock:
            self.generation += 1

    def _new_session(self) -> _Session:
        return _Session(self.settings.staging_mib * 2**20)

    def current(self) -> _Session:
        """This thread's session, connected (``Down`` when it cannot be now), with the
        arenas and memory of the host pools registered last."""
        s = self.mine()
        if not self.closed and s.generation != self.generation:
            s.drop_resources()
            s.generation = self.generation
        return super().current()

    def connect_failed(self, exc: BaseException) -> None:
        # A failed connection is reported as any failed call (the "connect" call).
        self.fail("connect", exc)

    def classify(self, what: str, exc: BaseException) -> Tuple[str, str]:
        if isinstance(exc, _Unsupported):
            return "unsupported", f"{what}: {exc}"
        return super().classify(what, exc)
