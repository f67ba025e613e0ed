"""The spec's counters and the metrics it gives vLLM (private to statepool.vllm).

The scheduler-side manager and each worker count what they do (``stats()`` of each: a plain
dict since it was made; ``COUNTERS`` says what each key counts). The manager also hands vLLM
the increments since the last call (``get_stats``, under names ``metric_definitions`` declares),
which vLLM's Prometheus logger exports (``vllm:statepool_*``). A worker cannot reach the
scheduler's metrics: the bytes and seconds of its transfers reach vLLM's own
``vllm:kv_offload_load_*`` / ``..._store_*`` metrics through its TransferResults.
"""

from __future__ import annotations

import threading
from typing import Any, Dict

COUNTERS = {
    # scheduler side (the manager)
    "lookups": "block keys vLLM asked about (lookup)",
    "lookup_hits": "of those, keys every rank's entry of is in the store (pool, host tier, Redis)",
    "lookup_keys_sent": "keys sent in lookup requests (a request's keys go together, once per "
                        "scheduler step; every rank's)",
    "lookup_requests": "lookup requests sent to the daemon",
    "lookup_seconds": "wall time of the lookup requests",
    "store_keys": "keys handed to the workers to store (prepare_store)",
    "load_keys": "keys handed to the workers to load (prepare_load)",
    # worker side
    "store_jobs": "store jobs submitted by vLLM",
    "load_jobs": "load jobs submitted by vLLM",
    "failed_store_jobs": "store jobs that did not store every entry",
    "failed_load_jobs": "load jobs that did not load every entry (vLLM recomputes the request)",
    "puts": "entries stored (created)",
    "existing": "entries a store job offered that the store had already (not copied or sent)",
    "gets": "entries loaded into vLLM's pages",
    "bytes_stored": "bytes of vLLM's pages stored (created entries)",
    "bytes_loaded": "bytes of vLLM's pages loaded",
    "bytes_copied": "bytes copied between vLLM's pages and the staging buffer (one copy each)",
    "round_trips": "daemon requests of the worker (lookups, puts, gets)",
    "store_seconds": "wall time of the store jobs",
    "load_seconds": "wall time of the load jobs",
    # both
    "failures": "failed calls and entries (every one; the log has the first of each kind)",
    "reconnects": "connections made again after one was lost",
}

# What the manager reports to vLLM's metrics: counter name -> (what, counter in COUNTERS).
_METRICS = {
    "vllm:statepool_lookups": ("Block keys vLLM asked statepool about.", "lookups"),
    "vllm:statepool_lookup_hits": ("Block keys statepool had (every rank's entry).",
                                   "lookup_hits"),
    "vllm:statepool_lookup_requests": ("Lookup requests sent to statepoold.", "lookup_requests"),
    "vllm:statepool_lookup_seconds": ("Wall time of the lookup requests, in seconds.",
                                      "lookup_seconds"),
    "vllm:statepool_store_keys": ("Block keys handed to the workers to store.", "store_keys"),
    "vllm:statepool_load_keys": ("Block keys handed to the workers to load.", "load_keys"),
    "vllm:statepool_scheduler_failures": ("Failed lookups of the scheduler (the log has the "
                                          "first of each kind).", "failures"),
}


def metric_definitions() -> Dict[str, Any]:
    """OffloadingSpec.build_metric_definitions(): the counters of ``get_stats``."""
    from vllm.v1.kv_offload.base import OffloadingCounterMetadata

    return {name: OffloadingCounterMetadata(documentation=doc)
            for name, (doc, _) in _METRICS.items()}


class Counters:
    """``COUNTERS``, since this object was made; one small lock, never held across a call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Dict[str, float] = {name: 0 for name in COUNTERS}
        self._reported: Dict[str, float] = {name: 0 for name in COUNTERS}

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, value in counts.items():
                self._values[name] += value

    def snapshot(self) -> Dict[str, Any]:
        with self._lock:
            return {k: (v if k.endswith("_seconds") else int(v)) for k, v in self._values.items()}

    def vllm_stats(self) -> Any:
        """vLLM's OffloadingConnectorStats with the increments since the last call, or None
        when nothing changed."""
        with self._lock:
            delta = {}
            for name, (_, counter) in _METRICS.items():
                d = self._values[counter] - self._reported[counter]
                if d:
                    delta[name] = d
            self._reported = dict(self._values)
        if not delta:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        for name, value in delta.items():
            stats.increase_counter(name, value)
        return stats
