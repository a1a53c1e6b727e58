"""kubectl fracgpu: reports and tables built from fixture objects (no API server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fracgpu import __version__, names
from tests.kubectl.objects import assigned_pod, gpu_uuid, gpunode, gpuquota, reservation
from webhook.kubectl import fetch, report, tables
from webhook.kubectl import plugin as kubectl_plugin

NOW = 1_800_000_000.0  # 2027-01-15: the fixtures' reservations expire in 2030


def _cluster() -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    nodes = [
        gpunode(
            "gpu-b",
            2,
            unhealthy=(1,),
            reservations=[
                reservation("r-pending", "team-a", "", "gpu-b", index=0, cores=10, mib=2048),
                reservation(
                    "r-team-a-train", "team-a", "train", "gpu-b", index=0, cores=50, mib=8192
                ),
            ],
        ),
        gpunode("gpu-a", 1, model="Tesla T4", memory_mib=15360),
    ]
    pods = [
        assigned_pod("team-a", "train", "gpu-b", {"main": [(0, 50, 8192)]}, phase="Running"),
        assigned_pod("team-b", "nb", "gpu-b", {"lab": [(0, 25, 4096)], "side": [(1, 0, 1024)]}),
        assigned_pod("team-b", "done", "gpu-b", {"x": [(0, 20, 2048)]}, phase="Succeeded"),
        assigned_pod("team-c", "t4", "gpu-a", {"main": [(0, 100, 15360)]}),
    ]
    return nodes, pods


def test_nodes_sum_live_pods_and_pending_reservations() -> None:
    nodes, pods = _cluster()
    view = report.build_nodes(nodes, pods, now=NOW)
    assert [n.name for n in view.nodes] == ["gpu-a", "gpu-b"]
    gpu_b = view.nodes[1]
    first, second = gpu_b.gpus
    # train (50) + nb/lab (25) + the pending reservation (10); the finished pod and the
    # reservation whose pod is visible are not counted twice.
    assert first.cores_allocated == 85
    assert first.memory_allocated_mib == 8192 + 4096 + 2048
    assert [s.owner for s in first.slices] == [
        "team-a/<pending> (reserved)",
        "team-a/train/main",
        "team-b/nb/lab",
    ]
    assert second.cores_allocated == 0 and second.memory_allocated_mib == 1024
    assert not second.healthy
    assert gpu_b.cores_total == 200 and gpu_b.memory_total_mib == 81920
    assert view.nodes[0].cores_allocated == 100


def test_nodes_table_is_readable() -> None:
    text = tables.nodes_table(report.build_nodes(*_cluster(), now=NOW))
    lines = text.splitlines()
    assert lines[0].split() == [
        "NODE",
        "GPU",
        "MODEL",
        "COMPUTE",
        "MEMORY(MiB)",
        "CONTAINERS/SPLIT",
        "PODS",
    ]
    assert "85/100 (85%)" in text and "14336/40960 (35%)" in text
    assert "(UNHEALTHY)" in text
    assert "team-b/nb/side 0c/1024MiB" in text
    assert "team-b/done" not in text
    assert "Cluster: 2 node(s), 3 GPU(s); compute 185/300 (61%)" in text
    # Columns line up: every row's COMPUTE column starts where the header's does.
    column = lines[0].index("COMPUTE")
    for line in lines[1:5]:
        assert line[column - 1] == " " and line[column] != " "


def test_nodes_json_has_the_same_numbers() -> None:
    nodes, pods = _cluster()
    data = [report.node_to_dict(n) for n in report.build_nodes(nodes, pods, now=NOW).nodes]
    json.dumps(data)  # serialisable
    assert data[1]["gpus"][0]["compute"] == {"allocated": 85, "total": 100}
    assert data[1]["gpus"][0]["slices"][0]["reserved"] is True
    assert data[1]["memoryMiB"] == {"allocated": 15360, "total": 81920}


def test_unreadable_assignment_is_reported_not_hidden() -> None:
    nodes, pods = _cluster()
    broken = assigned_pod("team-x", "bad", "gpu-a", {"m": [(0, 1, 256)]})
    broken["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT] = '{"version": 9}'
    view = report.build_nodes(nodes, [*pods, broken], now=NOW)
    assert len(view.problems) == 1 and "team-x/bad" in view.problems[0]
    assert "Problems:" in tables.nodes_table(view)


def test_no_gpunodes_says_what_to_check() -> None:
    assert "agent" in tables.nodes_table(report.build_nodes([], [], now=NOW))


def test_quota_report() -> None:
    quotas = report.build_quotas(
        [
            gpuquota("team-b", {"cores": 400}, {"cores": 125, "memoryMiB": 4096, "gpus": 2}),
            gpuquota(
                "team-a",
                {"cores": 200, "memoryMiB": 40960, "gpus": 2},
                {"cores": 150},
                models={"Tesla T4": {"gpus": 1}},
            ),
        ]
    )
    assert [q.namespace for q in quotas] == ["team-a", "team-b"]
    text = tables.quotas_table(quotas)
    rows = [line.split() for line in text.splitlines()[1:4]]
    assert rows[0] == ["team-a", "gpu", "(all)", "150/200", "0/40960", "0/2"]
    assert rows[1] == ["Tesla", "T4", "0/-", "0/-", "0/1"]
    assert rows[2] == ["team-b", "gpu", "(all)", "125/400", "4096/-", "2/-"]
    data = report.quota_to_dict(quotas[0])
    assert data["hard"] == {"cores": 200, "memoryMiB": 40960, "gpus": 2}
    assert data["models"]["Tesla T4"]["hard"] == {"gpus": 1}
    assert tables.quotas_table([]) == "No GPUQuota objects found."


def test_pod_report_with_usage() -> None:
    nodes, pods = _cluster()
    usage = {
        "lab": (
            report.ContainerUsage(
                gpu=gpu_uuid("gpu-b", 0),
                memory_used_bytes=3 * 2**30,
                memory_limit_bytes=4 * 2**30,
                utilization_ratio=0.42,
                oom_rejections=3,
            ),
        )
    }
    result = report.build_pod(pods[1], nodes[0], usage, "from agent fracgpu-agent-x")
    text = tables.pod_table(result)
    assert "Node:         gpu-b" in text
    lab = next(line for line in text.splitlines() if line.startswith("lab"))
    assert lab.split()[-5:] == ["25", "4096", "3072", "42%", "3"]
    side = next(line for line in text.splitlines() if line.startswith("side"))
    assert side.split()[1] == "1" and side.split()[-3:] == ["-", "-", "-"]
    data = report.pod_to_dict(result)
    assert data["containers"][0]["usage"][0]["oom_rejections"] == 3
    assert data["usageNote"] == "from agent fracgpu-agent-x"


def test_pod_without_assignment_explains_why() -> None:
    plain = {"metadata": {"namespace": "a", "name": "web"}, "spec": {}, "status": {}}
    with pytest.raises(report.ReportError, match="asks for no GPU"):
        report.build_pod(plain, None)


class _AgentLike(Collector):
    """Exposes metrics with the agent's names and labels, as its collector does."""

    def collect(self):  # type: ignore[no-untyped-def]
        labels = ["namespace", "pod", "container", "gpu"]
        used = GaugeMetricFamily("fracgpu_container_memory_used_bytes", "u", labels=labels)
        used.add_metric(["team-b", "nb", "lab", "GPU-1"], 2**30)
        used.add_metric(["team-b", "other", "lab", "GPU-1"], 5)
        ooms = CounterMetricFamily("fracgpu_container_oom_rejections", "o", labels=labels)
        ooms.add_metric(["team-b", "nb", "lab", "GPU-1"], 7)
        util = GaugeMetricFamily("fracgpu_container_utilization_ratio", "b", labels=labels)
        util.add_metric(["team-b", "nb", "lab", "GPU-1"], 0.5)
        yield from (used, ooms, util)


