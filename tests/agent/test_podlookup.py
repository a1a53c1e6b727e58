"""Reading pods from the API: found, missing, API unreachable, which containers mount their
region volume."""

import copy
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import kubernetes.client
import pytest

from agent.podlookup import KubernetesPodLookup, PodLookupError
from fracgpu import region_volume

# A variation of a pod whose container "main" mounts its region volume as the webhook writes
# it: a spec edited in place.
Variation = Callable[[dict[str, Any]], None]


def _region_pod(name: str, vary: Variation | None = None) -> dict[str, Any]:
    main = {"name": "main", "image": "busybox", "volumeMounts": [region_volume.mount("main")]}
    spec: dict[str, Any] = {
        "containers": [main, {"name": "side", "image": "busybox"}],
        "volumes": [region_volume.volume("main")],
    }
    if vary is not None:
        vary(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _set(path: tuple[Any, ...], value: Any) -> Variation:
    def vary(spec: dict[str, Any]) -> None:
        target: Any = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return vary


_MOUNT = ("containers", 0, "volumeMounts", 0)
_VOLUME = ("volumes", 0)
# Mounts the shim cannot keep its region in, or that are not the memory-backed volume the
# webhook writes; the validating webhook refuses each, and the agent must not start them.
_NOT_THE_REGION: dict[str, Variation] = {
    "read-only": _set((*_MOUNT, "readOnly"), True),
    "sub-path": _set((*_MOUNT, "subPath"), "x"),
    "elsewhere": _set((*_MOUNT, "mountPath"), "/var/run/other"),
    "on-disk": _set((*_VOLUME, "emptyDir"), {}),
    "larger": _set((*_VOLUME, "emptyDir", "sizeLimit"), "1Gi"),
    "host-path": _set(
        _VOLUME, {"name": region_volume.volume("main")["name"], "hostPath": {"path": "/tmp"}}
    ),
    "no-volume": _set(("volumes",), []),
    "another-containers": _set(_MOUNT, region_volume.mount("side")),
}


@pytest.fixture
def unreachable_api() -> Iterator[kubernetes.client.ApiClient]:
    configuration = kubernetes.client.Configuration()
    configuration.host = "https://127.0.0.1:9"  # nothing listens on the discard port
    configuration.retries = False
    client = kubernetes.client.ApiClient(configuration)
    yield client
    client.close()


def test_unreachable_api_is_a_clear_error(unreachable_api: kubernetes.client.ApiClient) -> None:
    lookup = KubernetesPodLookup(kubernetes.client.CoreV1Api(unreachable_api))
    with pytest.raises(PodLookupError, match="cannot read pod ns/p: the API did not answer"):
        lookup.get("ns", "p")


@pytest.mark.e2e
def test_reads_the_assignment_and_reports_missing_pods(
    kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    core = kubernetes.client.CoreV1Api(kube_client)
    annotated = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "plain",
            "annotations": {"example.com/note": "x", "nvidia.com/priority": "0"},
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    created = core.create_namespaced_pod(namespace, annotated)
    lookup = KubernetesPodLookup(core)
    pod = lookup.get(namespace, "plain")
    assert pod.uid == created.metadata.uid and pod.assignment is None
    assert pod.priority == {"nvidia.com/priority": "0"}
    with pytest.raises(PodLookupError, match=f"cannot read pod {namespace}/gone: 404"):
        lookup.get(namespace, "gone")


def _lookup_of(pod: dict[str, Any]) -> KubernetesPodLookup:
    """A lookup whose API answers ``pod`` as the client library would: as its models."""
    client = kubernetes.client.ApiClient()
    model = client._ApiClient__deserialize(copy.deepcopy(pod), "V1Pod")  # type: ignore[attr-defined]
    model.metadata.uid = "uid-1"
    api = SimpleNamespace(read_namespaced_pod=lambda *_, **__: model, api_client=client)
    return KubernetesPodLookup(api)


def test_a_container_mounting_its_region_volume_as_written_is_found() -> None:
    assert _lookup_of(_region_pod("p")).get("ns", "p").region_containers == {"main"}


@pytest.mark.parametrize("variation", sorted(_NOT_THE_REGION))
def test_any_other_region_mount_is_not_found(variation: str) -> None:
    pod = _region_pod("p", _NOT_THE_REGION[variation])
    assert _lookup_of(pod).get("ns", "p").region_containers == frozenset()


@pytest.mark.e2e
def test_the_region_mount_survives_the_api_servers_round_trip(
    kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    """The agent compares what the API server stores with what the webhook wrote, to the
    letter: a default or a reformatted quantity added on the way would refuse every pod."""
    core = kubernetes.client.CoreV1Api(kube_client)
    lookup = KubernetesPodLookup(core)
    core.create_namespaced_pod(namespace, _region_pod("as-written"))
    assert lookup.get(namespace, "as-written").region_containers == {"main"}
    for variation in ("read-only", "larger", "on-disk"):
        name = f"not-{variation}"
        core.create_namespaced_pod(namespace, _region_pod(name, _NOT_THE_REGION[variation]))
        assert lookup.get(namespace, name).region_containers == frozenset(), variation
