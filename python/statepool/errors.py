"""The exceptions of statepool.

Every error the library raises for a daemon's refusal or a transport failure is a
:class:`StatepoolError` with a ``status`` (a :class:`statepool.Status`):

- :class:`DaemonError` and its subclasses: the daemon answered with that status (or the
  client refused the same thing locally, e.g. an invalid layout). The connection stays
  usable, except after ProtocolError, NotHello, UnsupportedVersion and TooManyConnections.
- :class:`TransportError` (also a builtin ``ConnectionError``): the socket failed, the daemon
  went away, a call timed out, or the daemon sent something that is not a frame. ``kind``
  says which ('connect_failed', 'closed', 'timed_out', 'bad_frame', 'io_error'); the
  connection is unusable afterwards: connect again, with the lease token to get the slots
  back within the grace period.
"""

from __future__ import annotations

import builtins
from typing import Any, Optional


class StatepoolError(Exception):
    """Base of every statepool error; ``status`` is the daemon's reply status."""

    status: Any = None  #: the statepool.Status (None only for an error raised by hand)
    kind: str = ""  #: TransportError only

    @property
    def message(self) -> str:
        """The daemon's (or the client's) message."""
        return str(self)


class DaemonError(StatepoolError):
    """The daemon refused the request with ``status``."""


class InvalidArgument(DaemonError, ValueError):
    """A field is out of range or inconsistent."""


class NotFound(DaemonError, LookupError):
    """Unknown layout, arena, staging buffer or plan."""


class QuotaExceeded(DaemonError):
    """A per-tenant or per-connection limit would be exceeded."""


class PoolExhausted(DaemonError):
    """No capacity left: the pool, the arena's free pages, or the staging capacity."""


class NotOwner(DaemonError):
    """The slot is allocated to another lease."""


class UnsupportedVersion(DaemonError):
    """No common protocol version."""


class ProtocolError(DaemonError):
    """The daemon found a malformed frame or message (it closes the connection)."""


class LeaseBusy(DaemonError):
    """The lease token is held by another live connection."""


class UnknownTenant(DaemonError):
    """The tenant is not configured in the daemon."""


class PermissionDenied(DaemonError):
    """Not allowed: peer uid, tenant, another tenant's arena, or Drain by a non-operator."""


class Draining(DaemonError):
    """The daemon is draining (reserved by the protocol)."""


class NotFinite(DaemonError, ValueError):
    """A state to compress holds NaN or Inf; the page is unchanged."""


class Internal(DaemonError):
    """A bug or an operating-system failure in the daemon (it logs the details)."""


class NotHello(DaemonError):
    """The first request of a connection must be Hello."""


class TooManyConnections(DaemonError):
    """The daemon, the uid or the tenant has no connection left; retry later."""


class InUse(DaemonError):
    """The arena still has held pages, pinned or busy snapshots, or other connections."""


class TransportError(StatepoolError, builtins.ConnectionError):
    """The connection failed; ``kind`` says how. The connection is unusable afterwards."""


_BY_STATUS = {
    "invalid_argument": InvalidArgument,
    "not_found": NotFound,
    "quota_exceeded": QuotaExceeded,
    "pool_exhausted": PoolExhausted,
    "not_owner": NotOwner,
    "unsupported_version": UnsupportedVersion,
    "protocol_error": ProtocolError,
    "lease_busy": LeaseBusy,
    "unknown_tenant": UnknownTenant,
    "permission_denied": PermissionDenied,
    "draining": Draining,
    "not_finite": NotFinite,
    "internal": Internal,
    "not_hello": NotHello,
    "too_many_connections": TooManyConnections,
    "in_use": InUse,
}


def _make(status: Any, message: str, kind: Optional[str] = None) -> StatepoolError:
    """The exception for a status (the C++ module calls this to raise)."""
    if kind is not None:
        error: StatepoolError = TransportError(message)
        error.kind = kind
    else:
        error = _BY_STATUS.get(status.name, DaemonError)(message)
    error.status = status
    return error


__all__ = [
    "StatepoolError", "DaemonError", "TransportError", "Draining", "InUse", "Internal",
    "InvalidArgument", "LeaseBusy", "NotFinite", "NotFound", "NotHello", "NotOwner",
    "PermissionDenied", "PoolExhausted", "ProtocolError", "QuotaExceeded",
    "TooManyConnections", "UnknownTenant", "UnsupportedVersion",
]
