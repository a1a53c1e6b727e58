"""The leader's periodic self-check: its bookkeeping against a recount from the watch caches.

The leader keeps its numbers incrementally (a claim counted at admission, a pod's arrival
counted only when it changes what the claim held, a GPUNode update skipped when nothing
counted changed), so a missed event or a bug would stay until something else touched the
node. Every ``interval_s`` this check recounts from the pod cache and the GPUNodes, logs
each difference (where, what the leader holds, what the recount says), counts it for
``/metrics`` and repairs it: the recount wins, except for claims whose pods are legitimately
not visible yet (in flight, inside their TTL), which the recount keeps.

What it compares, in order (later steps use the repaired earlier ones):

1. pod liveness with the pod cache: which pods are live, on which node, with which
   reservation (a wrong answer here changes what every reservation holds);
2. the ledger's claims: a claim whose pod is live, or came and went, should have been
   dropped when the pod appeared, and is dropped; an admission window open for a live pod
   is closed;
3. the view with a recount of every node: which nodes it has, their inventory, and the use
   counted on each GPU and node (CPU, memory); a node that differs is recounted.

Each pod, claim and node is compared within one step of the event loop, so it sees one
consistent moment of the caches and the ledger; ``check`` lets admissions run between
batches of nodes.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from webhook.cluster.ledger import ClaimLedger
from webhook.cluster.liveness import PodLiveness
from webhook.cluster.records import GPUNodeRecord, PodRecord
from webhook.cluster.viewsync import NodeUse, ViewSync
from webhook.cluster.watchcache import WatchCache

log = logging.getLogger(__name__)
# Nodes compared between two chances for admissions to run (see ``check``).
NODES_PER_STEP = 100


class DriftKind(StrEnum):
    POD = "pod"  # liveness disagrees with the pod cache
    CLAIM = "claim"  # the ledger holds a claim that holds nothing
    WINDOW = "window"  # an admission window open for a pod that is live
    NODE = "node"  # the view has a node the caches do not, lacks one, or has another inventory
    GPU = "gpu"  # a GPU's counted use differs from the recount
    NODE_USE = "node-use"  # a node's counted CPU or memory differs from the recount


@dataclass(frozen=True)
class Drift:
    """One difference: where, what the leader's bookkeeping held, what the recount says."""

    kind: DriftKind
    where: str
    ledger: str
    recount: str

    def __str__(self) -> str:
        return f"{self.where}: ledger: {self.ledger}; recount: {self.recount}"


