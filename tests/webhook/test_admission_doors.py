"""Issue 19, admission side: doors a pod spec could open around its slice, through /mutate
then /validate of a real HTTPS webhook. Each attack is denied with a message naming the
field or the grant; the same pod without the attack, or with the grant, is admitted."""

import copy
from typing import Any

import pytest

from fracgpu.names import REGION_VOLUME_PREFIX, region_volume_name
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import CLUSTER, Webhook, cluster_state, gpu_pod, plain_pod
from webhook.admission.shimguard import host_path_findings
from webhook.cli.client import build_review

CORE, MEM = "tencent.com/vcuda-core", "tencent.com/vcuda-memory"
SHARE = {CORE: "50", MEM: "4"}
HAMI_BEST_EFFORT = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}


def granted_cluster() -> dict[str, Any]:
    """The test cluster plus a namespace whose GPUQuota grants high priority and privileges,
    and one whose GPUQuota grants nothing."""
    cluster = copy.deepcopy(CLUSTER)
    cluster["quotas"] = [
        *cluster["quotas"],
        {
            "metadata": {"namespace": "trusted", "name": "grants"},
            "spec": {"grants": {"priority": "high", "privilegedContainers": True}},
        },
        {"metadata": {"namespace": "plain", "name": "limits"}, "spec": {"hard": {"cores": 400}}},
    ]
    return cluster


@pytest.fixture
async def hook(start: StartWebhook) -> Webhook:
    return await start(cluster_state(granted_cluster()))


# -- priority is granted, never self-assigned ------------------------------------------------
HIGH_PRIORITY = [
    pytest.param({"annotations": {"fracgpu.io/priority": "high"}}, {}, id="fracgpu-annotation"),
    pytest.param({"annotations": {"nvidia.com/priority": "0"}}, {}, id="hami-annotation"),
    pytest.param({}, {"nvidia.com/priority": "0"}, id="hami-container-limit"),
]


@pytest.mark.parametrize(("meta", "extra_limits"), HIGH_PRIORITY)
@pytest.mark.parametrize("namespace", ["team", "plain"])
async def test_high_priority_needs_a_grant_and_the_denial_names_it(
    hook: Webhook, meta: dict[str, Any], extra_limits: dict[str, str], namespace: str
) -> None:
    pod = gpu_pod({**SHARE, **extra_limits}, namespace=namespace, **meta)
    result = await hook.admit(pod)
    assert not result.allowed
    assert "asks for high compute priority" in result.message
    assert f"namespace {namespace} has no grant" in result.message
    assert "spec.grants.priority" in result.message
    view = await hook.state.view()
    free = [view.gpu_free(n.name, d.uuid)[0] for n in view.nodes() for d in n.devices]
    assert free == [100, 100, 100]  # nothing reserved
    # granted by an administrator's GPUQuota: admitted; low priority needs no grant
    granted = await hook.admit(gpu_pod({**SHARE, **extra_limits}, namespace="trusted", **meta))
    assert granted.allowed, granted.message
    # fracgpu's annotation wins over HAMi's, as in the agent: this pod runs at low priority
    low = {"fracgpu.io/priority": "low", "nvidia.com/priority": "0"}
    assert (await hook.admit(gpu_pod(SHARE, namespace=namespace, annotations=low))).allowed


async def test_priority_added_by_a_later_webhook_is_denied_at_validation(hook: Webhook) -> None:
    result = await hook.admit(gpu_pod(SHARE))
    assert result.allowed
    pod = copy.deepcopy(result.pod)
    pod["metadata"]["annotations"]["fracgpu.io/priority"] = "high"
    reply = await hook.client.review("/validate", build_review(pod))
    assert not reply.allowed
    assert "spec.grants.priority" in reply.message


@pytest.mark.parametrize(
    ("key", "value"), [("fracgpu.io/priority", "high"), ("nvidia.com/priority", "0")]
)
async def test_raising_priority_by_update_is_denied(hook: Webhook, key: str, value: str) -> None:
    placed = (await hook.admit(gpu_pod(SHARE))).pod
    raised = copy.deepcopy(placed)
    raised["metadata"]["annotations"][key] = value
    reply = await hook.client.review("/validate", build_review(raised, "UPDATE", old=placed))
    assert not reply.allowed
    assert "spec.grants.priority" in reply.message
    # Changing anything else, or lowering it, stays allowed.
    other = copy.deepcopy(placed)
    other["metadata"]["annotations"]["note"] = "x"
    assert (
        await hook.client.review("/validate", build_review(other, "UPDATE", old=placed))
    ).allowed


