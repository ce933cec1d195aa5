"""Image reference resolution: CR fields first, then the operator's `*_IMAGE` env, else an error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gpu_operator.api.core_types import ImageSpec

# Operator env var consulted when a section names no image (upstream ImagePath()).
IMAGE_ENV: Final[dict[str, str]] = {
    "driver": "DRIVER_IMAGE",
    "vgpuManager": "VGPU_MANAGER_IMAGE",
    "toolkit": "CONTAINER_TOOLKIT_IMAGE",
    "devicePlugin": "DEVICE_PLUGIN_IMAGE",
    "sandboxDevicePlugin": "SANDBOX_DEVICE_PLUGIN_IMAGE",
    "kataSandboxDevicePlugin": "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE",
    "dcgmExporter": "DCGM_EXPORTER_IMAGE",
    "dcgm": "DCGM_IMAGE",
    "gfd": "GFD_IMAGE",
    "validator": "VALIDATOR_IMAGE",
    "nodeStatusExporter": "VALIDATOR_IMAGE",
    "initContainer": "CUDA_BASE_IMAGE",
    "migManager": "MIG_MANAGER_IMAGE",
    "driverManager": "DRIVER_MANAGER_IMAGE",
    "gds": "GDS_IMAGE",
    "gdrcopy": "GDRCOPY_IMAGE",
    "vfioManager": "VFIO_MANAGER_IMAGE",
    "vgpuDeviceManager": "VGPU_DEVICE_MANAGER_IMAGE",
    "kataManager": "KATA_MANAGER_IMAGE",
    "ccManager": "CC_MANAGER_IMAGE",
}

PULL_POLICIES: Final = ("Always", "Never", "IfNotPresent")

# Distributions whose driver images are tagged with the major version only.
_MAJOR_ONLY_OS: Final = ("ol", "rocky", "rhel")


class ImageError(ValueError):
    """An image reference that cannot be resolved; the message names what is missing."""


def image_path(
    repository: str | None,
    image: str | None,
    version: str | None,
    *,
    env_name: str,
    environ: Mapping[str, str],
    what: str = "image",
) -> str:
    """Resolve one image reference exactly like upstream's imagePath()."""
    repository, image, version = repository or "", image or "", version or ""
    if not repository and not version and image:
        return image  # a full reference such as "registry/path/name@sha256:..."
    if repository or image or version:
        missing = [
            name
            for name, value in (("repository", repository), ("image", image), ("version", version))
            if not value
        ]
        if missing:
            raise ImageError(
                f"{what}: {', '.join(missing)} not set; give repository, image and version, "
                f"or only image as a full reference"
            )
        separator = "@" if version.startswith("sha256:") else ":"
        return f"{repository}/{image}{separator}{version}"
    from_env = environ.get(env_name, "")
    if not from_env:
        raise ImageError(
            f"{what}: no image given in the ClusterPolicy and the operator env {env_name} is empty"
        )
    return from_env


def resolve(
    spec: ImageSpec | None, section: str, environ: Mapping[str, str], *, what: str | None = None
) -> str:
    """Resolve the image of a ClusterPolicy section (for example "devicePlugin")."""
    return image_path(
        spec.repository if spec else None,
        spec.image if spec else None,
        spec.version if spec else None,
        env_name=IMAGE_ENV[section],
        environ=environ,
        what=what or f"spec.{section}",
    )


def pull_policy(value: str | None) -> str:
    """Upstream tolerates any value and uses IfNotPresent for what it does not know."""
    return value if value in PULL_POLICIES else "IfNotPresent"


def os_tag(os_id: str, version_id: str) -> str:
    """Driver image OS suffix from NFD's os_release labels, e.g. ubuntu22.04 or rhel9."""
    if os_id in _MAJOR_ONLY_OS:
        version_id = version_id.split(".")[0]
    return f"{os_id}{version_id}"


def driver_image(path: str, tag: str) -> str:
    """Append the OS suffix to a driver-family image unless it is pinned by digest."""
    return path if "sha256:" in path else f"{path}-{tag}"


def precompiled_driver_image(path: str, kernel: str, tag: str) -> str:
    """Precompiled images are tagged `<version>-<kernel>-<os>`."""
    return path if "sha256:" in path else f"{path}-{kernel}-{tag}"
