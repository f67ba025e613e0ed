"""statepool as a vLLM KV-offloading spec for hybrid models: GDN state and attention KV.

vLLM (0.32 and later) loads it by module path, with no change to the engine::

    vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --enable-prefix-caching \\
        --kv-transfer-config '{"kv_connector": "StatepoolConnector",
            "kv_connector_module_path": "statepool.vllm", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"spec_name": "StatepoolOffloadingSpec",
                "spec_module_path": "statepool.vllm",
                "socket": "/run/statepool/statepool.sock", "state_codec": "stepquant6"}}'

What it stores (docs/vllm.md has the whole story): vLLM's OffloadingConnector offloads a
hybrid model block by block, one ``OffloadKey`` (a block hash and a KV-cache group) at a time.
A key of a **Mamba group** (the gated-delta-rule layers of the group, at a block boundary)
becomes a statepool state snapshot under the state codec; a key of an **attention group** (its
layers' pages of one block) becomes a hybrid snapshot's KV blocks under the KV codec. Keys
carry the model (or ``namespace``), the tensor-parallel rank, the group's layout and the codecs,
so entries of other engines or layouts never mix, while every engine of the tenant's snapshot
namespace shares them, and through the daemon's host and Redis tiers engines on other nodes.

Where it runs: vLLM builds the spec twice. In the scheduler process ``get_manager()`` answers
vLLM's lookups from the daemon's indexes, one request per request and step
(``_vllm_manager``); in each worker process ``get_worker()`` moves pages between vLLM's
KV-cache tensors and the daemon through a staging buffer, one copy, on a transfer thread with
its own connection, so vLLM's step never waits for the daemon (``_vllm_worker``).

Failure behaviour: a dead, hung, full or foreign daemon gives misses and failed transfers,
logged once per kind, never an exception into vLLM. A failed load makes vLLM recompute the
request, which vLLM 0.32 cannot do with its own OffloadingConnector (it asserts that every
transfer succeeded, and the engine dies): ``StatepoolConnector`` is that connector with vLLM
0.34's handling of failed loads, and on 0.32 the spec refuses to run without it. From 0.34 on
vLLM's own ``OffloadingConnector`` works too.

Where the code is: this module has the spec and the connector; the private modules beside it
hold the settings (``_vllm_settings``), the groups and keys (``_vllm_geometry``), the
connections (``_vllm_session``, over ``_daemon_link``, which statepool.sglang shares: the
per-thread sessions and the failure reporting), the manager, the worker and the counters
(``_vllm_metrics``).
"""

from __future__ import annotations

import logging
from typing import Any, Dict

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec
from vllm.v1.kv_offload.config import OffloadingConfig

import statepool

from ._daemon_link import Reporter
from ._vllm_geometry import (
    FORMAT,
    KEY_PREFIX,
    Geometry,
    KvGroup,
    StatepoolKeys,
    building_with,
    find_kv_cache_config,
)
from ._vllm_manager import StatepoolOffloadingManager
from ._vllm_metrics import COUNTERS, Counters, metric_definitions
from ._vllm_session import Sessions
from ._vllm_settings import VLLM_KEYS, Settings
from ._vllm_worker import StatepoolOffloadingWorker

__all__ = ["StatepoolOffloadingSpec", "StatepoolConnector", "StatepoolOffloadingManager",
           "StatepoolOffloadingWorker", "StatepoolKeys", "Settings", "COUNTERS", "KEY_PREFIX",
           "FORMAT", "VLLM_KEYS", "VLLM_REPORTS_FAILED_LOADS"]

logger = logging.getLogger("statepool.vllm")

# vLLM 0.34 and later hand a failed load to the scheduler (failed_recving, then recompute);
# 0.32 asserts that every transfer succeeded.
VLLM_REPORTS_FAILED_LOADS = hasattr(OffloadingConnectorWorker, "take_failed_recving")


def _log_where_vllm_logs() -> None:
    """The spec logs under "statepool.vllm"; vLLM configures only its own "vllm" logger, so,
    unless someone configured ours, it gets vLLM's handlers and level (vLLM's format, in
    vLLM's log) and, as vLLM's own logger, does not propagate (no second copy through a root
    handler that some library set up)."""
    ours = logging.getLogger("statepool.vllm")
    theirs = logging.getLogger("vllm")
    if ours.handlers or ours.level != logging.NOTSET or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False