# -- best-effort pods count against quota --------------------------------------------------------
async def test_best_effort_pods_count_as_gpus_in_quota(hook: Webhook) -> None:
    # namespace "wholes" may hold 1 GPU; best effort used to count as none, without bound
    first = await hook.admit(gpu_pod(HAMI_BEST_EFFORT, name="a", namespace="wholes"))
    assert first.allowed, first.message
    second = await hook.admit(gpu_pod(HAMI_BEST_EFFORT, name="b", namespace="wholes"))
    assert not second.allowed
    assert "GPUQuota wholes/whole-gpus is exceeded: this pod asks 1 GPUs" in second.message


async def test_best_effort_pods_count_memory_and_get_a_memory_slice(hook: Webhook) -> None:
    # "limited" allows 0 GPUs: a best-effort pod, paced by nothing, may not run there
    denied = await hook.admit(gpu_pod(HAMI_BEST_EFFORT, namespace="limited"))
    assert not denied.allowed
    assert "GPUQuota limited/small is exceeded" in denied.message
    placed = await hook.admit(gpu_pod(HAMI_BEST_EFFORT, namespace="team"))
    resources = placed.pod["spec"]["containers"][0]["resources"]["limits"]
    assert resources == {MEM: "4"}  # a 1 GiB memory slice, no compute reserved


# -- mounts over the shim's paths -----------------------------------------------------------------
SHIM_MOUNTS = [
    "/etc/ld.so.preload",
    "/etc//ld.so.preload/",
    "/etc/./ld.so.preload",
    "/tmp/../etc/ld.so.preload",
    "/opt/x/ld.so.preload",
    "/usr/local/fracgpu",
    "/usr/local/fracgpu/lib",
    "/usr/local/fracgpu/lib/libfracgpu.so",
    "/etc/fracgpu",
    "/etc/fracgpu/limits",
    "/var/run/fracgpu",
    "/var/run/fracgpu/region",
    "/run/fracgpu",
    "/var/run/fracgpu-node",
    "/run/fracgpu-node/GPU-x",
    "/",
]


def with_mount(pod: dict[str, Any], path: str, **extra: Any) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path, **extra}]
    return pod


ORDINARY_MOUNTS = ["/var/run", "/etc", "/usr/local", "/run", "/data", "/var/run/fracgpu2"]


@pytest.mark.parametrize(
    ("path", "ordinary"), list(zip(SHIM_MOUNTS, ORDINARY_MOUNTS * 3, strict=False))
)
async def test_mount_over_the_shim_in_a_gpu_container_is_denied(
    hook: Webhook, path: str, ordinary: str
) -> None:
    result = await hook.admit(with_mount(gpu_pod(SHARE), path, subPath="x"))
    assert not result.allowed
    assert "mounts over fracgpu's shim" in result.message
    assert f".spec.containers[0].volumeMounts[0].mountPath={path}" in result.message
    # a mount beside or above the shim's paths is left alone (the runtime mounts parents
    # first, so the shim's mounts land on top)
    beside = await hook.admit(with_mount(gpu_pod(SHARE), ordinary, subPath="x"))
    assert beside.allowed, beside.message


async def test_projected_volume_and_block_device_over_the_shim_are_denied(hook: Webhook) -> None:
    pod = gpu_pod(SHARE)
    pod["spec"]["volumes"] = [{"name": "p", "projected": {"sources": []}}]
    pod["spec"]["initContainers"] = [
        {
            "name": "setup",
            "image": "cuda",
            "resources": {"limits": SHARE},
            "volumeMounts": [{"name": "p", "mountPath": "/etc/fracgpu"}],
        }
    ]
    pod["spec"]["containers"][0]["volumeDevices"] = [
        {"name": "p", "devicePath": "/etc/ld.so.preload"}
    ]
    result = await hook.admit(pod)
    assert not result.allowed
    assert ".spec.initContainers[0].volumeMounts[0].mountPath=/etc/fracgpu" in result.message
    assert ".spec.containers[0].volumeDevices[0].devicePath=/etc/ld.so.preload" in result.message