def test_usage_is_parsed_from_the_agents_metrics_text() -> None:
    registry = CollectorRegistry()
    registry.register(_AgentLike())
    text = generate_latest(registry).decode()
    usage = fetch.parse_usage(text, "team-b", "nb")
    assert usage == {
        "lab": (
            report.ContainerUsage(
                gpu="GPU-1", memory_used_bytes=2**30, utilization_ratio=0.5, oom_rejections=7
            ),
        )
    }
    assert fetch.parse_usage(text, "team-b", "absent") == {}


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_plugin.main([]) == 2  # a command is required
    assert kubectl_plugin.main(["-o", "xml", "nodes"]) == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_missing_kubeconfig_is_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = kubectl_plugin.main(["--kubeconfig", str(tmp_path / "absent.yaml"), "nodes"])
    assert code == 1
    assert "cannot load the kubeconfig" in capsys.readouterr().err


def test_mig_gpus_show_as_mig_not_free_and_the_split_count_is_shown() -> None:
    mig = gpunode("gpu-m", 2, model="NVIDIA A30", memory_mib=24576)
    mig["status"]["devices"][1]["migEnabled"] = True
    mig["spec"] = {"splitCount": 4}
    pods = [assigned_pod("team-a", "p", "gpu-m", {"a": [(0, 10, 1024)], "b": [(0, 10, 1024)]})]
    view = report.build_nodes([mig], pods, now=NOW)
    text = tables.nodes_table(view)
    row0 = next(line for line in text.splitlines() if line.startswith("gpu-m"))
    row1 = next(line for line in text.splitlines() if "(MIG: not shared)" in line)
    assert " 2/4 " in row0
    assert row1.split()[0] == "1" and row1.count("MIG") == 3 and "0/" not in row1
    # The MIG GPU adds nothing to the capacity shown as free.
    assert "Cluster: 1 node(s), 2 GPU(s) (1 in MIG mode, not shared); compute 20/100 (20%)" in text
    data = report.node_to_dict(view.nodes[0])
    assert data["splitCount"] == 4
    assert [g["mig"] for g in data["gpus"]] == [False, True]
    assert data["gpus"][0]["containers"] == 2
    assert data["gpus"][1]["compute"] == {"allocated": 0, "total": 0}
    # Without spec.splitCount the webhook's setting applies, and the table says so.
    default = tables.nodes_table(report.build_nodes([gpunode("gpu-d", 1)], [], now=NOW))
    assert " 0/default " in default and "the webhook's --split-count" in default


