"""``kubectl fracgpu`` (installed as ``kubectl-fracgpu``): fracgpu's allocation for people.

- ``kubectl fracgpu nodes``: per node and GPU, allocated/total compute and memory and the
  pods holding each GPU;
- ``kubectl fracgpu quota``: GPUQuota used/hard per namespace (and per GPU model);
- ``kubectl fracgpu pods [-n NS | -A]``: pods with GPU assignments, their node and GPUs;
- ``kubectl fracgpu pod NAME``: a pod's node, GPUs and slice, with live usage from the node
  agent when the API server's pod proxy allows it.

``-o json|yaml`` prints the same data for scripts. ``-n``, ``-o``, ``-A``, ``--context`` and
``--kubeconfig`` go before or after the command, as with kubectl. Exit status: 0 ok, 1 the
API could not answer (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from fracgpu import __version__
from fracgpu.errors import FracgpuError
from webhook.kubectl import fetch, report, tables

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _common(defaults: bool) -> argparse.ArgumentParser:
    """The options kubectl users put before or after the command: on the main parser with
    their defaults, on each command without (so a later one overrides an earlier one)."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig",
        default=default(None),
        help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)",
    )
    common.add_argument(
        "--context", default=default(None), help="kubeconfig context (default: the current one)"
    )
    common.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default=default("table"),
        help="output format",
    )
    common.add_argument(
        "-n",
        "--namespace",
        default=default(None),
        help="namespace (pod, pods: default the context's; quota: default all)",
    )
    common.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=default(False),
        help="pods, quota: every namespace",
    )
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl fracgpu",
        description="fracgpu allocation: nodes, quotas and pods",
        parents=[_common(defaults=True)],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = [_common(defaults=False)]
    nodes = commands.add_parser(
        "nodes", parents=common, help="allocation per node and GPU, with its pods"
    )
    nodes.add_argument("node", nargs="?", help="only this node")
    commands.add_parser("quota", parents=common, help="GPUQuota used/hard per namespace")
    commands.add_parser(
        "pods", parents=common, help="pods with GPU assignments (-A: in every namespace)"
    )
    pod = commands.add_parser("pod", parents=common, help="a pod's GPU assignment and live usage")
    pod.add_argument("name")
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
    if args.all_namespaces and args.namespace:
        print(
            "kubectl fracgpu: -n/--namespace and -A/--all-namespaces exclude each other",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.all_namespaces and args.command not in ("pods", "quota"):
        print(f"kubectl fracgpu: -A applies to pods and quota, not {args.command}", file=sys.stderr)
        return EXIT_USAGE
    client = None
    try:
        client, default_namespace = fetch.connect(args.kubeconfig, args.context)
        handlers: dict[str, Callable[[Any, str], tuple[Any, str]]] = {
            "nodes": lambda c, _: _nodes(c, args.node),
            "quota": lambda c, _: _quotas(c, args.namespace),
            "pods": lambda c, ns: _pods(c, None if args.all_namespaces else args.namespace or ns),
            "pod": lambda c, ns: _pod(c, args, ns),
        }
        data, text = handlers[args.command](client, default_namespace)
    except (fetch.FetchError, report.ReportError, FracgpuError) as error:
        print(f"kubectl fracgpu: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if client is not None:
            client.close()
    _print(stdout, args.output, data, text)
    return EXIT_OK


def _print(out: TextIO, output: str, data: Any, text: str) -> None:
    if output == "json":
        out.write(json.dumps(data, indent=2) + "\n")
    elif output == "yaml":
        import yaml  # noqa: PLC0415 - only -o yaml needs it: keeps the common path fast

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


def _pods(client: Any, namespace: str | None) -> tuple[Any, str]:
    pods, problems = report.build_pods(
        fetch.assigned_pods(client, namespace), fetch.gpunodes(client)
    )
    data = {"pods": [report.pod_to_dict(p) for p in pods], "problems": problems}
    text = tables.pods_table(pods, all_namespaces=namespace is None)
    if problems:
        text += "\n\nProblems:\n" + "\n".join(f"  {p}" for p in problems)
    return data, text


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
