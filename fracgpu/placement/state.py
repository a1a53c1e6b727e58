"""Free capacity as flat numpy arrays: one slot per GPU, one row per node.

GPUs of a node occupy consecutive slots, so per-node sums are ``np.add.reduceat``-free
``bincount`` calls and a node's GPUs are a slice. Removed nodes leave dead slots until the
arrays are compacted.
"""

from collections.abc import Iterable, KeysView
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fracgpu.model import GPUAllocation, GPUDevice, NodeInventory, virtual_memory_mib

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass
class _NodeRecord:
    inventory: NodeInventory
    first_slot: int
    split_count: int
    memory_scaling: float = 1.0


class ClusterState:
    """The mutable numbers behind ``ClusterView``; knows nothing about policies."""

    def __init__(self, gpu_units: int) -> None:
        self.gpu_units = gpu_units
        self._records: dict[str, _NodeRecord] = {}
        self._row_of: dict[str, int] = {}
        self._slot_of: dict[tuple[str, str], int] = {}
        # GPU UUID -> its slots (one, unless two nodes report the same UUID): a pod naming
        # GPUs is masked by looking its UUIDs up, not by testing every GPU of the cluster.
        self._slots_by_uuid: dict[str, list[int]] = {}
        self.devices: list[GPUDevice] = []
        self.node_names: list[str] = []
        self.models: list[str] = []
        self._model_id: dict[str, int] = {}
        self.topology_version = 0
        # Slot and row numbers only grow until a compaction renumbers them; it bumps this.
        self.layout_epoch = 0
        # per GPU slot
        self.g_node = np.zeros(0, np.int64)
        self.g_free = np.zeros(0, np.int64)
        self.g_mem_free = np.zeros(0, np.int64)
        self.g_mem_total = np.zeros(0, np.int64)
        self.g_cont = np.zeros(0, np.int64)
        self.g_split = np.zeros(0, np.int64)
        self.g_model = np.zeros(0, np.int64)
        self.g_live = np.zeros(0, np.bool_)  # node present, GPU healthy and not MIG
        # per node row
        self.n_cpu_free = np.zeros(0, np.int64)
        self.n_mem_free = np.zeros(0, np.int64)
        self.n_cpu_total = np.zeros(0, np.int64)
        self.n_mem_total = np.zeros(0, np.int64)
        self.n_live = np.zeros(0, np.bool_)
        self.n_free_units = np.zeros(0, np.int64)  # over live GPUs
        self.n_unit_capacity = np.zeros(0, np.int64)
        self.n_first = np.zeros(0, np.int64)
        self.n_count = np.zeros(0, np.int64)
        self.n_pool: list[str] = []

    # -- topology ----------------------------------------------------------------------------
    def add_node(self, node: NodeInventory, split_count: int, memory_scaling: float = 1.0) -> None:
        """Add a node; each GPU offers ``memory_scaling`` x its physical memory."""
        if node.name in self._records:
            raise ValueError(f"node {node.name!r} is already in the view")
        if node.cpu_milli < 0 or node.memory_mib < 0:
            raise ValueError(f"node {node.name!r}: CPU and memory must be 0 or more")
        uuids = [d.uuid for d in node.devices]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"node {node.name!r} lists a GPU UUID twice")
        row = len(self.node_names)
        first = len(self.devices)
        count = len(node.devices)
        self._records[node.name] = _NodeRecord(node, first, split_count, memory_scaling)
        self._row_of[node.name] = row
        self.node_names.append(node.name)
        self.n_pool.append(node.pool)
        for device in node.devices:
            self._slot_of[(node.name, device.uuid)] = len(self.devices)
            self._slots_by_uuid.setdefault(device.uuid, []).append(len(self.devices))
            self.devices.append(device)
        u = self.gpu_units
        self.g_node = _grow(self.g_node, [row] * count)
        self.g_free = _grow(self.g_free, [u] * count)
        offered = [virtual_memory_mib(d.memory_mib, memory_scaling) for d in node.devices]
        self.g_mem_free = _grow(self.g_mem_free, offered)
        self.g_mem_total = _grow(self.g_mem_total, offered)
        self.g_cont = _grow(self.g_cont, [0] * count)
        self.g_split = _grow(self.g_split, [split_count] * count)
        self.g_model = _grow(self.g_model, [self._model(d.model) for d in node.devices])
        self.g_live = _grow_bool(self.g_live, [d.shareable for d in node.devices])
        self.n_cpu_free = _grow(self.n_cpu_free, [node.cpu_milli])
        self.n_mem_free = _grow(self.n_mem_free, [node.memory_mib])
        self.n_cpu_total = _grow(self.n_cpu_total, [node.cpu_milli])
        self.n_mem_total = _grow(self.n_mem_total, [node.memory_mib])
        self.n_live = _grow_bool(self.n_live, [True])
        live_units = u * sum(1 for d in node.devices if d.shareable)
        self.n_free_units = _grow(self.n_free_units, [live_units])
        self.n_unit_capacity = _grow(self.n_unit_capacity, [live_units])
        self.n_first = _grow(self.n_first, [first])
        self.n_count = _grow(self.n_count, [count])
        self.topology_version += 1

    def remove_node(self, name: str) -> None:
        record = self._records.pop(name, None)
        if record is None:
            return
        row = self._row_of.pop(name)
        for device in record.inventory.devices:
            slot = self._slot_of.pop((name, device.uuid), None)
            slots = self._slots_by_uuid.get(device.uuid, [])
            if slot in slots:
                slots.remove(slot)
            if not slots:
                self._slots_by_uuid.pop(device.uuid, None)
        self.n_live[row] = False
        self.g_live[record.first_slot : record.first_slot + len(record.inventory.devices)] = False
        self.topology_version += 1
        if len(self.node_names) > 2 * len(self._records) + 16:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the arrays from the live nodes, keeping their free capacity."""
        fresh = ClusterState(self.gpu_units)
        for record in self._records.values():
            cpu, mem, free, mem_free, cont = self.node_snapshot(record.inventory.name)
            fresh.add_node(record.inventory, record.split_count, record.memory_scaling)
            row = fresh.row(record.inventory.name)
            s = fresh.slots_of_row(row)
            fresh.n_cpu_free[row], fresh.n_mem_free[row] = cpu, mem
            fresh.g_free[s.start : s.stop] = free
            fresh.g_mem_free[s.start : s.stop] = mem_free
            fresh.g_cont[s.start : s.stop] = cont
            fresh.n_free_units[row] = int(free[fresh.g_live[s.start : s.stop]].sum())
        fresh.topology_version = self.topology_version + 1
        fresh.layout_epoch = self.layout_epoch + 1
        self.__dict__.update(fresh.__dict__)

    def _model(self, name: str) -> int:
        if name not in self._model_id:
            self._model_id[name] = len(self.models)
            self.models.append(name)
        return self._model_id[name]

    # -- changes -------------------------------------------------------------------------------
    def apply(
        self,
        node: str,
        allocations: Iterable[GPUAllocation],
        cpu_milli: int,
        memory_mib: int,
        sign: int,
    ) -> int | None:
        """Add (sign 1) or remove (sign -1) a pod's use; returns the node row, None if unknown."""
        row = self._row_of.get(node)
        if row is None:
            return None
        if cpu_milli:  # numpy scalar updates are slow; many GPU pods ask for no CPU
            self.n_cpu_free[row] -= sign * cpu_milli
        if memory_mib:
            self.n_mem_free[row] -= sign * memory_mib
        for alloc in allocations:
            slot = self._slot_of.get((node, alloc.uuid))
            if slot is None:
                continue
            self.g_free[slot] -= sign * alloc.cores
            if self.g_live[slot]:
                self.n_free_units[row] -= sign * alloc.cores
            self.g_mem_free[slot] -= sign * alloc.memory_mib
            self.g_cont[slot] += sign
        return row

    def reset_usage(self, node: str) -> int | None:
        """Free everything on one node (inventory unchanged); returns its row, None if unknown."""
        row = self._row_of.get(node)
        if row is None:
            return None
        s = self.slots_of_row(row)
        self.g_free[s.start : s.stop] = self.gpu_units
        self.g_mem_free[s.start : s.stop] = self.g_mem_total[s.start : s.stop]
        self.g_cont[s.start : s.stop] = 0
        self.n_cpu_free[row] = self.n_cpu_total[row]
        self.n_mem_free[row] = self.n_mem_total[row]
        self.n_free_units[row] = self.n_unit_capacity[row]
        return row

    def take(
        self, row: int, cpu_milli: int, memory_mib: int, per_gpu: dict[str, list[int]]
    ) -> None:
        """Count use on node ``row``: CPU, memory, and per GPU UUID [cores, MiB, containers]
        (unknown UUIDs are ignored, as in ``apply``)."""
        self.n_cpu_free[row] -= cpu_milli
        self.n_mem_free[row] -= memory_mib
        name = self.node_names[row]
        for uuid, (cores, memory, containers) in per_gpu.items():
            slot = self._slot_of.get((name, uuid))
            if slot is None:
                continue
            self.g_free[slot] -= cores
            if self.g_live[slot]:
                self.n_free_units[row] -= cores
            self.g_mem_free[slot] -= memory
            self.g_cont[slot] += containers

    # -- lookups ---------------------------------------------------------------------------------
    def has_node(self, name: str) -> bool:
        return name in self._records

    def inventories(self) -> tuple[NodeInventory, ...]:
        return tuple(r.inventory for r in self._records.values())

    def inventory(self, name: str) -> NodeInventory | None:
        record = self._records.get(name)
        return None if record is None else record.inventory

    def memory_scaling(self, name: str) -> float:
        record = self._records.get(name)
        return 1.0 if record is None else record.memory_scaling

    def node_count(self) -> int:
        return len(self._records)

    def live_node_names(self) -> KeysView[str]:
        return self._records.keys()

    def row(self, node: str) -> int:
        return self._row_of[node]

    def slot(self, node: str, uuid: str) -> int:
        return self._slot_of[(node, uuid)]

    def slots_of(self, node: str, allocations: Iterable[GPUAllocation]) -> list[int]:
        """The slots of the GPUs ``allocations`` use on ``node`` (unknown GPUs left out)."""
        found = (self._slot_of.get((node, alloc.uuid)) for alloc in allocations)
        return [slot for slot in found if slot is not None]

    def slots_with_uuids(self, uuids: Iterable[str]) -> list[int]:
        """The slots of the GPUs with these UUIDs, on any node (unknown UUIDs left out)."""
        by_uuid = self._slots_by_uuid
        return [slot for uuid in uuids for slot in by_uuid.get(uuid, ())]

    def slots_of_row(self, row: int) -> range:
        first = int(self.n_first[row])
        return range(first, first + int(self.n_count[row]))

    def usage_of(self, name: str) -> tuple[tuple[int, int], list[tuple[int, int, int]]]:
        """``node_snapshot`` as plain values to compare: ((free CPU, free memory), per GPU
        slot (free cores, free MiB, containers))."""
        cpu, memory, free, memory_free, containers = self.node_snapshot(name)
        per_gpu = zip(free.tolist(), memory_free.tolist(), containers.tolist(), strict=True)
        return (cpu, memory), list(per_gpu)

    def node_snapshot(self, name: str) -> tuple[int, int, IntArray, IntArray, IntArray]:
        row = self._row_of[name]
        s = self.slots_of_row(row)
        return (
            int(self.n_cpu_free[row]),
            int(self.n_mem_free[row]),
            self.g_free[s.start : s.stop].copy(),
            self.g_mem_free[s.start : s.stop].copy(),
            self.g_cont[s.start : s.stop].copy(),
        )


def _grow(array: IntArray, values: list[int]) -> IntArray:
    return np.concatenate([array, np.asarray(values, dtype=np.int64)])


def _grow_bool(array: BoolArray, values: list[bool]) -> BoolArray:
    return np.concatenate([array, np.asarray(values, dtype=np.bool_)])
