"""The `fracgpu` command as a user runs it: a real process, real HTTPS inside the demo."""

import asyncio
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from fracgpu import __version__, names
from fracgpu.codec import decode_assignment
from tests.webhook.support import gpu_pod, write_tls
from webhook.cli.client import WebhookClient, build_review
from webhook.cli.main import _parser
from webhook.workloads import KINDS_TAKEN

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def fracgpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def row(output: str, pod: str) -> list[str]:
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 3 and cells[1] == pod:
            return cells
    raise AssertionError(f"no table row for {pod} in:\n{output}")


def test_plain_fracgpu_runs_the_demo_over_https() -> None:
    result = fracgpu()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"listening on https://127\.0\.0\.1:\d+", out)
    expected = {
        "team-a/tkestack-share": ("tkestack", "ADMITTED"),
        "team-a/hami-share": ("hami", "ADMITTED"),
        "team-a/gpushare-mem": ("gpushare", "ADMITTED"),
        "team-a/pipeline-*": ("hami,tkestack", "ADMITTED"),
        "team-a/whole-gpu": ("tkestack", "ADMITTED"),
        "team-a/multi-gpu": ("hami", "ADMITTED"),
        "team-small/over-quota": ("tkestack", "DENIED"),
        "team-a/invalid-share": ("(invalid)", "DENIED"),
        "team-a/tamper": ("tkestack", "DENIED"),
        "team-a/web": ("-", "ALLOWED, patched"),
        "team-a/never-fits": ("hami", "DENIED"),
        "research/no-room-now": ("hami", "DENIED"),
        "kube-system/system-daemon": ("hami", "ALLOWED"),
    }
    for pod, (dialect, verdict) in expected.items():
        cells = row(out, pod)
        assert (cells[2], cells[3]) == (dialect, verdict), cells
    assert row(out, "team-a/hami-share")[4] == "gpu-t4-0"  # nvidia.com/use-gputype: T4
    assert "GPUQuota team-small/gpu is exceeded: this pod asks 50 cores, 30 are in use" in out
    assert "this pod sets annotation fracgpu.io/assignment, variable NVIDIA_VISIBLE_DEVICES" in out
    assert "add     /spec/containers/0/env" in out


def test_demo_in_queue_mode_shows_pods_that_wait_as_queued() -> None:
    result = fracgpu("demo", "--placement-mode", "queue")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert row(out, "research/no-room-now")[3] == "QUEUED"
    assert row(out, "team-a/never-fits")[3] == "DENIED"  # can never fit: still refused
    assert row(out, "team-small/over-quota")[3] == "DENIED"  # over quota: still refused
    assert "2 queued (created, waiting for room)" in out
    assert "queued: no GPU has room for this pod now" in out
    assert "waits Pending for scheduler fracgpu-scheduler" in out


def test_admit_in_queue_mode_prints_the_queued_pod() -> None:
    result = fracgpu(
        "admit",
        str(EXAMPLES / "pods" / "12-no-room-now.yaml"),
        "--cluster",
        str(EXAMPLES / "cluster.yaml"),
        "--placement-mode",
        "queue",
    )
    assert result.returncode == 0, result.stderr
    assert "Warning: queued: no GPU has room for this pod now" in result.stderr
    assert "fracgpu.io/queued:" in result.stdout
    assert "schedulerName: fracgpu-scheduler" in result.stdout
    assert "fracgpu.io/assignment" not in result.stdout