def test_pods_lists_assigned_pods_with_their_gpus() -> None:
    nodes, pods = _cluster()
    reports, problems = report.build_pods(pods, nodes)
    assert problems == []
    assert [(r.namespace, r.name) for r in reports] == [
        ("team-a", "train"),
        ("team-b", "done"),
        ("team-b", "nb"),
        ("team-c", "t4"),
    ]
    every = tables.pods_table(reports, all_namespaces=True)
    assert every.splitlines()[0].split()[:4] == ["NAMESPACE", "NAME", "PHASE", "NODE"]
    assert "lab: gpu0 25c/4096MiB, side: gpu1 0c/1024MiB" in every
    one = tables.pods_table(reports[:1], all_namespaces=False)
    assert one.splitlines()[0].split()[0] == "NAME"


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "team-a", "-o", "json", "pods"],
        ["pods", "-n", "team-a", "-o", "json"],
        ["-o", "json", "pods", "--namespace=team-a"],
        ["--kubeconfig", "K", "pods", "-n", "team-a", "-o", "json"],
        ["pods", "--kubeconfig", "K", "--namespace", "team-a", "--output", "json"],
    ],
)
def test_flags_work_before_or_after_the_command(argv: list[str]) -> None:
    args = kubectl_plugin._parser().parse_args(argv)
    assert (args.command, args.namespace, args.output) == ("pods", "team-a", "json")
    assert args.kubeconfig in (None, "K")
    assert not args.all_namespaces


def test_all_namespaces_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["pods", "-A"], ["-A", "pods"], ["quota", "--all-namespaces"]):
        assert kubectl_plugin._parser().parse_args(argv).all_namespaces
    assert kubectl_plugin.main(["pods", "-A", "-n", "x"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert kubectl_plugin.main(["nodes", "-A"]) == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_plugin.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kubectl fracgpu {__version__}"


def test_nodes_leave_out_reservations_that_hold_nothing_any_more() -> None:
    """The view applies quota.reservation_charges, as admission and the quota recount do: a
    reservation whose pod has finished, or that has expired, holds no capacity."""
    gone = reservation("r-gone", "team-a", "job", "gpu-x", index=0, cores=30, mib=1024)
    expired = reservation("r-old", "team-a", "", "gpu-x", index=0, cores=20, mib=1024)
    expired["expiresAt"] = "2026-01-01T00:00:00Z"
    pending = reservation("r-open", "team-a", "", "gpu-x", index=0, cores=10, mib=1024)
    nodes = [gpunode("gpu-x", 1, reservations=[gone, expired, pending])]
    pods = [
        assigned_pod(
            "team-a", "job", "gpu-x", {"m": [(0, 30, 1024)]}, phase="Succeeded",
            reservation_id="r-gone",
        )
    ]  # fmt: skip
    (gpu,) = report.build_nodes(nodes, pods, now=NOW).nodes[0].gpus
    assert gpu.cores_allocated == 10
    assert [s.owner for s in gpu.slices] == ["team-a/<pending> (reserved)"]