async def test_only_gpu_containers_are_held_to_the_shims_paths(hook: Webhook) -> None:
    pod = gpu_pod(SHARE, extra_containers=[{"name": "side", "image": "busybox"}])
    pod["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    for index in (1, 0):  # a container without GPU has no shim to hide: admitted
        pod["spec"]["containers"][index]["volumeMounts"] = [
            {"name": "v", "mountPath": "/etc/fracgpu"}
        ]
        result = await hook.admit(pod)
        assert result.allowed is (index == 1), result.message


# -- each GPU container's region volume ----------------------------------------------------------
async def test_each_gpu_container_gets_a_memory_backed_region_volume_of_its_own(
    hook: Webhook,
) -> None:
    """Where the shim keeps its accounting region: the pod's own memory, never a host directory
    (what the container writes there counts against its pod's memory limit)."""
    second = {"name": "second", "image": "cuda", "resources": {"limits": SHARE}}
    side = {"name": "side", "image": "busybox"}
    placed = await hook.admit(gpu_pod(SHARE, extra_containers=[side, second]))
    assert placed.allowed, placed.message
    spec = placed.pod["spec"]
    assert [v for v in spec["volumes"] if v["name"].startswith(REGION_VOLUME_PREFIX)] == [
        {
            "name": region_volume_name(name),
            "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"},
        }
        for name in ("main", "second")
    ]
    mounts = {c["name"]: c.get("volumeMounts") for c in spec["containers"]}
    assert mounts == {
        "main": [{"name": region_volume_name("main"), "mountPath": "/var/run/fracgpu"}],
        "side": None,
        "second": [{"name": region_volume_name("second"), "mountPath": "/var/run/fracgpu"}],
    }


