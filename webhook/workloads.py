"""The pod a workload manifest would make: ``fracgpu admit`` takes a Deployment, Job or other
controller's manifest as well as a Pod's, as operators' manifests mostly are those.

The pod is the template as its controller would create it: the template's labels and
annotations, the workload's namespace, a name the API server chooses from
``<workload name>-``, and the template's spec.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from webhook import documents
from webhook.documents import POD_TYPE, DocumentError

# (apiVersion, kind) -> the keys down to the pod template.
TEMPLATES: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    ("apps/v1", "Deployment"): ("spec", "template"),
    ("apps/v1", "StatefulSet"): ("spec", "template"),
    ("apps/v1", "DaemonSet"): ("spec", "template"),
    ("apps/v1", "ReplicaSet"): ("spec", "template"),
    ("v1", "ReplicationController"): ("spec", "template"),
    ("batch/v1", "Job"): ("spec", "template"),
    ("batch/v1", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
    ("batch/v1beta1", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}
# Named in messages: what else than a Pod is taken.
KINDS_TAKEN: Final = ", ".join(sorted({kind for _, kind in TEMPLATES}))


def is_workload(document: Mapping[str, Any]) -> bool:
    version, kind = document.get("apiVersion"), document.get("kind")
    return isinstance(version, str) and isinstance(kind, str) and (version, kind) in TEMPLATES


def pod_of(document: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The pod ``document`` (a workload ``is_workload`` takes) would make."""
    keys = TEMPLATES[(document["apiVersion"], document["kind"])]
    template: Any = document
    for depth, key in enumerate(keys):
        template = template.get(key) if isinstance(template, Mapping) else None
        if not isinstance(template, Mapping):
            where = ".".join(keys[: depth + 1])
            raise DocumentError(
                f"{source}: {document['kind']} has no {where} mapping: a workload is taken "
                "by its pod template"
            )
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        raise DocumentError(f"{source}: {document['kind']} has no {'.'.join(keys)}.spec mapping")
    workload_meta = document.get("metadata")
    workload_meta = workload_meta if isinstance(workload_meta, Mapping) else {}
    template_meta = template.get("metadata")
    template_meta = template_meta if isinstance(template_meta, Mapping) else {}
    metadata: dict[str, Any] = {
        key: template_meta[key] for key in ("labels", "annotations") if key in template_meta
    }
    name = workload_meta.get("name")
    metadata["generateName"] = f"{name}-" if isinstance(name, str) and name else "pod-"
    namespace = workload_meta.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str):
            raise DocumentError(f"{source}: metadata.namespace must be a string")
        metadata["namespace"] = namespace
    return {**POD_TYPE, "metadata": metadata, "spec": dict(spec)}


def load_manifest(path: Path) -> tuple[dict[str, Any], str | None]:
    """The pod in ``path``, and the workload kind that would make it (None for a Pod): a Pod
    manifest, or the pod every kind in ``TEMPLATES`` would make; a DocumentError naming those
    kinds for anything else. What ``fracgpu admit`` and ``fracgpu demo`` read."""
    document = documents.load(path)
    if isinstance(document, dict) and is_workload(document):
        return pod_of(document, str(path)), str(document["kind"])
    also = f"or a workload with a pod template ({KINDS_TAKEN})"
    return documents.as_pod(document, path, also=also), None