class StatepoolOffloadingSpec(OffloadingSpec):
    """vLLM's OffloadingSpec over statepool (module docstring; docs/vllm.md)."""

    @classmethod
    def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, Any]:
        return metric_definitions()

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        _log_where_vllm_logs()
        self.settings = Settings.from_extra_config(self.extra_config)
        kv_cache_config, ours = find_kv_cache_config()
        if not ours and not VLLM_REPORTS_FAILED_LOADS:
            raise ValueError(
                "statepool.vllm: vLLM's own OffloadingConnector of this vLLM version asserts "
                "that every transfer succeeds, so a load that statepool cannot serve would "
                "kill the engine. Use statepool's connector: \"kv_connector\": "
                "\"StatepoolConnector\", \"kv_connector_module_path\": \"statepool.vllm\", "
                "\"kv_load_failure_policy\": \"recompute\" (docs/vllm.md)")
        if kv_cache_config is None:
            raise ValueError("statepool.vllm: the KV-cache config is not at hand; use "
                             "\"kv_connector\": \"StatepoolConnector\", "
                             "\"kv_connector_module_path\": \"statepool.vllm\" (docs/vllm.md)")
        if self.blocks_per_chunk != 1:
            raise ValueError(f"statepool.vllm stores one block per key: leave block_size and "
                             f"blocks_per_chunk unset (blocks_per_chunk is "
                             f"{self.blocks_per_chunk})")
        p = config.parallel
        if p.pp_size != 1 or p.pcp_size != 1 or p.dcp_size != 1:
            raise ValueError("statepool.vllm: pipeline and context parallelism are not "
                             f"supported (pp {p.pp_size}, pcp {p.pcp_size}, dcp {p.dcp_size}); "
                             "tensor and data parallelism are")
        plan = statepool.Plan.load(self.settings.state_plan) if (
            self.settings.state_plan and self.settings.stepquant_bits) else None
        self._kv_cache_config = kv_cache_config
        self._plan = plan
        self._geometries: Dict[int, Geometry] = {}
        geo = self.geometry(p.rank)
        for gid, group in geo.groups.items():
            kind = ("attention: KV blocks, kv_codec " + self.settings.kv_codec
                    if isinstance(group, KvGroup) else
                    f"Mamba: state snapshots {group.layout}, state_codec "
                    f"{self.settings.state_codec}")
            logger.info("statepool vLLM offloading: group %d (%d layers) stored (%s)", gid,
                        group.layers, kind)
        for gid, why in geo.refused.items():
            logger.warning("statepool vLLM offloading: group %d is not stored: %s; requests "
                           "that need it miss", gid, why)

    def geometry(self, rank: int) -> Geometry:
        """The groups and keys of a tensor-parallel rank."""
        geo = self._geometries.get(rank)
        if geo is None:
            geo = Geometry(self.config, self._kv_cache_config, self.settings, self._plan, rank)
            self._geometries[rank] = geo
        return geo

    def _sessions(self, counters: Counters, role: str, timeout: float,
                  backoff: bool) -> Sessions:
        reporter = Reporter(logger, "statepool vLLM offloading",
                            lambda: counters.add(failures=1))
        return Sessions(self.settings, reporter, f"vllm-{role}", timeout, backoff,
                        lambda: counters.add(reconnects=1))

    def get_manager(self) -> StatepoolOffloadingManager:
        counters = Counters()
        sessions = self._sessions(counters, "scheduler", self.settings.lookup_timeout, True)
        ranks = range(self.config.parallel.tp_size)
        return StatepoolOffloadingManager([self.geometry(r) for r in ranks], sessions,
                                          sessions.reporter, counters)

    def get_worker(self, kv_caches: CanonicalKVCaches) -> StatepoolOffloadingWorker:
        counters = Counters()
        sessions = self._sessions(counters, "worker", self.settings.timeout, False)
        order = [g.group_id for g in self.config.groups]
        return StatepoolOffloadingWorker(self.geometry(self.config.parallel.rank), order,
                                         kv_caches, sessions, sessions.reporter, counters)


class StatepoolConnector(OffloadingConnector):
    """vLLM's OffloadingConnector, handing statepool's spec the KV-cache config it is built
    with, and on vLLM 0.32 reporting a failed load to the scheduler (``failed_recving``: with
    ``kv_load_failure_policy`` "recompute" vLLM recomputes the request) instead of asserting,
    as vLLM 0.34 does. A failed store is a completed job: the manager asks the daemon, so a
    store that did not happen is a later miss. Name it with ``"kv_connector":
    "StatepoolConnector", "kv_connector_module_path": "statepool.vllm"``."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        with building_with(kv_cache_config):
            super().__init__(vllm_config, role, kv_cache_config)
        self._failed_loads: set = set()
        policy = getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", "recompute")
        if role == KVConnectorRole.SCHEDULER and policy != "recompute":
            logger.warning("statepool vLLM offloading: kv_load_failure_policy is %r: a load "
                           "statepool cannot serve (the daemon died or evicted the entry "
                           "since the lookup) fails the request; set it to \"recompute\"",
                           policy)

    if not VLLM_REPORTS_FAILED_LOADS:

        def get_finished(self, finished_req_ids: set) -> tuple:
            """vLLM 0.32's OffloadingConnectorWorker.get_finished without its assertion that
            every job succeeded: a failed load finishes its request and is remembered for
            get_transfer_results."""
            w = self.connector_worker
            assert w is not None and w.worker is not None
            finished_recving = set()
            for result in w.worker.get_finished():
                job_id = result.job_id
                is_load = job_id in w._load_jobs
                if (result.success and result.transfer_time is not None
                        and result.transfer_size is not None):
                    stats = (w._connector_worker_meta.transfer_stats.load if is_load
                             else w._connector_worker_meta.transfer_stats.store)
                    stats.record(result.transfer_size, result.transfer_time)
                w._connector_worker_meta.mark_completed(job_id)
                req_id = w._load_jobs.pop(job_id, None)
                if req_id is not None:
                    finished_recving.add(req_id)
                    if not result.success:
                        self._failed_loads.add(req_id)
            return set(), finished_recving

        def get_transfer_results(self, finished_req_ids: set) -> Any:
            results = super().get_transfer_results(finished_req_ids)
            results.failed_recving = set(self._failed_loads)
            self._failed_loads.clear()
            return results