async def test_a_region_volume_is_its_containers_alone_and_only_in_memory(
    hook: Webhook,
) -> None:
    """The attacks: a tenant declares a volume of the region's name on the host, mounts a
    GPU container's region into a sidecar (which could then write that container's
    accounting), or mounts it a second time elsewhere. The volume of that name becomes
    fracgpu's; the other mounts are denied."""
    region = region_volume_name("main")
    pod = gpu_pod(SHARE)
    pod["spec"]["volumes"] = [{"name": region, "hostPath": {"path": "/var/tmp/region"}}]
    placed = await hook.admit(pod)
    assert placed.allowed, placed.message
    assert placed.pod["spec"]["volumes"] == [
        {"name": region, "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}
    ]
    peek = {
        "name": "side",
        "image": "busybox",
        "volumeMounts": [{"name": region, "mountPath": "/x"}],
    }
    result = await hook.admit(gpu_pod(SHARE, extra_containers=[peek]))
    assert not result.allowed
    assert (
        f".spec.containers[1].volumeMounts[0].name={region} (a fracgpu region volume: only its "
        "own container mounts it)" in result.message
    ), result.message
    pod = gpu_pod(SHARE)
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": region, "mountPath": "/data"}]
    result = await hook.admit(pod)
    assert not result.allowed
    assert (
        f".spec.containers[0].volumeMounts[0].name={region} (its region volume: mounted once, "
        "at /var/run/fracgpu, and the emptyDir of medium Memory and sizeLimit 16Mi fracgpu "
        "writes)" in result.message
    ), result.message


def ephemeral_object_review(pod: str, namespace: str, debug: dict[str, Any]) -> dict[str, Any]:
    """The review Kubernetes 1.20-1.21 send when ``debug`` is added to a pod: an update of
    an EphemeralContainers object, which does not show the pod."""
    meta = {"name": pod, "namespace": namespace}
    old = {"apiVersion": "v1", "kind": "EphemeralContainers", "metadata": meta}
    new = {**old, "ephemeralContainers": [debug]}
    review = build_review(new, "UPDATE", old=old, sub_resource="ephemeralcontainers")
    review["request"]["kind"] = {"group": "", "version": "v1", "kind": "EphemeralContainers"}
    return review


async def test_a_debug_container_may_not_mount_a_gpu_containers_region_volume(
    hook: Webhook,
) -> None:
    """The attack: add a debug container to a running GPU pod that mounts the GPU
    container's region volume, and rewrite that container's accounting from it. In both
    shapes the update takes (a pod on 1.22+, an EphemeralContainers object on 1.20-1.21)."""
    placed = await hook.admit(gpu_pod(SHARE))
    assert placed.allowed, placed.message
    region = region_volume_name("main")
    for mounts, allowed in (([{"name": region, "mountPath": "/x"}], False), ([], True)):
        debugger = {
            "name": "debugger",
            "image": "busybox",
            "volumeMounts": mounts,
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
        debug = copy.deepcopy(placed.pod)
        debug["spec"]["ephemeralContainers"] = [debugger]
        reply = await hook.client.review(
            "/validate",
            build_review(debug, "UPDATE", old=placed.pod, sub_resource="ephemeralcontainers"),
        )
        assert reply.allowed is allowed, reply.message
        review = ephemeral_object_review(placed.pod["metadata"]["name"], "team", debugger)
        reply_1_20 = await hook.client.review("/validate", review)
        assert reply_1_20.allowed is allowed, reply_1_20.message
        if not allowed:
            for message in (reply.message, reply_1_20.message):
                assert message.startswith(
                    "this debug container mounts a GPU container's region volume: "
                    f'.spec.ephemeralContainers["debugger"].volumeMounts[0].name={region} '
                    "(a fracgpu region volume: only its own container mounts it)"
                ), message


async def test_a_region_volume_changed_after_fracgpu_wrote_it_is_denied(hook: Webhook) -> None:
    """Another mutating webhook (or a tenant's own) that turns the region volume into a host
    directory, or lifts its size, is caught by the validating webhook."""
    placed = await hook.admit(gpu_pod(SHARE))
    assert placed.allowed, placed.message
    region = region_volume_name("main")
    for volume in (
        {"hostPath": {"path": "/var/tmp/region"}},
        {"emptyDir": {"sizeLimit": "16Mi"}},  # on the host's disk
        {"emptyDir": {"medium": "Memory", "sizeLimit": "100Gi"}},
    ):
        pod = copy.deepcopy(placed.pod)
        pod["spec"]["volumes"] = [
            {"name": region, **volume} if v["name"] == region else v for v in pod["spec"]["volumes"]
        ]
        validated = await hook.client.review("/validate", build_review(pod, username="alice"))
        assert not validated.allowed, volume
        assert f".spec.containers[0].volumeMounts[0].name={region} (its region volume" in (
            validated.message
        ), validated.message


# -- hostPath to the agent's and device plugins' directories ------------------------------------
HOST_PATHS = [
    "/",
    "/var",
    "/var/lib",
    "//var/lib/",
    "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/lib/kubelet/pod-resources",
    # Every pod's volumes, every GPU container's region volume among them.
    "/var/lib/kubelet/pods",
    "/var/lib/kubelet/pods/uid/volumes",
    "/var/lib/fracgpu",
    "/var/lib/fracgpu/containers/x",
    "/var/lib/fracgpu/node",
    "/var/log/../lib/fracgpu",
    # A route to all of the above: another container's root, read-only mount or not.
    "/proc",
    "/proc/1/root",
    "/proc/self/root/var/lib/fracgpu",
]


def with_host_path(pod: dict[str, Any], path: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "host", "mountPath": "/host", "subPath": "kubelet/device-plugins"}
    ]
    return pod


OTHER_HOST_PATHS = [
    "/var/log",
    "/var/lib/kubelet/plugins",
    "/opt/data",
    "/var/lib/fracgpu2",
    "/sysroot",
]


@pytest.mark.parametrize(
    ("path", "other"), list(zip(HOST_PATHS, OTHER_HOST_PATHS * 3, strict=False))
)
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-pod", "plain-pod"])
async def test_host_path_reaching_protected_directories_is_denied(
    hook: Webhook, path: str, other: str, gpu: bool
) -> None:
    pod = gpu_pod(SHARE) if gpu else plain_pod()
    result = await hook.admit(with_host_path(pod, path))
    assert not result.allowed
    assert f".spec.volumes[0].hostPath.path={path}" in result.message
    assert "fracgpu.io/ignore=true" in result.message
    pod = gpu_pod(SHARE) if gpu else plain_pod()
    assert (await hook.admit(with_host_path(pod, other))).allowed


@pytest.mark.parametrize(
    "key", ["cdi.k8s.io/gpu", "cdi-devices.nri.io/container.main", "devices.nri.io/container.main"]
)
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-pod", "plain-pod"])
async def test_annotations_that_inject_devices_are_denied(
    hook: Webhook, key: str, gpu: bool
) -> None:
    """The attack: where the node has the NVIDIA CDI spec, cdi.k8s.io/x: nvidia.com/gpu=all
    has the runtime give the container every GPU, with no shim and no slice."""
    pod = gpu_pod(SHARE) if gpu else plain_pod()
    pod["metadata"].setdefault("annotations", {})[key] = "nvidia.com/gpu=all"
    result = await hook.admit(pod)
    assert not result.allowed
    assert f"this pod sets annotation {key}, which asks the container runtime" in result.message
    # The same pod without it is admitted; so is an unrelated annotation.
    pod["metadata"]["annotations"] = {"example.com/cdi": "x"}
    assert (await hook.admit(pod)).allowed


async def test_a_device_injection_annotation_added_by_update_is_denied(hook: Webhook) -> None:
    """A container that restarts is created with the pod's annotations as they are then."""
    placed = (await hook.admit(plain_pod())).pod
    changed = copy.deepcopy(placed)
    changed["metadata"].setdefault("annotations", {})["cdi.k8s.io/gpu"] = "nvidia.com/gpu=all"
    reply = await hook.client.review("/validate", build_review(changed, "UPDATE", old=placed))
    assert not reply.allowed
    assert "annotation cdi.k8s.io/gpu, which asks the container runtime" in reply.message


def with_sys_volume(pod: dict[str, Any], path: str, *read_only: bool) -> dict[str, Any]:
    """A hostPath volume at ``path``, mounted by as many containers as ``read_only`` has
    flags (the pod's first container, then init containers), each read-only or not."""
    pod["spec"]["volumes"] = [{"name": "sys", "hostPath": {"path": path}}]
    mounts = [{"name": "sys", "mountPath": "/host/sys", "readOnly": flag} for flag in read_only]
    pod["spec"]["containers"][0]["volumeMounts"] = mounts[:1]
    pod["spec"]["initContainers"] = [
        {"name": f"init{i}", "image": "busybox", "volumeMounts": [mount]}
        for i, mount in enumerate(mounts[1:])
    ]
    return pod


@pytest.mark.parametrize("path", ["/sys", "/sys/fs/cgroup", "/sys/bus/pci/devices", "//sys/."])
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-pod", "plain-pod"])
async def test_host_path_under_sys_is_refused_mounted_writable(
    hook: Webhook, path: str, gpu: bool
) -> None:
    """cgroup v1 device files grant devices, a GPU's PCI files remove or reset it under
    every tenant; monitoring agents that only read /sys/fs/cgroup keep working."""

    def pod() -> dict[str, Any]:
        return gpu_pod(SHARE) if gpu else plain_pod()

    refused = await hook.admit(with_sys_volume(pod(), path, True, False))
    assert not refused.allowed
    assert f".spec.volumes[0].hostPath.path={path} (inside /sys, mounted writable)" in (
        refused.message
    )
    assert "unless every container mounts them readOnly" in refused.message
    assert (await hook.admit(with_sys_volume(pod(), path, True, True))).allowed
    assert (await hook.admit(with_sys_volume(pod(), path))).allowed  # mounted by no one


@pytest.mark.parametrize("read_only", [True, False])
async def test_a_debug_container_may_not_mount_a_sys_volume_writable(
    hook: Webhook, read_only: bool
) -> None:
    placed = (await hook.admit(with_sys_volume(plain_pod(), "/sys/fs/cgroup", True))).pod
    assert placed["spec"]["volumes"][0]["hostPath"]["path"] == "/sys/fs/cgroup"
    debug = copy.deepcopy(placed)
    debug["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "busybox",
            "volumeMounts": [{"name": "sys", "mountPath": "/s", "readOnly": read_only}],
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
    ]
    reply = await hook.client.review(
        "/validate",
        build_review(debug, "UPDATE", old=placed, sub_resource="ephemeralcontainers"),
    )
    assert reply.allowed is read_only, reply.message
    if not read_only:
        assert "(inside /sys, mounted writable)" in reply.message


async def test_protected_host_paths_are_a_setting(start: StartWebhook) -> None:
    hook = await start(cluster_state(granted_cluster()), protected_host_paths="/srv/agent")
    assert not (await hook.admit(with_host_path(plain_pod(), "/srv"))).allowed
    assert (await hook.admit(with_host_path(plain_pod(), "/var/lib/fracgpu"))).allowed
    # /proc reaches any directory, whatever the setting names.
    refused = await hook.admit(with_host_path(plain_pod(), "/proc/1/root"))
    assert not refused.allowed
    assert "above /srv/agent, /proc, nor inside /sys" in refused.message


# -- privileged GPU pods ---------------------------------------------------------------------
def privileged(
    pod: dict[str, Any], context: dict[str, Any], field: str = "containers"
) -> dict[str, Any]:
    if field == "containers":
        pod["spec"]["containers"][0]["securityContext"] = context
    else:
        pod["spec"][field] = [{"name": "init", "image": "busybox", "securityContext": context}]
    return pod


PRIVILEGES = [
    pytest.param(
        {"privileged": True},
        "containers",
        ".spec.containers[0].securityContext.privileged=true",
        id="privileged",
    ),
    pytest.param(
        {"privileged": True},
        "initContainers",
        ".spec.initContainers[0].securityContext.privileged=true",
        id="init-privileged",
    ),
    pytest.param(
        {"capabilities": {"add": ["SYS_ADMIN"]}},
        "containers",
        "capabilities.add=SYS_ADMIN",
        id="sys-admin",
    ),
    pytest.param(
        {"capabilities": {"add": ["cap_sys_ptrace"]}},
        "containers",
        "capabilities.add=cap_sys_ptrace",
        id="ptrace",
    ),
    pytest.param(
        {"capabilities": {"add": ["ALL"]}}, "initContainers", "capabilities.add=ALL", id="all"
    ),
]


@pytest.mark.parametrize(("context", "field", "named"), PRIVILEGES)
async def test_privileged_gpu_pods_need_a_grant(
    hook: Webhook, context: dict[str, Any], field: str, named: str
) -> None:
    result = await hook.admit(privileged(gpu_pod(SHARE), context, field))
    assert not result.allowed
    assert named in result.message
    assert "spec.grants.privilegedContainers" in result.message
    granted = await hook.admit(privileged(gpu_pod(SHARE, namespace="trusted"), context, field))
    assert granted.allowed, granted.message
    # other capabilities need no grant, nor does a pod without GPUs (Pod Security's business)
    other = {"capabilities": {"add": ["NET_ADMIN"]}}
    assert (await hook.admit(privileged(gpu_pod(SHARE), other, field))).allowed
    assert (await hook.admit(privileged(plain_pod(), context, field))).allowed


async def test_host_pid_gpu_pod_needs_a_grant(hook: Webhook) -> None:
    pod = gpu_pod(SHARE)
    pod["spec"]["hostPID"] = True
    result = await hook.admit(pod)
    assert not result.allowed
    assert ".spec.hostPID=true" in result.message


async def test_privileged_debug_container_on_a_gpu_pod_needs_a_grant(hook: Webhook) -> None:
    for namespace in ("team", "trusted"):
        await _debug_privileged(hook, namespace)


async def _debug_privileged(hook: Webhook, namespace: str) -> None:
    placed = (await hook.admit(gpu_pod(SHARE, namespace=namespace))).pod
    debug = copy.deepcopy(placed)
    debug["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "busybox",
            "securityContext": {"privileged": True},
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
    ]
    reply = await hook.client.review(
        "/validate",
        build_review(debug, "UPDATE", old=placed, sub_resource="ephemeralcontainers"),
    )
    if namespace == "trusted":
        assert reply.allowed, reply.message
    else:
        assert not reply.allowed
        assert (
            '.spec.ephemeralContainers["debugger"].securityContext.privileged=true' in reply.message
        )


async def test_privileged_debug_container_in_the_1_20_object_shape_needs_a_grant(
    hook: Webhook,
) -> None:
    """Kubernetes 1.20-1.21 send an EphemeralContainers object, which does not say whether
    the pod holds GPUs: a privileged debug container is checked as if it did."""
    debug = {
        "name": "debugger",
        "image": "busybox",
        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
    }
    for namespace in ("team", "trusted"):
        review = ephemeral_object_review("web", namespace, debug)
        reply = await hook.client.review("/validate", review)
        assert reply.allowed is (namespace == "trusted"), reply.message
        if namespace == "team":
            assert "capabilities.add=SYS_ADMIN" in reply.message
    # a debug container without privileges needs no grant
    calm = {**debug, "securityContext": {}}
    review = ephemeral_object_review("web", "team", calm)
    assert (await hook.client.review("/validate", review)).allowed


def test_a_huge_host_path_is_quoted_only_in_part() -> None:
    """The path is the tenant's: a megabyte under /var/lib/fracgpu is named, not echoed."""
    path = "/var/lib/fracgpu/" + "a" * (1 << 20)
    pod = {"spec": {"containers": [], "volumes": [{"name": "v", "hostPath": {"path": path}}]}}
    (finding,) = host_path_findings(pod, ["/var/lib/fracgpu"])
    assert finding.startswith(".spec.volumes[0].hostPath.path=/var/lib/fracgpu/aaa")
    assert finding.endswith("(reaches /var/lib/fracgpu)") and len(finding) < 300
