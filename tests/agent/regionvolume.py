"""A GPU container's region volume on the host, made as kubelet makes it for the emptyDir
the mutating webhook adds (``fracgpu.names.region_volume_name``)."""

from pathlib import Path

from fracgpu import names
from fracgpu.shim_abi import REGION_PATH


def region_in_volume(pods_dir: Path, pod_uid: str, container: str) -> Path:
    """The region's path in the container's region volume, the volume's directory made
    (world-writable, as kubelet makes an emptyDir)."""
    volume = pods_dir / pod_uid / names.KUBELET_EMPTY_DIR_VOLUMES
    volume = volume / names.region_volume_name(container)
    volume.mkdir(parents=True, exist_ok=True)
    volume.chmod(0o777)
    return volume / Path(REGION_PATH).name
