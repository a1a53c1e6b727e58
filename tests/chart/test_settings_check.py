"""The settings-check hook: before an install or upgrade changes the webhook configurations
(failurePolicy Fail) or the Deployment, a Job runs `fracgpu serve --check-settings` with the
webhook container's environment, so that values the schema lets through but the webhook's
settings loader refuses fail `helm install` with the reason, instead of leaving webhook pods
that never start while every pod create in managed namespaces is refused.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.chart.chartfiles import CHART_DIR, default_values
from tests.chart.render import Rendered, render
from tests.chart.render_setup import renderer_or_skip
from tests.chart.test_render import _container, _env
from tests.webhook.clirun import run_fracgpu
from webhook import settings

REPO = CHART_DIR.parents[1]
HAMI = CHART_DIR / "values-hami.yaml"
JOB = "fracgpu-settings-check"
# The pod's name as the downward API gives it (the check does not use it otherwise).
DOWNWARD = {"metadata.name": f"{JOB}-x7k2p"}


@pytest.fixture(scope="module")
def renderer() -> Path:
    return renderer_or_skip()


def _job(rendered: Rendered, name: str = JOB) -> dict[str, Any]:
    return rendered.one("Job", name)


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    return pod


def _webhook(rendered: Rendered, prefix: str = "fracgpu") -> dict[str, Any]:
    return _container(rendered.one("Deployment", f"{prefix}-webhook"), "webhook")


def _check(rendered: Rendered) -> subprocess.CompletedProcess[str]:
    """The hook's container as kubelet would start it, with the real `fracgpu` command."""
    container = _container(_job(rendered), "settings-check")
    return run_fracgpu(container["args"], _env(container, DOWNWARD))


PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "hami": {"value_files": [HAMI]},
    "queue": {"values": {"webhook": {"queue": {"enabled": True}}}},
    "extra-env": {
        "values": {
            "webhook": {"extraEnv": [{"name": "FRACGPU_ADMISSION_WINDOW_SECONDS", "value": "20"}]}
        }
    },
    "memory-in-mib": {"values": {"webhook": {"defaultGpuMemory": 5000}}},
    "other-release": {"name": "gpu", "namespace": "gpu-platform"},
}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_the_hook_runs_the_webhook_container_as_the_deployment_does(
    renderer: Path, profile: str
) -> None:
    options = PROFILES[profile]
    rendered = render(renderer=renderer, **options)
    prefix = "gpu-fracgpu" if profile == "other-release" else "fracgpu"
    webhook = _webhook(rendered, prefix)
    job = _job(rendered, f"{prefix}-settings-check")
    check = _container(job, "settings-check")
    assert check["env"] == webhook["env"]  # the same list, in the same order
    assert check["args"] == [*webhook["args"], "--check-settings"]
    assert "command" not in check and "command" not in webhook  # the image's fracgpu
    for same in ("image", "imagePullPolicy", "securityContext", "resources"):
        assert check[same] == webhook[same], same
    deployment_pod = _pod(rendered.one("Deployment", f"{prefix}-webhook"))
    assert _pod(job)["securityContext"] == deployment_pod["securityContext"]


def test_the_hook_runs_first_before_install_and_upgrade(renderer: Path) -> None:
    rendered = render(renderer=renderer)
    job = _job(rendered)
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    # Kept when it failed, for `kubectl logs`; replaced by the next attempt.
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weight = int(annotations["helm.sh/hook-weight"])
    other_hooks = [
        o
        for o in rendered.objects()
        if "helm.sh/hook" in (o["metadata"].get("annotations") or {})
        and o["metadata"]["name"] != JOB
    ]
    assert other_hooks  # the certificate hooks
    for hook in other_hooks:
        assert int(hook["metadata"]["annotations"]["helm.sh/hook-weight"]) > weight, hook
    # The verdict does not change on a retry, and the failed pod keeps its log.
    assert job["spec"]["backoffLimit"] == 0
    assert _pod(job)["restartPolicy"] == "Never"
    # Not selected by the webhook's Service or PodDisruptionBudget.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] != "webhook"


def test_the_hook_has_no_token_no_rbac_and_no_secret(renderer: Path) -> None:
    rendered = render(renderer=renderer, values={"image": {"pullSecrets": ["corp-registry"]}})
    pod = _pod(_job(rendered))
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert pod["imagePullSecrets"] == [{"name": "corp-registry"}]
    assert [v for v in pod.get("volumes", []) if "emptyDir" not in v] == []
    bound = [
        b
        for b in rendered.find("RoleBinding") + rendered.find("ClusterRoleBinding")
        if "settings-check" in b["metadata"]["name"]
    ]
    assert bound == []


def test_the_hook_accepts_the_chart_profiles(renderer: Path) -> None:
    for profile in ("default", "hami", "queue", "memory-in-mib"):
        result = _check(render(renderer=renderer, **PROFILES[profile]))
        assert result.returncode == 0, (profile, result.stderr)
        assert result.stdout.count("\n") == 1 and "settings are valid" in result.stdout


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = value
    return result


# Values that pass values.schema.json and render, but that the webhook refuses to start with.
REFUSED = {
    "settle time past the reservation TTL": {"webhook": {"settleSeconds": 400}},
    "takeover grace under the settle time": {
        "webhook": {"leaderElection": {"takeoverGraceSeconds": 1}}
    },
    "write-behind past the admission window": {"webhook": {"writeBehindSeconds": 60}},
    "controller interval at the TTL": {"webhook": {"controllerIntervalSeconds": 300}},
    "two resources of one name": {"resourceNames": {"hamiGpu": "tencent.com/vcuda-core"}},
}


@pytest.mark.parametrize("values", list(REFUSED.values()), ids=list(REFUSED))
def test_the_hook_refuses_what_the_webhook_would_with_its_message(
    renderer: Path, values: dict[str, Any]
) -> None:
    schema = yaml.safe_load((CHART_DIR / "values.schema.json").read_text())
    installed = yaml.safe_load((REPO / "tests" / "chart" / "installed-values.yaml").read_text())
    jsonschema.validate(_merged(_merged(default_values(), installed), values), schema)
    rendered = render(renderer=renderer, values=values)
    container = _container(_job(rendered), "settings-check")
    with pytest.raises(settings.SettingsError) as refused:
        settings.load(None, _env(container, DOWNWARD))
    result = _check(rendered)
    assert result.returncode == 2, result.stdout
    (line,) = result.stderr.splitlines()
    assert line.endswith(str(refused.value)), line
    # And the webhook's own container has the same environment: it would not start either.
    assert _env(_webhook(rendered), DOWNWARD) == _env(container, DOWNWARD)


def test_the_quickstart_says_where_a_refused_install_explains_itself(renderer: Path) -> None:
    name = _job(render(renderer=renderer))["metadata"]["name"]
    quickstart = (REPO / "docs" / "quickstart.md").read_text()
    assert f"kubectl -n fracgpu-system logs job/{name}" in quickstart
    # The schema checks each value alone; the hook the rest: neither text says otherwise.
    values_head = (CHART_DIR / "values.yaml").read_text().split("\n\n", 1)[0]
    for text in (values_head, quickstart):
        assert re.search(r"settings-check|--check-settings", text), text[:200]
