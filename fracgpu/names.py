"""Every externally visible name in one place: resources, annotations, labels, env vars, paths."""

import hashlib
from typing import Final

GROUP: Final = "fracgpu.io"
CRD_VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{CRD_VERSION}"
GPUNODE_KIND: Final = "GPUNode"
GPUNODE_PLURAL: Final = "gpunodes"
GPUQUOTA_KIND: Final = "GPUQuota"
GPUQUOTA_PLURAL: Final = "gpuquotas"

# Canonical resources (TKEStack units): 100 cores = one whole GPU; memory in 256 MiB blocks.
RESOURCE_VCUDA_CORE: Final = "tencent.com/vcuda-core"
RESOURCE_VCUDA_MEMORY: Final = "tencent.com/vcuda-memory"
RESOURCE_VCUDA_CORE_LIMIT: Final = "tencent.com/vcuda-core-limit"
CORES_PER_GPU: Final = 100
MEMORY_BLOCK_MIB: Final = 256
# Virtual GPU memory may be at most this many times the physical (HAMi deviceMemoryScaling).
MAX_MEMORY_SCALING: Final = 16.0

# HAMi dialect.
RESOURCE_HAMI_GPU: Final = "nvidia.com/gpu"
RESOURCE_HAMI_GPUMEM: Final = "nvidia.com/gpumem"
RESOURCE_HAMI_GPUMEM_PERCENTAGE: Final = "nvidia.com/gpumem-percentage"
RESOURCE_HAMI_GPUCORES: Final = "nvidia.com/gpucores"

# Alibaba gpushare dialect.
RESOURCE_GPUSHARE_MEM: Final = "aliyun.com/gpu-mem"
RESOURCE_GPUSHARE_COUNT: Final = "aliyun.com/gpu-count"

# Annotations and labels fracgpu writes; users may not set any key under these prefixes.
ANNOTATION_PREFIX: Final = f"{GROUP}/"
ANNOTATION_ASSIGNMENT: Final = f"{GROUP}/assignment"
ANNOTATION_RESERVATION_ID: Final = f"{GROUP}/reservation-id"
LABEL_ASSIGNED_NODE: Final = f"{GROUP}/node"
LABEL_MANAGED: Final = f"{GROUP}/assigned"
# Queue mode: admission charged quota but placed nothing; the pod waits for the scheduler
# named below (stock kube-scheduler calling fracgpu's extender), which places it at bind.
ANNOTATION_QUEUED: Final = f"{GROUP}/queued"
DEFAULT_SCHEDULER_NAME: Final = "fracgpu-scheduler"

# Annotations users may set to steer placement.
ANNOTATION_POLICY: Final = f"{GROUP}/policy"
ANNOTATION_USE_MODELS: Final = f"{GROUP}/use-gpu-models"
ANNOTATION_AVOID_MODELS: Final = f"{GROUP}/avoid-gpu-models"
ANNOTATION_PRIORITY: Final = f"{GROUP}/priority"
HAMI_ANNOTATION_USE_GPUTYPE: Final = "nvidia.com/use-gputype"
HAMI_ANNOTATION_NOUSE_GPUTYPE: Final = "nvidia.com/nouse-gputype"
HAMI_ANNOTATION_USE_GPUUUID: Final = "nvidia.com/use-gpuuuid"
HAMI_ANNOTATION_NOUSE_GPUUUID: Final = "nvidia.com/nouse-gpuuuid"
HAMI_ANNOTATION_PRIORITY: Final = "nvidia.com/priority"
# HAMi's placement policies (binpack or spread) for nodes and for GPUs within a node.
HAMI_ANNOTATION_NODE_POLICY: Final = "hami.io/node-scheduler-policy"
HAMI_ANNOTATION_GPU_POLICY: Final = "hami.io/gpu-scheduler-policy"
# HAMi's own form is a container limit of the same name (its resourcePriority).
RESOURCE_HAMI_PRIORITY: Final = HAMI_ANNOTATION_PRIORITY
USER_ANNOTATIONS: Final = frozenset(
    {ANNOTATION_POLICY, ANNOTATION_USE_MODELS, ANNOTATION_AVOID_MODELS, ANNOTATION_PRIORITY}
)
# The pod annotations the agent reads when a container (re)starts, so an update changing
# one on a running pod takes effect at its next restart: the webhook's UPDATE check must see
# such updates. The compute priority (fracgpu's word first, then HAMi's number) is read
# besides the assignment and the queued entry. The chart's update matchCondition names
# every key outside fracgpu.io/ (tests/chart/test_files.py holds it to this list).
PRIORITY_ANNOTATIONS: Final = (ANNOTATION_PRIORITY, HAMI_ANNOTATION_PRIORITY)
AGENT_READ_ANNOTATIONS: Final = (ANNOTATION_ASSIGNMENT, ANNOTATION_QUEUED, *PRIORITY_ANNOTATIONS)

