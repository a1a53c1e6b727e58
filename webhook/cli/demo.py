"""``fracgpu demo``: the webhook on 127.0.0.1 with a throwaway CA, fed the example pods over HTTPS.

Each pod goes through /mutate, then (if allowed) the patched pod through /validate, as
kube-apiserver would do; the result is printed as a table, then every patch and message.
A workload's manifest (the kinds ``fracgpu admit`` takes, ``webhook.workloads``) is sent as
the pod its controller would make.
"""

import json
import sys
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import jsonpatch

from fracgpu import names
from fracgpu.codec import decode_assignment
from fracgpu.errors import FracgpuError
from webhook import documents, settings, workloads
from webhook.cli import selfsigned
from webhook.cli.client import WebhookClient, build_review, patch_of
from webhook.rules.demand import gpu_requests
from webhook.serving import server
from webhook.serving.tls import CertificateReloader, TLSFiles
from webhook.state.clusterfile import load_cluster_file
from webhook.state.embedded import EmbeddedState

# The repository's examples/ when run from a checkout; an installed wheel carries the demo's
# cluster file and pods under <prefix>/share/fracgpu/examples (pyproject's data-files).
_CHECKOUT_EXAMPLES: Final = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES: Final = (
    _CHECKOUT_EXAMPLES
    if (_CHECKOUT_EXAMPLES / "cluster.yaml").is_file()
    else Path(sys.prefix) / "share" / "fracgpu" / "examples"
)
VALUE_WIDTH: Final = 96
# What the demo (like `fracgpu admit`) takes, for messages.
MANIFESTS_TAKEN: Final = (
    f"Pod manifests, or workloads' with a pod template ({workloads.KINDS_TAKEN})"
)


@dataclass
class DemoResult:
    source: str
    pod: str
    dialect: str
    verdict: str
    node: str = ""
    gpus: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    warnings: list[str] = field(default_factory=list)


async def run(
    cluster_file: Path, pods_dir: Path, out: TextIO, placement_mode: str = "immediate"
) -> int:
    cluster = load_cluster_file(cluster_file)
    gpu_index = {d.uuid: d.index for n in cluster.nodes for d in n.devices}
    if not pods_dir.is_dir():
        what = "is not a directory" if pods_dir.exists() else "does not exist"
        raise documents.DocumentError(
            f"pod directory {pods_dir} {what}: pass --pods with a directory of manifests "
            f"(*.yaml): {MANIFESTS_TAKEN}"
        )
    pod_files = sorted(pods_dir.glob("*.yaml"))
    if not pod_files:
        out.write(f"no manifests (*.yaml) in {pods_dir}: put {MANIFESTS_TAKEN} there\n")
        return 1
    # Every mistake is found before serving.
    pods = [(path.name, workloads.load_manifest(path)[0]) for path in pod_files]
    with tempfile.TemporaryDirectory(prefix="fracgpu-demo-") as tmp:
        authority = selfsigned.new_authority()
        ca, cert, key = selfsigned.write_files(
            Path(tmp), authority, selfsigned.issue_serving(authority)
        )
        config = settings.from_mapping(
            {
                "host": "127.0.0.1",
                "port": "0",
                "tls_cert_file": str(cert),
                "tls_key_file": str(key),
                "cluster_file": str(cluster_file),
                "placement_mode": placement_mode,
            }
        )
        state = EmbeddedState(
            cluster,
            config.split_count,
            config.reservation_ttl_seconds,
            memory_scaling=config.memory_scaling,
            admission_window_s=config.admission_window_seconds,
            held_whole_nodes=config.held_whole_nodes,
        )
        reloader = CertificateReloader(TLSFiles(cert, key), config.tls_reload_seconds)
        running = await server.start(config, state, reloader)
        try:
            out.write(
                f"fracgpu webhook listening on {running.url} (TLS with a throwaway CA, "
                "removed on exit); "
                f"cluster {cluster_file}: {len(cluster.nodes)} nodes, "
                f"{len(gpu_index)} GPUs, {len(cluster.pods)} pods already placed\n\n"
            )
            async with WebhookClient(running.url, ca) as client:
                outcomes = [
                    await _admit(client, source, pod, config.dialects, gpu_index)
                    for source, pod in pods
                ]
        finally:
            await running.stop()
    _print(outcomes, out)
    return 0


