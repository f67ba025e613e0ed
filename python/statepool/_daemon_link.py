"""How statepool's engine integrations talk to the daemon (private to statepool.sglang and
statepool.vllm, which share it).

An engine calls its integration from several threads and must never get an exception back.
Each calling thread has a ``Session`` of its own (``threading.local``, kept by ``Sessions``): a
connection, what the integration sets up on it (a subclass adds that) and a ``StagingArea``
that grows on demand. A session that loses its connection drops all of it and connects again
on a later call, at most once per ``retry_interval`` (with ``backoff``, up to 30 times that
while connecting keeps failing); a daemon that speaks only protocol version 1 is refused.
``Sessions.fail`` sorts a failed call's exception into a failure kind, ``entry_kind`` a failed
entry's status; ``Reporter`` logs the first failure of a kind (one warning, whatever the thread)
and its recovery, under the integration's logger and message prefix. ``Down``: no connection
now. ``settings_from_extra``: an integration's settings (a dataclass) from the engine's extra
config.

Below every ``_sglang_*`` and ``_vllm_*`` module: it imports neither engine nor their settings.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import fields
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, TypeVar

import torch

import statepool

# Failure kinds that a call which went through clears.
CALL_KINDS = ("daemon", "capacity", "refused", "error")

# A session that backs off waits at most this many retry intervals between attempts.
_MAX_BACKOFF = 30


class Down(Exception):
    """No connection right now (the failure was reported when it was lost)."""


class Reporter:
    """The first failure of a kind is logged as a warning, then nothing until it recovers
    (logged once too). Shared by every session of an integration (of a vLLM process part);
    ``count`` counts every failure. Logs to ``logger``, each message after ``prefix``."""

    def __init__(self, logger: logging.Logger, prefix: str, count: Callable[[], None]):
        self._logger = logger
        self._first = prefix + ": %s (further %s failures are not logged until it recovers)"
        self._back = prefix + ": recovered (%s)"
        self._lock = threading.Lock()
        self._reported: Dict[str, str] = {}
        self._count = count

    def report(self, kind: str, message: str) -> None:
        self._count()
        with self._lock:
            if kind in self._reported:
                return
            self._reported[kind] = message
        self._logger.warning(self._first, message, kind)

    def recovered(self, *kinds: str) -> None:
        if not self._reported:  # the usual case, without the lock
            return
        with self._lock:
            back = [k for k in kinds if self._reported.pop(k, None) is not None]
        for kind in back:
            self._logger.warning(self._back, kind)

    def reported(self) -> Dict[str, str]:
        with self._lock:
            return dict(self._reported)


def entry_kind(status: statepool.Status) -> str:
    """The failure kind of an entry (a page, a block) that failed alone in a batched request."""
    if status in (statepool.Status.pool_exhausted, statepool.Status.quota_exceeded):
        return "capacity"
    if status == statepool.Status.not_finite:
        return "not_finite"
    return "refused"


class StagingArea:
    """A session's staging buffer (the one-copy path): grows to what a batch needs, up to
    ``cap`` bytes (more only for a single item that is larger)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.staging: Optional[statepool.Staging] = None
        self.bytes: Optional[torch.Tensor] = None  # uint8 view of all of it

    def fit(self, each: int, count: int) -> int:
        """How many items of ``each`` bytes one staged batch may hold (at least one)."""
        return max(1, min(count, self.cap // max(1, each)))

    def get(self, conn: statepool.Connection, nbytes: int) -> Tuple[int, torch.Tensor]:
        """(staging id, uint8 tensor of the whole buffer), at least ``nbytes`` bytes."""
        if self.staging is None or self.staging.size < nbytes:
            self.close()
            size = 1 << max(20, (max(1, nbytes) - 1).bit_length())
            if size > self.cap:
                size = max(nbytes, self.cap)
            self.staging = conn.open_staging(size)
            self.bytes = torch.from_dlpack(self.staging.view("uint8", (self.staging.size,), 0))
        assert self.bytes is not None
        return self.staging.id, self.bytes

    def close(self) -> None:
        self.bytes = None  # the view first: it keeps the mapping
        if self.staging is not None:
            try:
                self.staging.close()
            except Exception:  # noqa: BLE001 - a view still alive, or the connection broke
                pass
            self.staging = None


class Session:
    """One thread's connection and what is set up on it; dropped whole when it is lost. An
    integration's subclass adds what it sets up and drops it in ``drop_resources``."""

    def __init__(self, staging_cap: int):
        self.conn: Optional[statepool.Connection] = None
        self.next_connect = 0.0
        self.failures_in_a_row = 0
        self.connects = 0
        self.staging = StagingArea(staging_cap)

    @property
    def connection(self) -> statepool.Connection:
        assert self.conn is not None
        return self.conn

    def drop_resources(self) -> None:
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


class Sessions:
    """The sessions of one backend, manager or worker, one per calling thread.

    ``settings``: the integration's (``socket``, ``tenant``, ``retry_interval`` and
    ``staging_mib`` are read here); ``client_name`` and ``timeout``: of each connection;
    ``backoff``: wait longer between attempts while connecting keeps failing;
    ``on_reconnect``: called when a session connects again after its first connection. A
    subclass names its integration (``integration``) and makes its sessions
    (``_new_session``)."""

    integration = "statepool"  # named in the warning about a protocol version 1 daemon

    def __init__(self, settings: Any, reporter: Reporter, client_name: str, timeout: float,
                 backoff: bool, on_reconnect: Callable[[], None]):
        self.settings = settings
        self.reporter = reporter
        self.client_name = client_name
        self.timeout = timeout
        self.backoff = backoff
        self._on_reconnect = on_reconnect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self.closed = False

    def _new_session(self) -> Session:
        return Session(self.settings.staging_mib * 2**20)

    def mine(self) -> Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._new_session()
            self._local.session = s
            with self._lock:
                self._all.add(s)
        return s

    def _retry_later(self, s: Session) -> None:
        s.failures_in_a_row += 1
        wait = self.settings.retry_interval
        if self.backoff:
            wait *= min(_MAX_BACKOFF, 2 ** min(s.failures_in_a_row - 1, 5))
        s.next_connect = time.monotonic() + wait

    def current(self) -> Session:
        """This thread's session, connected (``Down`` when it cannot be now)."""
        s = self.mine()
        if self.closed:
            raise Down()
        if s.conn is not None:
            return s
        if time.monotonic() < s.next_connect:
            raise Down()
        try:
            conn = statepool.connect(self.settings.socket, tenant=self.settings.tenant,
                                     client_name=self.client_name, timeout=self.timeout)
        except Exception as e:  # noqa: BLE001
            self._retry_later(s)
            self.connect_failed(e)
            raise Down() from None
        if conn.max_batch_keys == 0:
            server = conn.server
            conn.close()
            self._retry_later(s)
            self.reporter.report("daemon", f"the daemon ({server}) speaks protocol version 1; "
                                 f"{self.integration} needs version 2 (batched snapshot "
                                 "requests): upgrade statepoold")
            raise Down()
        if s.connects:
            self._on_reconnect()
        s.connects += 1
        s.conn = conn
        s.failures_in_a_row = 0
        self.reporter.recovered("daemon")
        return s

    def connect_failed(self, exc: BaseException) -> None:
        """Reports a failed connection attempt of this thread."""
        self.reporter.report("daemon", f"cannot connect to statepoold at "
                             f"{self.settings.socket}: {exc}")

    def classify(self, what: str, exc: BaseException) -> Tuple[str, str]:
        """The failure kind of a failed call's exception, and the message that reports it."""
        if isinstance(exc, statepool.TransportError):
            return "daemon", f"daemon unreachable during {what}: {exc}"
        if isinstance(exc, (statepool.PoolExhausted, statepool.QuotaExceeded)):
            return "capacity", f"{what}: {exc}"
        if isinstance(exc, statepool.DaemonError):
            return "refused", f"{what} refused: {exc}"
        return "error", f"{what}: {type(exc).__name__}: {exc}"

    def fail(self, what: str, exc: BaseException) -> None:
        """Reports a failed call of this thread; a lost connection is closed."""
        if isinstance(exc, Down):
            return
        self.reporter.report(*self.classify(what, exc))
        if isinstance(exc, statepool.TransportError):
            s = self.mine()
            s.close()
            self._retry_later(s)

    def close_all(self) -> None:
        self.closed = True
        with self._lock:
            sessions = list(self._all)
        for s in sessions:
            s.close()


_S = TypeVar("_S")


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return bool(value)


def settings_from_extra(cls: Type[_S], extra: Optional[Mapping[str, Any]]) -> _S:
    """``cls()`` (a dataclass whose every field has a default) with the values of ``extra``
    that name its fields, each made its default's type (a bool also from "true"/"false",
    "1"/"0", "yes"/"no", "on"/"off"); other keys and None values are passed over. Then the
    checks that every integration's settings share: the codec names (``state_codec``,
    ``kv_codec``) and the sizes (``kv_arena_mib``, ``staging_mib``, ``state_arena_pages``)."""
    extra = dict(extra or {})
    s = cls()
    for f in fields(cls):
        value = extra.get(f.name)
        if value is None:
            continue
        default = getattr(s, f.name)
        setattr(s, f.name, _as_bool(value) if isinstance(default, bool)
                else type(default)(value))
    if s.state_codec not in statepool.CodecId.__members__:
        raise ValueError(f"statepool: unknown state_codec {s.state_codec!r}; one of "
                         f"{sorted(statepool.CodecId.__members__)}")
    if s.kv_codec not in statepool.KvCodec.__members__:
        raise ValueError(f"statepool: unknown kv_codec {s.kv_codec!r}; one of "
                         f"{sorted(statepool.KvCodec.__members__)}")
    if s.kv_arena_mib <= 0 or s.staging_mib <= 0 or s.state_arena_pages < 0:
        raise ValueError("statepool: kv_arena_mib and staging_mib must be > 0, "
                         "state_arena_pages >= 0")
    return s
