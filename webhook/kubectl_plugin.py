"""``kubectl fracgpu`` (installed as ``kubectl-fracgpu``): fracgpu's allocation for people.

- ``kubectl fracgpu nodes``: per node and GPU, allocated/total compute and memory and the
  pods holding each GPU;
- ``kubectl fracgpu quota``: GPUQuota used/hard per namespace (and per GPU model);
- ``kubectl fracgpu pod NAME``: a pod's node, GPUs and slice, with live usage from the node
  agent when the API server's pod proxy allows it.

``-o json|yaml`` prints the same data for scripts. Exit status: 0 ok, 1 the API could not
answer (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import yaml

from fracgpu.errors import FracgpuError
from webhook.kubectl import fetch, report, tables

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl fracgpu", description="fracgpu allocation: nodes, quotas and pods"
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml"), default="table", help="output format"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    nodes = commands.add_parser("nodes", help="allocation per node and GPU, with its pods")
    nodes.add_argument("node", nargs="?", help="only this node")
    quota = commands.add_parser("quota", help="GPUQuota used/hard per namespace")
    quota.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    pod = commands.add_parser("pod", help="a pod's GPU assignment and live usage")
    pod.add_argument("name")
    pod.add_argument("-n", "--namespace", help="the pod's namespace (default: the context's)")
    pod.add_argument(
        "--fracgpu-namespace",
        default="fracgpu-system",
        help="namespace fracgpu is installed in, to find the node agent [fracgpu-system]",
    )
    pod.add_argument("--no-usage", action="store_true", help="do not ask the agent for usage")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    stdout = out or sys.stdout
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        client, default_namespace = fetch.connect(args.kubeconfig, args.context)
        handlers: dict[str, Callable[[Any, str], tuple[Any, str]]] = {
            "nodes": lambda c, _: _nodes(c, args.node),
            "quota": lambda c, _: _quotas(c, args.namespace),
            "pod": lambda c, ns: _pod(c, args, ns),
        }
        data, text = handlers[args.command](client, default_namespace)
    except (fetch.FetchError, report.ReportError, FracgpuError) as error:
        print(f"kubectl fracgpu: {error}", file=sys.stderr)
        return EXIT_FAILED
    _print(stdout, args.output, data, text)
    return EXIT_OK


def _print(out: TextIO, output: str, data: Any, text: str) -> None:
    if output == "json":
        out.write(json.dumps(data, indent=2) + "\n")
    elif output == "yaml":
        out.write(yaml.safe_dump(data, sort_keys=False))
    else:
        out.write(text + "\n")


def _nodes(client: Any, only: str | None) -> tuple[Any, str]:
    gpunodes = fetch.gpunodes(client)
    if only is not None:
        gpunodes = [g for g in gpunodes if g.get("metadata", {}).get("name") == only]
        if not gpunodes:
            raise report.ReportError(f"node {only} has no GPUNode: no fracgpu agent reported it")
    view = report.build_nodes(gpunodes, fetch.assigned_pods(client), now=time.time())
    data = {
        "nodes": [report.node_to_dict(n) for n in view.nodes],
        "problems": list(view.problems),
    }
    return data, tables.nodes_table(view)


def _quotas(client: Any, namespace: str | None) -> tuple[Any, str]:
    quotas = report.build_quotas(fetch.gpuquotas(client, namespace))
    return {"quotas": [report.quota_to_dict(q) for q in quotas]}, tables.quotas_table(quotas)


def _pod(client: Any, args: argparse.Namespace, default_namespace: str) -> tuple[Any, str]:
    namespace = args.namespace or default_namespace
    obj = fetch.pod(client, namespace, args.name)
    assignment = report.pod_assignment(obj)
    node = fetch.gpunode(client, assignment.node) if assignment else None
    usage: Any = {}
    note = "not requested (--no-usage)"
    if assignment and not args.no_usage:
        usage, note = fetch.container_usage(
            client, assignment.node, args.fracgpu_namespace, namespace, args.name
        )
    result = report.build_pod(obj, node, usage, note)
    return report.pod_to_dict(result), tables.pod_table(result)


if __name__ == "__main__":
    sys.exit(main())