def test_demo_takes_other_pods(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "solo", "namespace": "team-a"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}
                            },
                        }
                    ]
                },
            }
        )
    )
    result = fracgpu("demo", "--pods", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert row(result.stdout, "team-a/solo")[3] == "ADMITTED"
    assert "1 pods: 1 admitted, 0 denied" in result.stdout


def test_admit_prints_the_mutated_pod() -> None:
    result = fracgpu(
        "admit",
        str(EXAMPLES / "pods" / "02-hami-share.yaml"),
        "--cluster",
        str(EXAMPLES / "cluster.yaml"),
    )
    assert result.returncode == 0, result.stderr
    pod = yaml.safe_load(result.stdout)
    assignment = decode_assignment(pod["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT])
    assert assignment.node == "gpu-t4-0"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["tencent.com/vcuda-core"] == "25"
    assert "nvidia.com/gpu" not in limits
    assert 'Warning: container "inference": hami request normalised' in result.stderr


def test_admit_prints_a_denial_and_exits_1() -> None:
    result = fracgpu(
        "admit",
        str(EXAMPLES / "pods" / "08-invalid.yaml"),
        "--cluster",
        str(EXAMPLES / "cluster.yaml"),
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert (
        'denied by /mutate: container "cuda": tencent.com/vcuda-core=150 is not allowed'
        in result.stderr
    )


def test_admit_and_demo_refuse_a_file_that_is_not_a_pod(tmp_path: Path) -> None:
    # A cluster file, {} or a Deployment was once admitted as a pod and echoed back (rc 0).
    cluster = str(EXAMPLES / "cluster.yaml")
    (tmp_path / "empty.json").write_text("{}\n")
    (tmp_path / "config.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    (tmp_path / "list.yaml").write_text("- kind: Pod\n")
    (tmp_path / "no-version.yaml").write_text("kind: Pod\nmetadata: {name: x}\n")
    (tmp_path / "long.yaml").write_text(f"apiVersion: v1\nkind: {'P' * 5000}\n")
    wanted = (
        "write one mapping with apiVersion: v1 and kind: Pod, or a workload with a pod "
        f"template ({KINDS_TAKEN})"
    )
    cases = {
        cluster: "not a Pod manifest (no apiVersion, no kind)",
        str(tmp_path / "empty.json"): "not a Pod manifest (no apiVersion, no kind)",
        str(tmp_path / "config.yaml"): "(apiVersion 'v1', kind 'ConfigMap')",
        str(tmp_path / "list.yaml"): "not a Pod manifest (a list)",
        str(tmp_path / "no-version.yaml"): "not a Pod manifest (no apiVersion, kind 'Pod')",
        str(tmp_path / "long.yaml"): f"kind '{'P' * 64}'...)",
    }
    for path, expected in cases.items():
        result = fracgpu("admit", path, "--cluster", cluster)
        assert (result.returncode, result.stdout) == (2, ""), (path, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and len(lines[0]) < 400, result.stderr
        assert lines[0].startswith(f"fracgpu: {path}: ") and lines[0].endswith(wanted), lines
        assert expected in lines[0], lines
    pods = tmp_path / "pods"
    pods.mkdir()
    (pods / "a.yaml").write_text("{}\n")
    result = fracgpu("demo", "--pods", str(pods))
    assert result.returncode == 2
    assert f"{pods / 'a.yaml'}: not a Pod manifest (no apiVersion, no kind)" in result.stderr


WEB = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  template:
    metadata:
      labels: {app: web}
      annotations: {example.com/owner: alice}
    spec:
      schedulerName: hami-scheduler
      containers:
      - name: main
        image: cuda
        resources: {limits: {tencent.com/vcuda-core: "50", tencent.com/vcuda-memory: "8"}}
"""


def test_admit_takes_a_workload_by_the_pod_it_would_make(tmp_path: Path) -> None:
    """Operators' manifests are mostly Deployments and Jobs; the migration guide has them
    run through fracgpu admit before they move."""
    deployment = tmp_path / "web.yaml"
    deployment.write_text(WEB)
    cronjob = tmp_path / "nightly.yaml"
    template = yaml.safe_load(WEB)["spec"]["template"]
    cronjob.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "metadata": {"name": "nightly", "namespace": "team"},
                "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}},
            }
        )
    )
    cluster = str(EXAMPLES / "cluster.yaml")
    for path, prefix in ((deployment, "web-"), (cronjob, "nightly-")):
        result = fracgpu("admit", str(path), "--cluster", cluster)
        assert result.returncode == 0, result.stderr
        pod = yaml.safe_load(result.stdout)
        assert pod["kind"] == "Pod" and pod["metadata"]["generateName"] == prefix
        assert pod["metadata"]["namespace"] == "team"
        assert pod["metadata"]["labels"]["app"] == "web"  # fracgpu adds its own
        assert pod["metadata"]["annotations"]["example.com/owner"] == "alice"
        assert names.ANNOTATION_ASSIGNMENT in pod["metadata"]["annotations"]
        # After migration nothing runs hami-scheduler: such a pod would wait for ever.
        assert "Warning: spec.schedulerName 'hami-scheduler' is not kube-scheduler's" in (
            result.stderr
        )
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: apps/v1\nkind: Deployment\nspec: {replicas: 2}\n")
    result = fracgpu("admit", str(broken), "--cluster", cluster)
    assert (result.returncode, result.stdout) == (2, "")
    assert "Deployment has no spec.template mapping: a workload is taken by its pod template" in (
        result.stderr
    )
    # A hostile manifest gets a line, never a traceback.
    odd = {
        "apiVersion: [apps/v1]\nkind: Deployment\n": "apiVersion of type list",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {namespace: [x]}\n"
        "spec: {template: {spec: {containers: []}}}\n": "metadata.namespace must be a string",
    }
    for text, message in odd.items():
        broken.write_text(text)
        result = fracgpu("admit", str(broken), "--cluster", cluster)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr


def test_admit_without_a_cluster_says_what_to_pass(tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c}]}\n"
    )
    result = fracgpu("admit", str(pod))
    assert result.returncode == 2
    assert "no cluster state: pass --cluster-file (or --cluster for admit)" in result.stderr


def test_a_broken_cluster_file_is_a_clear_error(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - name: n\n    cpu: 1\n    memory: 1Gi\n    gpus: [{uuid: u}]\n")
    result = fracgpu("admit", str(EXAMPLES / "pods" / "10-no-gpu.yaml"), "--cluster", str(cluster))
    assert result.returncode == 2
    assert result.stderr == (
        f"fracgpu: {cluster}: nodes[0].gpus[0]: is missing index, memoryMiB, model\n"
    )  # the path once: it was printed twice


def test_serve_without_tls_files_refuses_to_start() -> None:
    result = fracgpu("serve", "--cluster-file", str(EXAMPLES / "cluster.yaml"))
    assert result.returncode == 2
    assert "serving needs --tls-cert-file and --tls-key-file" in result.stderr


def test_serve_with_a_key_that_does_not_load_says_which_files(tmp_path: Path) -> None:
    _, ca, cert, _ = write_tls(tmp_path)
    result = fracgpu(
        "serve",
        "--cluster-file",
        str(EXAMPLES / "cluster.yaml"),
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(ca),
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"fracgpu: TLS key file {ca} does not load: it holds no PEM private key (-----BEGIN "
        f"PRIVATE KEY-----) for the certificate in {cert}"
    )


async def test_serve_answers_over_https_and_stops_on_sigterm(tmp_path: Path) -> None:
    _, ca, cert, key = write_tls(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "FRACGPU_TLS_CERT_FILE": str(cert),
        "FRACGPU_TLS_KEY_FILE": str(key),
        "FRACGPU_CLUSTER_FILE": str(EXAMPLES / "cluster.yaml"),
        "PATH": "/usr/bin:/bin",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook.cli.main",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        async with WebhookClient(f"https://127.0.0.1:{port}", ca) as client:
            for _ in range(100):
                try:
                    if (await client.get("/readyz"))[0] == 200:
                        break
                except OSError:
                    await asyncio.sleep(0.05)
            pod = gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}, namespace="team-a")
            reply = await client.review("/mutate", build_review(pod))
            assert reply.allowed, reply.message
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    assert b"serving on https://127.0.0.1:" in stderr


def message(output: str, source: str) -> str:
    """The denial message the demo printed for one example file, on one line."""
    block = output.split(f"== {source}", 1)[1].split("\n== ", 1)[0]
    text = block.split("message:", 1)[1]
    return " ".join(line.strip() for line in text.splitlines() if line.startswith(" "))


def test_demo_messages_say_what_caused_each_denial() -> None:
    result = fracgpu("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "None" not in out
    # The webhook narrowed placement to the tolerated nodes; no pod named a GPU.
    assert "named by UUID" not in out
    assert "is in MIG mode (fracgpu does not share MIG GPUs)" in message(
        out, "21-mig-left-alone.yaml"
    )
    split = message(out, "22-split-count.yaml")
    assert "gpu-l4-0/gpu0 (NVIDIA L4) has 35 cores and 12788 MiB free but already holds 4" in split
    assert "the split count of its node allows 4 per GPU" in split
    tamper = message(out, "09-tamper.yaml")
    assert "annotation fracgpu.io/reservation-id is missing" in tamper


def test_a_denial_by_a_node_taint_names_the_taint(tmp_path: Path) -> None:
    pod = tmp_path / "l4.yaml"
    pod.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "wants-l4",
                    "namespace": "team-a",
                    "annotations": {"nvidia.com/use-gputype": "L4"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}
                            },
                        }
                    ]
                },
            }
        )
    )
    result = fracgpu("admit", str(pod), "--cluster", str(EXAMPLES / "cluster.yaml"))
    assert result.returncode == 1
    assert "gpu-l4-0 has taint fracgpu.io/example=overcommit:NoSchedule" in result.stderr
    assert "named by UUID" not in result.stderr


def test_malformed_yaml_or_json_is_one_clear_line(tmp_path: Path) -> None:
    cluster = str(EXAMPLES / "cluster.yaml")
    bad_yaml = tmp_path / "pod.yaml"
    bad_yaml.write_text("kind: Pod\nmetadata: {name: x\nspec: [\n")
    bad_json = tmp_path / "pod.json"
    bad_json.write_text('{"kind": "Pod",\n "metadata": }\n')
    bad_cluster = tmp_path / "cluster.yaml"
    bad_cluster.write_text("nodes:\n  - name: a\n    gpus: [\n")
    pods = tmp_path / "pods"
    pods.mkdir()
    (pods / "a.yaml").write_text("metadata:\n\tname: tab\n")
    cases = [
        (("admit", str(bad_yaml), "--cluster", cluster), f"{bad_yaml}:3:5: not valid YAML"),
        (("admit", str(bad_json), "--cluster", cluster), f"{bad_json}:2:14: not valid JSON"),
        (
            (
                "admit",
                str(EXAMPLES / "pods" / "01-tkestack-share.yaml"),
                "--cluster",
                str(bad_cluster),
            ),
            f"{bad_cluster}:4:1: not valid YAML",
        ),
        (("demo", "--cluster", str(bad_cluster)), f"{bad_cluster}:4:1: not valid YAML"),
        (("demo", "--pods", str(pods)), f"{pods / 'a.yaml'}:2:1: not valid YAML"),
    ]
    for args, expected in cases:
        result = fracgpu(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout


def test_every_option_of_every_command_has_help() -> None:
    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands is not None
    for name, command in {"": parser, **commands}.items():
        for action in command._actions:
            if action.option_strings:
                assert (action.help or "").strip(), f"fracgpu {name} {action.option_strings[0]}"


def test_version() -> None:
    result = fracgpu("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"fracgpu {__version__}"


def test_cluster_mode_with_an_unusable_kubeconfig_is_one_line(tmp_path: Path) -> None:
    _, _, cert, key = write_tls(tmp_path / "tls")
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [\n")
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    cases = [
        (broken, f"--kubeconfig {broken}: not valid YAML at line 2, column 1"),
        (tmp_path / "absent", f"--kubeconfig {tmp_path / 'absent'}: the file does not exist"),
        (empty, f"--kubeconfig {empty}: "),
    ]
    for kubeconfig, expected in cases:
        result = fracgpu(
            "serve",
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
        )
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"fracgpu: {expected}"), result.stderr


def test_a_gpushare_request_that_never_fits_names_the_unit_it_was_read_in(
    tmp_path: Path,
) -> None:
    """aliyun.com/gpu-mem: 4096 meant as MiB is 4 TiB in GiB, the default: the denial says
    which unit it was read in and the setting that chooses it."""
    pod = tmp_path / "gs.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: gs, namespace: team}\nspec:\n"
        "  containers:\n  - name: main\n    image: cuda\n"
        '    resources: {limits: {aliyun.com/gpu-mem: "4096"}}\n'
    )
    result = fracgpu("admit", str(pod), "--cluster", str(EXAMPLES / "cluster.yaml"))
    assert result.returncode == 1
    assert "could ever hold this pod" in result.stderr
    assert "(aliyun.com/gpu-mem is read in GiB here: webhook setting gpushare-memory-unit)" in (
        result.stderr
    )
    result = fracgpu(
        "admit", str(pod), "--cluster", str(EXAMPLES / "cluster.yaml"),
        "--gpushare-memory-unit", "MiB",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
