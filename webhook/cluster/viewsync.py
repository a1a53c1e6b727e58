"""Keeps the placement view (``ClusterView``) in step with the watch caches and the ledger.

Watch events mark nodes dirty; ``refresh`` recounts only those, from live pods, the open
reservations of their GPUNode and the claims the ledger holds unwritten. It also tracks which
nodes changed since the controllers last published their summaries, and the labels and taints
of GPU nodes (read by admission on every pod, rebuilt only after a Node or GPUNode came,
went or changed).
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from fracgpu.model import NodeInventory, virtual_memory_mib
from fracgpu.placement import ClusterView, Usage
from webhook.cluster.ledger import ClaimLedger
from webhook.cluster.liveness import PodLiveness
from webhook.cluster.records import GPUNodeRecord, NodeRecord, PodRecord
from webhook.cluster.watchcache import WatchCache
from webhook.rules.tolerations import Taint
from webhook.state.backend import Claim


@dataclass(frozen=True)
class NodeUse:
    """What is counted on one node: CPU millicores, memory MiB, and per GPU UUID (cores,
    memory MiB, containers)."""

    cpu_milli: int
    memory_mib: int
    gpus: Mapping[str, tuple[int, int, int]]


class ViewSync:
    """The view admission plans against, recounted node by node as the caches change."""

    def __init__(
        self,
        *,
        pods: WatchCache[PodRecord],
        nodes: WatchCache[NodeRecord],
        gpunodes: WatchCache[GPUNodeRecord],
        liveness: PodLiveness,
        ledger: ClaimLedger,
        split_count: int,
        memory_scaling: float,
        held_whole_nodes: int,
        clock: Callable[[], float],
    ) -> None:
        self._pods = pods
        self._nodes = nodes
        self._gpunodes = gpunodes
        self._liveness = liveness
        self._ledger = ledger
        self._clock = clock
        self._view = ClusterView(
            (),
            default_split_count=split_count,
            default_memory_scaling=memory_scaling,
            held_whole_nodes=held_whole_nodes,
        )
        self._dirty: set[str] = set()  # nodes to recount in the view
        # Nodes changed since the controllers last summarised; None = all (nothing taken yet).
        self._unsummarised: set[str] | None = None
        self._labels: dict[str, Mapping[str, str]] | None = None
        self._taints: dict[str, tuple[Taint, ...]] | None = None
        nodes.add_listener(self._on_node)
        gpunodes.add_listener(self._on_gpunode)

    def view(self, now: float | None = None) -> ClusterView:
        """The view with every dirty node recounted (as of ``now``, default the clock)."""
        if self._dirty:
            self._refresh(self._clock() if now is None else now)
        return self._view

    def allocate(self, claim: Claim) -> None:
        """Count a claim just reserved at once (the ledger holds it from now on)."""
        held = claim.reservation
        self._view.allocate(held.node, held.allocations, claim.cpu_milli, claim.memory_mib)

    # -- what changed -------------------------------------------------------------------------
    def changed(self, node: str) -> None:
        """Recount ``node`` before the view is next read, and summarise it again."""
        if not node:
            return  # a queued pod or its claim: on no node yet
        self._dirty.add(node)
        if self._unsummarised is not None:
            self._unsummarised.add(node)

    def summary_changed(self, node: str) -> None:
        """The view already counts ``node`` right; only its published summary is due."""
        if self._unsummarised is not None:
            self._unsummarised.add(node)

    def take_changed_nodes(self) -> set[str] | None:
        """Nodes whose GPUNode, Node or pods changed since the last call (None on the first
        call: every node), so the controllers summarise only those."""
        changed, self._unsummarised = self._unsummarised, set()
        return changed

    def requeue_changed_nodes(self, nodes: Iterable[str]) -> None:
        """Hand back nodes taken but not summarised (the round failed part way)."""
        if self._unsummarised is not None:
            self._unsummarised.update(nodes)

    def _on_node(self, key: str, old: NodeRecord | None, new: NodeRecord | None) -> None:
        self.changed(key)
        self._labels = self._taints = None

    def _on_gpunode(self, key: str, old: GPUNodeRecord | None, new: GPUNodeRecord | None) -> None:
        if old is not None and new is not None and old.counted() == new.counted():
            # Only what the leader publishes changed (its own summary write, one per changed
            # node and controller round): the view would recount the same, so it is not.
            self.summary_changed(key)
            return
        self.changed(key)
        if old is None or new is None:
            self._labels = self._taints = None

    # -- labels and taints ----------------------------------------------------------------------
    def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        if self._labels is None:
            self._labels = {
                name: dict(node.labels)
                for name, node in self._nodes.items()
                if self._gpunodes.get(name) is not None
            }
        return self._labels

    def node_taints(self) -> Mapping[str, tuple[Taint, ...]]:
        if self._taints is None:
            self._taints = {
                name: node.taints
                for name, node in self._nodes.items()
                if node.taints and self._gpunodes.get(name) is not None
            }
        return self._taints

    # -- recounting -------------------------------------------------------------------------------
    def _refresh(self, now: float) -> None:
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            record = self._gpunodes.get(name)
            node = self._nodes.get(name)
            if record is None or record.unschedulable or node is None:
                # No Node of that name (deleted, renamed, not registered yet): a pod pinned
                # there would stay Pending forever. The Node's arrival recounts it (_on_node).
                self._view.remove_node(name)
                continue
            inventory = record.inventory(node)
            if self._view.inventory(name) != inventory:
                # A new node or a changed inventory is a topology change; anything else (the
                # usual case: a pod or reservation came or went) only recounts the node.
                self._view.remove_node(name)
                self._view.add_node(inventory)
            self._view.set_usage(name, self.usage_on(name, record, now))

    def usage_on(self, name: str, record: GPUNodeRecord, now: float) -> Iterator[Usage]:
        """What holds capacity on a node: live pods, open reservations, claims in flight."""
        holds = self._liveness.holds_capacity
        for key in self._liveness.pods_on(name):
            pod = self._pods.get(key)
            if pod is None or pod.terminal:
                continue
            yield pod.allocations, pod.cpu_milli, pod.memory_mib
        recorded = set()
        for held in record.reservations:
            recorded.add(held.id)
            if holds(held, now):
                yield held.allocations, 0, 0
        for unwritten in self._ledger.inflight_claims():
            claim = unwritten.claim
            held = claim.reservation
            if held.node == name and held.id not in recorded and holds(held, now):
                yield held.allocations, claim.cpu_milli, claim.memory_mib

    # -- what the self-check compares ----------------------------------------------------------
    def expected_inventory(self, name: str) -> NodeInventory | None:
        """The node as the caches describe it, or None where the view must not have it."""
        record = self._gpunodes.get(name)
        node = self._nodes.get(name)
        if record is None or record.unschedulable or node is None:
            return None
        return record.inventory(node)

    def counted_use(self, name: str) -> NodeUse | None:
        """What the view counts on ``name`` now (None: not in the view)."""
        inventory = self._view.inventory(name)
        if inventory is None:
            return None
        cpu_free, memory_free = self._view.node_free(name)
        scaling = self._view.memory_scaling(name)
        units = self._view.gpu_units
        gpus = {}
        for device in inventory.devices:
            cores_free, gpu_memory_free, containers = self._view.gpu_free(name, device.uuid)
            offered = virtual_memory_mib(device.memory_mib, scaling)
            gpus[device.uuid] = (units - cores_free, offered - gpu_memory_free, containers)
        return NodeUse(inventory.cpu_milli - cpu_free, inventory.memory_mib - memory_free, gpus)

    def recounted_use(self, inventory: NodeInventory, now: float) -> NodeUse:
        """What a recount from scratch counts on the node (GPUs it does not have ignored, as
        the view ignores them)."""
        record = self._gpunodes.get(inventory.name)
        gpus = {d.uuid: [0, 0, 0] for d in inventory.devices}
        cpu = memory = 0
        uses = self.usage_on(inventory.name, record, now) if record is not None else ()
        for allocations, cpu_milli, memory_mib in uses:
            cpu += cpu_milli
            memory += memory_mib
            for alloc in allocations:
                counted = gpus.get(alloc.uuid)
                if counted is not None:
                    counted[0] += alloc.cores
                    counted[1] += alloc.memory_mib
                    counted[2] += 1
        return NodeUse(cpu, memory, {uuid: (c[0], c[1], c[2]) for uuid, c in gpus.items()})

    def counted_inventory(self, name: str) -> NodeInventory | None:
        return self._view.inventory(name)

    def view_node_names(self) -> set[str]:
        return {inventory.name for inventory in self._view.nodes()}
