"""Reading and writing traces in the openb CSV format, and mapping them to placement demands.

Node list columns: sn, cpu_milli, memory_mib, gpu, model.
Pod list columns: name, cpu_milli, memory_mib, num_gpu, gpu_milli, and optionally gpu_spec
(absent or empty: any GPU model); other columns are ignored.
"""

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fracgpu.model import ContainerRequest, GPUDevice, MemoryRequest, NodeInventory
from fracgpu.placement import Constraints, PodDemand

MILLI_PER_GPU = 1000
# The trace has no CPU request for some pods; the paper's simulator reads 0 as 100m.
CPU_ZERO_READS_AS = 100
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
# gpu_spec may be left out: a trace without model constraints.
REQUIRED_POD_COLUMNS = POD_COLUMNS[:-1]


class TraceError(ValueError):
    """A trace file that does not follow the openb format."""


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, thousandths of one GPU
    gpu_spec: tuple[str, ...] = ()  # allowed models; empty = any

    @property
    def gpu_request(self) -> int:
        """The pod's GPU request in thousandths of a GPU (num_gpu x gpu_milli)."""
        return self.num_gpu * self.gpu_milli


def _rows(path: Path, columns: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from e
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path}: missing column(s) {', '.join(missing)}; "
                f"the openb format needs {', '.join(columns)}"
            )
        yield from enumerate(reader, start=2)


def _int(where: str, row: dict[str, str], column: str, low: int, high: int) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{where}: {column}={text!r} is not an integer") from None
    if not low <= value <= high:
        raise TraceError(f"{where}: {column}={value} is out of range {low}..{high}")
    return value


def read_nodes(path: Path) -> list[TraceNode]:
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name or name in seen:
            raise TraceError(f"{path}:{line}: node name {name!r} is empty or repeated")
        seen.add(name)
        nodes.append(
            TraceNode(
                name,
                _int(f"{path}:{line}", row, "cpu_milli", 0, 10**9),
                _int(f"{path}:{line}", row, "memory_mib", 0, 10**12),
                _int(f"{path}:{line}", row, "gpu", 0, 1024),
                row["model"].strip(),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    pods: list[TracePod] = []
    for line, row in _rows(path, REQUIRED_POD_COLUMNS):
        num_gpu = _int(f"{path}:{line}", row, "num_gpu", 0, 1024)
        gpu_milli = _int(f"{path}:{line}", row, "gpu_milli", 0, MILLI_PER_GPU)
        if num_gpu > 0 and gpu_milli == 0:
            raise TraceError(f"{path}:{line}: num_gpu={num_gpu} needs gpu_milli 1..1000, got 0")
        if num_gpu == 0 and gpu_milli != 0:
            raise TraceError(f"{path}:{line}: gpu_milli={gpu_milli} with num_gpu=0")
        cpu = _int(f"{path}:{line}", row, "cpu_milli", 0, 10**9)
        spec = tuple(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        pods.append(
            TracePod(
                row["name"].strip(),
                cpu if cpu > 0 else CPU_ZERO_READS_AS,
                _int(f"{path}:{line}", row, "memory_mib", 0, 10**12),
                num_gpu,
                gpu_milli,
                spec,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def write_pods(path: Path, pods: Iterable[TracePod]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(POD_COLUMNS)
        for p in pods:
            writer.writerow(
                [p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "|".join(p.gpu_spec)]
            )


def write_nodes(path: Path, nodes: Iterable[TraceNode]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(NODE_COLUMNS)
        for n in nodes:
            writer.writerow([n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model])


def to_inventory(node: TraceNode) -> NodeInventory:
    """The trace has no GPU memory: cards get 0 MiB and pods ask 0 MiB, so it never binds."""
    devices = tuple(
        GPUDevice(uuid=f"{node.name}/gpu{i}", index=i, model=node.model, memory_mib=0)
        for i in range(node.gpus)
    )
    return NodeInventory(node.name, devices, node.cpu_milli, node.memory_mib)


def to_demand(pod: TracePod) -> PodDemand:
    """One container: a share of one GPU, or whole GPUs (compute in thousandths, exactly)."""
    containers: tuple[ContainerRequest, ...] = ()
    if pod.num_gpu > 0:
        containers = (ContainerRequest("main", pod.num_gpu, pod.gpu_milli, MemoryRequest(mib=0)),)
    return PodDemand(
        containers,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        constraints=Constraints(include_models=pod.gpu_spec, exact_models=True),
    )