# Namespace label that opts a namespace out of fracgpu entirely.
NAMESPACE_LABEL_OPT_OUT: Final = f"{GROUP}/ignore"

# Environment variables fracgpu owns inside GPU containers; users may not set them.
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_LD_PRELOAD: Final = "LD_PRELOAD"
VISIBLE_DEVICES_NONE: Final = "void"
# Shim variables a user may set: they can only lower a limit or raise log verbosity.
ENV_SHIM_MEMORY_LIMIT: Final = "FRACGPU_MEMORY_LIMIT"
ENV_SHIM_CORE_LIMIT: Final = "FRACGPU_CORE_LIMIT"
ENV_SHIM_LOG_LEVEL: Final = "FRACGPU_LOG_LEVEL"
USER_SHIM_VARIABLES: Final = frozenset(
    {ENV_SHIM_MEMORY_LIMIT, ENV_SHIM_CORE_LIMIT, ENV_SHIM_LOG_LEVEL}
)
RESERVED_ENV_PREFIX: Final = "FRACGPU_"
RESERVED_ENV: Final = frozenset({ENV_VISIBLE_DEVICES, ENV_LD_PRELOAD})

# Shim file ABI inside the container (mounted by the device plugin, but the region's directory).
CONTAINER_LIMITS_PATH: Final = "/etc/fracgpu/limits"
CONTAINER_REGION_DIR: Final = "/var/run/fracgpu"
CONTAINER_REGION_PATH: Final = f"{CONTAINER_REGION_DIR}/region"
# The region's directory is a memory-backed emptyDir of the pod's own, one per GPU container,
# that the mutating webhook adds: what the container writes there is its pod's memory, never
# host disk, and no other pod's. Named from the container's name (a DNS label either way).
REGION_VOLUME_PREFIX: Final = "fracgpu-region-"
REGION_VOLUME_MEDIUM: Final = "Memory"
# Room for the region (128 KiB) and the copies processes starting together initialise
# before one is published (each 128 KiB, removed at once): 127 of them. The tmpfs is this
# size on Kubernetes 1.22+; what the container writes there is its pod's memory.
REGION_VOLUME_SIZE_LIMIT: Final = "16Mi"
# Where kubelet keeps a pod's emptyDir volumes, under <kubelet root>/pods/<pod UID>/.
KUBELET_EMPTY_DIR_VOLUMES: Final = "volumes/kubernetes.io~empty-dir"


def region_volume_name(container: str) -> str:
    """The name of the region volume of the container named ``container``."""
    return REGION_VOLUME_PREFIX + hashlib.sha256(container.encode()).hexdigest()[:16]


# The node's priority boards, one file per GPU, shared by every container on the node.
CONTAINER_NODE_DIR: Final = "/var/run/fracgpu-node"
CONTAINER_LIBRARY_PATH: Final = "/usr/local/fracgpu/lib/libfracgpu.so"
CONTAINER_PRELOAD_PATH: Final = "/etc/ld.so.preload"


def is_reserved_env(name: str) -> bool:
    """Whether a container env var is fracgpu's to set (users get a validation error)."""
    if name in RESERVED_ENV:
        return True
    return name.startswith(RESERVED_ENV_PREFIX) and name not in USER_SHIM_VARIABLES


def is_reserved_metadata_key(key: str) -> bool:
    """Whether a metadata key belongs to fracgpu (users may set only the steering ones)."""
    return (
        key.startswith(ANNOTATION_PREFIX)
        and key not in USER_ANNOTATIONS
        and key != (NAMESPACE_LABEL_OPT_OUT)
    )
