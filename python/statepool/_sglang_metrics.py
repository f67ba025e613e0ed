"""The backend's counters and SGLang's storage metrics (private to statepool.sglang).

``stats()`` of the backend returns the counters below (a plain dict, since the backend was
made); ``get_stats()`` returns SGLang's ``StorageMetrics``: one sample per batch call that moved
pages since the last ``get_stats()`` (drained on each call, as SGLang's Mooncake backend does).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Deque, Dict, Optional

# What stats() returns, one counter per key (since the backend was made).
COUNTERS = {
    "kv_lookups": "KV page keys asked about by existence queries (batch_exists*, exists)",
    "kv_lookup_hits": "of those, pages the store has (the leading run of each query)",
    "state_lookups": "MAMBA page keys asked about by batch_exists_v2",
    "state_lookup_hits": "of those, states the store has",
    "kv_hits": "KV pages read into the host pool (gets)",
    "kv_misses": "KV pages a get asked for and did not receive (absent, or after a miss)",
    "state_hits": "MAMBA pages (states) read into the host pool",
    "state_misses": "states a get asked for and did not receive",
    "kv_puts": "KV pages stored (created)",
    "kv_existing": "KV pages a set offered that the store had already (not copied or sent)",
    "kv_put_failures": "KV pages a set failed to store",
    "state_puts": "states stored (created)",
    "state_existing": "states a set offered that the store had already",
    "state_put_failures": "states a set failed to store",
    "bytes_read": "bytes the daemon wrote into the host pools (gets)",
    "bytes_written": "bytes the daemon read from the host pools (sets)",
    "bytes_copied": "bytes this process copied through staging buffers (the one-copy path)",
    "get_seconds": "wall time of the gets (round trips and copies)",
    "set_seconds": "wall time of the sets",
    "lookup_seconds": "wall time of the existence queries",
    "round_trips": "batched requests sent to the daemon (as its key cap splits them; a get or "
                   "lookup that stops at a miss may send fewer)",
    "failures": "failed calls and pages (every one; the log has the first of each kind)",
    "reconnects": "connections made again after one was lost",
}

# Samples kept between two get_stats() calls (nobody drains them without --enable-metrics).
_MAX_SAMPLES = 4096
_GIB = float(1 << 30)


class _Metrics:
    """Counters and the StorageMetrics samples; one small lock, never held across a call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: Dict[str, float] = {name: 0 for name in COUNTERS}
        self._samples: Dict[str, Deque[float]] = {
            name: deque(maxlen=_MAX_SAMPLES)
            for name in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, value in counts.items():
                self._counters[name] += value

    def sample(self, direction: str, pages: int, nbytes: int, seconds: float) -> None:
        """One batch call of SGLang's that moved ``pages`` pages (``nbytes`` bytes of the host
        pools) in ``seconds``: ``direction`` is "prefetch" (get) or "backup" (set)."""
        if pages <= 0:
            return
        with self._lock:
            self._samples[direction + "_pgs"].append(pages)
            self._samples[direction + "_bandwidth"].append(
                nbytes / _GIB / seconds if seconds > 0 else 0.0)

    def counters(self) -> Dict[str, Any]:
        with self._lock:
            return {k: (v if k.endswith("_seconds") else int(v))
                    for k, v in self._counters.items()}

    def drain(self) -> Optional[Any]:
        """SGLang's StorageMetrics with the samples since the last call (None when SGLang's
        metrics module cannot be imported)."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:  # noqa: BLE001 - another SGLang version: no metrics, no failure
            return None
        out = StorageMetrics()
        with self._lock:
            for name, samples in self._samples.items():
                getattr(out, name).extend(samples)
                samples.clear()
        return out
