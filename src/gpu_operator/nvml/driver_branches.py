"""Which CUDA version a driver supports: NVIDIA's table of driver branches and CUDA releases.

NVML's `nvmlSystemGetCudaDriverVersion` answers the highest CUDA version the loaded driver
supports (`12080` for CUDA 12.8), which `nvidia-smi` prints as "CUDA Version". It follows the
driver branch (the version's first number): the CUDA toolkit release notes list, per CUDA
release, the minimum Linux driver of the branch that shipped with it.
"""

from __future__ import annotations

import re

# Driver branch -> the CUDA version (NVML's 1000 * major + 10 * minor) its drivers report, after
# the "CUDA Toolkit and Corresponding Driver Versions" table of the CUDA release notes.
CUDA_BY_BRANCH: dict[int, int] = {
    450: 11000,
    455: 11010,
    460: 11020,
    465: 11030,
    470: 11040,
    495: 11050,
    510: 11060,
    515: 11070,
    520: 11080,
    525: 12000,
    530: 12010,
    535: 12020,
    545: 12030,
    550: 12040,
    555: 12050,
    560: 12060,
    565: 12070,
    570: 12080,
    575: 12090,
    580: 13000,
    590: 13010,
    595: 13020,
}
_VERSION = re.compile(r"^(\d{3})(\.\d+){1,2}$")


class DriverVersionError(ValueError):
    """Not an NVIDIA driver version (`580.95.05`, `570.195.03`, `550.54`)."""


def branch(version: str) -> int:
    """The driver branch of a version: 580 for `580.95.05`."""
    found = _VERSION.match(version.strip())
    if found is None:
        raise DriverVersionError(
            f"{version!r} is not an NVIDIA driver version (expected e.g. 580.95.05)"
        )
    return int(found.group(1))


def cuda_driver_version(version: str) -> int:
    """The CUDA version a driver reports (NVML's encoding); a branch between two listed ones
    reports what the older one does, and a branch older than the table is refused."""
    number = branch(version)
    known = [b for b in CUDA_BY_BRANCH if b <= number]
    if not known:
        raise DriverVersionError(
            f"driver {version}: branch {number} is older than CUDA 11 (oldest known: "
            f"{min(CUDA_BY_BRANCH)})"
        )
    return CUDA_BY_BRANCH[max(known)]


def nvml_version(version: str) -> str:
    """NVML's own version string for a driver: `<CUDA major>.<driver version>`."""
    return f"{cuda_driver_version(version) // 1000}.{version}"
