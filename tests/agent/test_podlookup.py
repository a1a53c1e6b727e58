"""Reading pods from the API: found, missing, API unreachable."""

from collections.abc import Iterator

import kubernetes.client
import pytest

from agent.podlookup import KubernetesPodLookup, PodLookupError


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