async def _admit(
    client: WebhookClient,
    source: str,
    pod: dict[str, Any],
    dialects: Any,
    gpu_index: Mapping[str, int],
) -> DemoResult:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    short = meta.get("name") or meta.get("generateName", "") + "*"
    name = f"{meta.get('namespace', 'default')}/{short}"
    outcome = DemoResult(source, name, _dialects(pod, dialects), "")
    mutated = await client.review("/mutate", build_review(pod))
    outcome.warnings = list(mutated.response.get("warnings") or [])
    if not mutated.allowed:
        outcome.verdict, outcome.message = "DENIED", mutated.message
        return outcome
    outcome.patch = patch_of(mutated.body)
    patched = jsonpatch.apply_patch(pod, outcome.patch)
    validated = await client.review("/validate", build_review(patched))
    if not validated.allowed:
        outcome.verdict, outcome.message = "DENIED by /validate", validated.message
        return outcome
    written = patched.get("metadata", {}).get("annotations", {})
    if names.ANNOTATION_QUEUED in written:
        # Queue mode: created, waiting Pending for fracgpu's scheduler (the warning says why).
        outcome.verdict = "QUEUED"
        outcome.message = next((w for w in outcome.warnings if w.startswith("queued:")), "")
        return outcome
    annotation = written.get(names.ANNOTATION_ASSIGNMENT)
    if annotation is None:
        outcome.verdict = "ALLOWED" if not outcome.patch else "ALLOWED, patched"
        return outcome
    assignment = decode_assignment(annotation)
    outcome.verdict, outcome.node = "ADMITTED", assignment.node
    outcome.gpus = [
        f"{c.container}: gpu{gpu_index.get(d.uuid, '?')} {d.cores}c {d.memory_mib}Mi"
        for c in assignment.containers
        for d in c.devices
    ]
    return outcome


def _dialects(pod: Mapping[str, Any], dialects: Any) -> str:
    try:
        requests = gpu_requests(pod, dialects)
    except FracgpuError:
        return "(invalid)"
    return ",".join(sorted({r.dialect.value for r in requests})) or "-"


def _print(outcomes: Sequence[DemoResult], out: TextIO) -> None:
    header = ["#", "POD", "DIALECT", "VERDICT", "NODE", "GPUS (container: gpu cores memory)"]
    rows = [
        [o.source[:2], o.pod, o.dialect, o.verdict, o.node or "-", "\n".join(o.gpus) or "-"]
        for o in outcomes
    ]
    out.write(render_table(header, rows))
    admitted = sum(o.verdict.startswith(("ADMITTED", "ALLOWED")) for o in outcomes)
    waiting = sum(o.verdict == "QUEUED" for o in outcomes)
    denied = len(outcomes) - admitted - waiting
    queued_note = f", {waiting} queued (created, waiting for room)" if waiting else ""
    out.write(f"\n{len(outcomes)} pods: {admitted} admitted{queued_note}, {denied} denied\n")
    for o in outcomes:
        out.write(f"\n== {o.source}  {o.pod}  {o.verdict}\n")
        if o.message:
            text = textwrap.fill(
                o.message, 100, initial_indent="   message: ", subsequent_indent=" " * 12
            )
            out.write(text + "\n")
        for warning in o.warnings:
            out.write(f"   warning: {warning}\n")
        for op in o.patch:
            value = " " + _clip(json.dumps(op["value"])) if "value" in op else ""
            if "from" in op:
                value = f" from {op['from']}"
            out.write(f"   {op['op']:<8}{op['path']}{value}\n")


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table; cells may span several lines."""
    split = [[cell.splitlines() or [""] for cell in row] for row in [header, *rows]]
    widths = [max(len(line) for row in split for line in row[i]) for i in range(len(header))]
    rule = "+".join("-" * (w + 2) for w in widths)
    lines = [f"+{rule}+"]
    for number, row in enumerate(split):
        for k in range(max(len(cell) for cell in row)):
            parts = [
                f" {(cell[k] if k < len(cell) else ''):<{w}} "
                for cell, w in zip(row, widths, strict=True)
            ]
            lines.append("|" + "|".join(parts) + "|")
        if number == 0 or number == len(split) - 1:
            lines.append(f"+{rule}+")
    return "\n".join(lines) + "\n"


def _clip(text: str) -> str:
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."
