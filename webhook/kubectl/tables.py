"""Readable tables for the terminal (aligned columns, like kubectl get)."""

from __future__ import annotations

from collections.abc import Sequence

from fracgpu.model import Quota, ResourceLimits
from webhook.kubectl.report import NodesView, PodReport


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _ratio(allocated: int, total: int) -> str:
    percent = f" ({allocated * 100 // total}%)" if total else ""
    return f"{allocated}/{total}{percent}"


def nodes_table(view: NodesView) -> str:
    rows: list[list[str]] = []
    cores = cores_total = memory = memory_total = 0
    for node in view.nodes:
        if not node.gpus:
            rows.append([node.name, "-", "-", "-", "-", "-", "no GPUs reported"])
        split = "default" if node.split_count is None else str(node.split_count)
        for i, gpu in enumerate(node.gpus):
            pods = ", ".join(f"{s.owner} {s.cores}c/{s.memory_mib}MiB" for s in gpu.slices) or "-"
            model = gpu.model if gpu.healthy else f"{gpu.model} (UNHEALTHY)"
            if gpu.mig:
                model += " (MIG: not shared)"
            rows.append(
                [
                    node.name if i == 0 else "",
                    str(gpu.index),
                    model,
                    "MIG" if gpu.mig else _ratio(gpu.cores_allocated, gpu.cores_total),
                    "MIG" if gpu.mig else _ratio(gpu.memory_allocated_mib, gpu.memory_total_mib),
                    "-" if gpu.mig else f"{gpu.containers}/{split}",
                    pods,
                ]
            )
        if len(node.gpus) > 1:
            rows.append(
                [
                    "",
                    "all",
                    "",
                    _ratio(node.cores_allocated, node.cores_total),
                    _ratio(node.memory_allocated_mib, node.memory_total_mib),
                    "",
                    "",
                ]
            )
        cores += node.cores_allocated
        cores_total += node.cores_total
        memory += node.memory_allocated_mib
        memory_total += node.memory_total_mib
    if not view.nodes:
        return "No GPUNode objects: is the fracgpu agent running on the GPU nodes?"
    headers = ["NODE", "GPU", "MODEL", "COMPUTE", "MEMORY(MiB)", "CONTAINERS/SPLIT", "PODS"]
    text = table(headers, rows)
    gpus = sum(len(n.gpus) for n in view.nodes)
    mig = sum(g.mig for n in view.nodes for g in n.gpus)
    text += (
        f"\n\nCluster: {len(view.nodes)} node(s), {gpus} GPU(s)"
        f"{f' ({mig} in MIG mode, not shared)' if mig else ''}; compute "
        f"{_ratio(cores, cores_total)}, memory {_ratio(memory, memory_total)} MiB allocated"
    )
    if any(n.split_count is None for n in view.nodes if n.gpus):
        text += (
            "\nSPLIT: containers per GPU allowed by the GPUNode's spec.splitCount; 'default': "
            "the webhook's --split-count (10 unless changed)"
        )
    notes = list(view.problems) + [f"{n.name}: {p}" for n in view.nodes for p in n.problems]
    if notes:
        text += "\n\nProblems:\n" + "\n".join(f"  {p}" for p in notes)
    return text


def pods_table(pods: Sequence[PodReport], all_namespaces: bool) -> str:
    if not pods:
        return "No pods with a fracgpu assignment found."
    rows = []
    for pod in pods:
        gpus = ", ".join(
            f"{c.name}: gpu{'?' if d.index is None else d.index} {d.cores}c/{d.memory_mib}MiB"
            for c in pod.containers
            for d in c.devices
        )
        row = [pod.name, pod.phase, pod.node, gpus or "-"]
        rows.append([pod.namespace, *row] if all_namespaces else row)
    headers = ["NAME", "PHASE", "NODE", "GPUS (container: gpu cores/memory)"]
    return table(["NAMESPACE", *headers] if all_namespaces else headers, rows)


def _pair(used: int, hard: int | None) -> str:
    return f"{used}/{'-' if hard is None else hard}"


def _quota_row(
    namespace: str, name: str, model: str, used: Sequence[int], hard: ResourceLimits
) -> list[str]:
    return [
        namespace,
        name,
        model,
        _pair(used[0], hard.cores),
        _pair(used[1], hard.memory_mib),
        _pair(used[2], hard.gpus),
    ]


def quotas_table(quotas: Sequence[Quota]) -> str:
    if not quotas:
        return "No GPUQuota objects found."
    rows = []
    for q in quotas:
        used = (q.used.cores, q.used.memory_mib, q.used.gpus)
        rows.append(_quota_row(q.namespace, q.name, "(all)", used, q.hard))
        for model, hard in sorted(q.hard_by_model.items()):
            by_model = q.used_by_model.get(model)
            amounts = (
                (by_model.cores, by_model.memory_mib, by_model.gpus) if by_model else (0, 0, 0)
            )
            rows.append(_quota_row("", "", model, amounts, hard))
    headers = ["NAMESPACE", "NAME", "MODEL", "CORES", "MEMORY(MiB)", "GPUS"]
    return table(headers, rows) + "\n\nused/hard; '-' = no limit; 100 cores = one GPU"


def _usage_cell(value: int | float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return f"{int(value) // 2**20}"
    if kind == "ratio":
        return f"{float(value) * 100:.0f}%"
    return str(value)


def pod_table(report: PodReport) -> str:
    lines = [
        f"Pod:          {report.namespace}/{report.name} ({report.phase})",
        f"Node:         {report.node}",
        f"Reservation:  {report.reservation_id}",
        "",
    ]
    rows = []
    for container in report.containers:
        usage = {u.gpu: u for u in report.usage.get(container.name, ())}
        for device in container.devices:
            live = usage.get(device.uuid)
            rows.append(
                [
                    container.name,
                    "?" if device.index is None else str(device.index),
                    device.model,
                    device.uuid,
                    str(device.cores),
                    str(device.memory_mib),
                    _usage_cell(live.memory_used_bytes if live else None, "bytes"),
                    _usage_cell(live.utilization_ratio if live else None, "ratio"),
                    _usage_cell(live.oom_rejections if live else None, "count"),
                ]
            )
    headers = [
        "CONTAINER",
        "GPU",
        "MODEL",
        "UUID",
        "CORES",
        "MEMORY(MiB)",
        "USED(MiB)",
        "BUSY",
        "OOM-REJECTED",
    ]
    lines.append(table(headers, rows))
    if report.usage_note:
        lines += ["", f"Live usage: {report.usage_note}"]
    return "\n".join(lines)