class LedgerSelfCheck:
    """Compares, logs, counts and repairs; ``run`` does it every ``interval_s``."""

    def __init__(
        self,
        *,
        pods: WatchCache[PodRecord],
        gpunodes: WatchCache[GPUNodeRecord],
        ledger: ClaimLedger,
        liveness: PodLiveness,
        sync: ViewSync,
        interval_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._pods = pods
        self._gpunodes = gpunodes
        self._ledger = ledger
        self._liveness = liveness
        self._sync = sync
        self._interval_s = interval_s
        self._clock = clock
        self.repairs: dict[str, int] = dict.fromkeys(DriftKind, 0)  # since start, by kind
        self.drifted: dict[str, int] = dict.fromkeys(DriftKind, 0)  # by the last check
        self.checks = 0

    async def run(self, ready: Callable[[], bool]) -> None:
        """Check every ``interval_s`` once the caches are synced; runs until cancelled."""
        while True:
            await asyncio.sleep(self._interval_s)
            if not ready():
                continue
            try:
                await self.check()
            except Exception:
                # A fault in the check must not end the leader's work (its caller's gather).
                log.exception("state self-check failed")

    def check_once(self) -> list[Drift]:
        """One comparison in one step; every drift found is logged, counted and repaired."""
        found = [*self._check_liveness(), *self._check_claims()]
        found.extend(self._check_nodes(self._node_names(), self._clock()))
        return self._record(found)

    async def check(self) -> list[Drift]:
        """``check_once`` that lets admissions in between batches of nodes (the node
        comparison costs ~10 us per pod: a large cluster would hold the event loop for
        tens of milliseconds). Each node is still compared within one step."""
        found = [*self._check_liveness(), *self._check_claims()]
        names = self._node_names()
        for start in range(0, len(names), NODES_PER_STEP):
            await asyncio.sleep(0)
            found.extend(self._check_nodes(names[start : start + NODES_PER_STEP], self._clock()))
        return self._record(found)

    def _record(self, found: list[Drift]) -> list[Drift]:
        self.checks += 1
        self.drifted = dict.fromkeys(DriftKind, 0)
        for drift in found:
            self.drifted[drift.kind] += 1
            self.repairs[drift.kind] += 1
            log.warning("state drift repaired (%s) at %s", drift.kind, drift)
        return found

    # -- 1. liveness ----------------------------------------------------------------------------
    def _check_liveness(self) -> list[Drift]:
        followed = self._liveness.live_pods()
        reservation_of = {key: rid for rid, key in self._liveness.live_reservation_ids().items()}
        # The rule liveness follows: a pod is live while it has a node and has not finished.
        live = {key: pod for key, pod in self._pods.items() if not pod.terminal and pod.node}
        drifts = []
        for key in sorted(followed.keys() | live.keys()):
            pod = live.get(key)
            node = followed.get(key)
            rid = reservation_of.get(key, "")
            if pod is not None and node == pod.node and rid == pod.reservation_id:
                continue
            ledger = "not live" if node is None else _live_on(node, rid)
            if pod is None:
                cached = self._pods.get(key)
                recount = "not in the pod cache" if cached is None else "finished"
            else:
                recount = _live_on(pod.node, pod.reservation_id)
            namespace = key.split("/", 1)[0]
            drifts.append(Drift(DriftKind.POD, f"namespace {namespace} pod {key}", ledger, recount))
            for changed in self._liveness.forget_pod(key, departed=pod is None):
                self._sync.changed(changed)
            if pod is not None:
                self._liveness.pod_changed(key, None, pod)
                if pod.reservation_id:
                    self._ledger.pod_live(pod.reservation_id)
                self._sync.changed(pod.node)
        return drifts

    # -- 2. the ledger's claims ---------------------------------------------------------------
    def _check_claims(self) -> list[Drift]:
        departed = self._liveness.departed_reservation_ids()
        drifts = []
        for held in list(self._ledger.inflight_claims()):
            reservation = held.claim.reservation
            rid = reservation.id
            if self._liveness.is_live(rid):
                recount = "its pod is live"
            elif rid in departed:
                recount = "its pod came and went"
            else:
                # In flight: its pod may not be visible yet. One that expired or lost its
                # GPUNode holds nothing, and the ledger and the writer let it go soon.
                continue
            where = f"namespace {reservation.namespace} claim {rid} on node {reservation.node}"
            drifts.append(Drift(DriftKind.CLAIM, where, "holds it", recount))
            self._ledger.drop(rid)
            self._sync.changed(reservation.node)
        for rid in sorted(self._ledger.in_window()):
            if self._liveness.is_live(rid):
                where = f"reservation {rid}"
                drifts.append(Drift(DriftKind.WINDOW, where, "window open", "its pod is live"))
                self._ledger.end_window(rid)
        return drifts

    # -- 3. the view ----------------------------------------------------------------------------
    def _node_names(self) -> list[str]:
        return sorted(self._sync.view_node_names() | {name for name, _ in self._gpunodes.items()})

    def _check_nodes(self, names: list[str], now: float) -> list[Drift]:
        """Compare these nodes of the view with a recount, all as of ``now``."""
        # The view recounts a node when an event touches it; a reservation that merely
        # expired touches nothing until the controllers prune it. Not drift: recount first.
        for name in names:
            record = self._gpunodes.get(name)
            if record is not None and any(r.expires_at <= now for r in record.reservations):
                self._sync.changed(name)
        wanted = set(names)
        for held in self._ledger.inflight_claims():
            reservation = held.claim.reservation
            if reservation.node in wanted and reservation.expires_at <= now:
                self._sync.changed(reservation.node)
        self._sync.view(now)  # recount what is already known to have changed
        drifts = []
        for name in names:
            found = self._node_drift(name, now)
            if found:
                drifts.extend(found)
                self._sync.changed(name)
        self._sync.view(now)
        return drifts

    def _node_drift(self, name: str, now: float) -> list[Drift]:
        expected = self._sync.expected_inventory(name)
        counted = self._sync.counted_use(name)
        where = f"node {name}"
        if expected is None or counted is None:
            if expected is None and counted is None:
                return []
            if expected is None:
                gone = "no GPUNode, no Node, or unschedulable"
                return [Drift(DriftKind.NODE, where, "counts the node", gone)]
            return [Drift(DriftKind.NODE, where, "lacks the node", "has it")]
        if self._sync.counted_inventory(name) != expected:
            return [Drift(DriftKind.NODE, where, "has another inventory", "the GPUNode's")]
        recounted = self._sync.recounted_use(expected, now)
        return _use_drift(where, counted, recounted)


def _use_drift(where: str, counted: NodeUse, recounted: NodeUse) -> list[Drift]:
    drifts = []
    if (counted.cpu_milli, counted.memory_mib) != (recounted.cpu_milli, recounted.memory_mib):
        drifts.append(Drift(DriftKind.NODE_USE, where, _node_use(counted), _node_use(recounted)))
    for uuid, use in counted.gpus.items():
        again = recounted.gpus.get(uuid, (0, 0, 0))
        if use != again:
            drifts.append(
                Drift(DriftKind.GPU, f"{where} GPU {uuid}", _gpu_use(use), _gpu_use(again))
            )
    return drifts


def _live_on(node: str, reservation_id: str) -> str:
    return f"live on node {node}" + (
        f" with reservation {reservation_id}" if reservation_id else ""
    )


def _node_use(use: NodeUse) -> str:
    return f"counts CPU {use.cpu_milli}m, memory {use.memory_mib} MiB"


def _gpu_use(use: tuple[int, int, int]) -> str:
    cores, memory, containers = use
    return f"counts {cores} cores, {memory} MiB, {containers} containers"
