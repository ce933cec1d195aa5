"""Which driver versions can drive which GPUs: a table of published facts and the pool check.

Upstream deploys any version an NVIDIADriver names and finds out on the node (a driver container
in CrashLoopBackOff, or a driver that loads and then cannot run the workload). Here each pool's
version is checked against the GPUs its nodes report before anything is rolled out; a mismatch
stops that pool (see controller/nvidiadriver.py). Every fact below names where it comes from;
add new GPUs and known issues the same way.

A node's GPU architecture comes from GPU feature discovery's labels (`nvidia.com/gpu.compute.*`,
else `nvidia.com/gpu.family`). GFD needs a working driver, so a node that never ran one cannot be
checked yet; such nodes are counted as unchecked, never as a problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_operator.api import keys

Version = tuple[int, ...]

# NVIDIA Data Center Drivers, "CUDA Toolkit, Driver, and Architecture Matrix"
# (docs.nvidia.com/datacenter/tesla/drivers/cuda-toolkit-driver-and-architecture-matrix.html):
# the first CUDA toolkit of each architecture and the last driver branch that supports it.
ARCH_MATRIX_SOURCE = "NVIDIA Data Center Drivers: CUDA Toolkit, Driver, and Architecture Matrix"
# The minimum driver of that first toolkit: CUDA Toolkit release notes, table "CUDA Toolkit and
# Corresponding Driver Versions" (Linux x86_64 column).
TOOLKIT_DRIVER_SOURCE = "CUDA Toolkit release notes: CUDA Toolkit and Corresponding Driver Versions"
# NVIDIA Driver Installation Guide, "Kernel Modules": the open kernel modules need the GSP that
# Turing introduced; Maxwell, Pascal and Volta need the proprietary flavor.
OPEN_MODULES_SOURCE = "NVIDIA Driver Installation Guide: Kernel Modules"
# NVIDIA Driver Installation Guide, release 620, "Proprietary Kernel Modules Removed".
PROPRIETARY_REMOVED_SOURCE = (
    "NVIDIA Driver Installation Guide 620: Proprietary Kernel Modules Removed"
)
PROPRIETARY_REMOVED_BRANCH = 620


@dataclass(frozen=True)
class Architecture:
    """Driver facts for one GPU architecture."""

    name: str
    min_driver: Version | None
    min_source: str
    last_branch: int | None = None
    open_modules: bool = True


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        # CUDA 12.8 GA needs >= 570.26.
        Architecture("Blackwell", (570, 26), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 12.8)"),
        # CUDA 11.8 GA needs >= 520.61.05 (first toolkit for Hopper and Ada).
        Architecture("Hopper", (520, 61, 5), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 11.8)"),
        Architecture("Ada", (520, 61, 5), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 11.8)"),
        # CUDA 11.0.2 GA needs >= 450.51.05.
        Architecture("Ampere", (450, 51, 5), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 11.0)"),
        # CUDA 10.0.130 needs >= 410.48.
        Architecture("Turing", (410, 48), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 10.0)"),
        # CUDA 9.0.76 needs >= 384.81; R580 is the last branch for Volta, Pascal and Maxwell.
        Architecture(
            "Volta", (384, 81), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 9.0)", 580, open_modules=False
        ),
        # CUDA 8.0.44 needs >= 367.48.
        Architecture(
            "Pascal", (367, 48), f"{TOOLKIT_DRIVER_SOURCE} (CUDA 8.0)", 580, open_modules=False
        ),
        Architecture("Maxwell", None, "", 580, open_modules=False),
        Architecture("Kepler", None, "", 470, open_modules=False),
    )
}

# GFD's family label values (agents/gfd/labels.py: family()) and their architecture.
_FAMILIES = {
    "blackwell": "Blackwell",
    "hopper": "Hopper",
    "ada-lovelace": "Ada",
    "ampere": "Ampere",
    "turing": "Turing",
    "volta": "Volta",
    "pascal": "Pascal",
    "maxwell": "Maxwell",
    "kepler": "Kepler",
}


@dataclass(frozen=True)
class ProductMinimum:
    """A minimum driver for one product, beyond its architecture's."""

    product: str  # matched case-insensitively against nvidia.com/gpu.product
    min_driver: Version
    source: str


PRODUCT_MINIMUMS = (
    # GPU Operator platform support, note on NVIDIA HGX B200 (NVIDIA/cloud-native-docs PR #184).
    ProductMinimum(
        "B200", (570, 133, 20), "GPU Operator platform support: HGX B200 requires 570.133.20"
    ),
)


@dataclass(frozen=True)
class KnownIssue:
    """Driver versions that are broken for nodes in some configuration."""

    versions: frozenset[Version]
    when_mig: bool  # only on nodes that use MIG (nvidia.com/mig.config other than all-disabled)
    summary: str
    source: str


KNOWN_ISSUES = (
    # GPU Operator 25.3 release notes, known issues (gpu-operator#1361; NVIDIA/cloud-native-docs
    # PR #201 lists the three versions): GPU pods stay Pending on nodes mixing MIG slices and
    # full GPUs; NVIDIA recommends 570.86.15 instead.
    KnownIssue(
        frozenset({(570, 124, 6), (570, 133, 20), (570, 148, 8)}),
        when_mig=True,
        summary="GPU workloads cannot be scheduled on nodes that mix MIG slices and full GPUs",
        source="GPU Operator 25.3 release notes, known issues (gpu-operator#1361)",
    ),
)


def parse_version(text: str | None) -> Version | None:
    """A driver version such as 580.95.05 (or a branch such as 535); None for digests or tags
    that carry no version."""
    if not text or text.startswith("sha256:"):
        return None
    match = re.fullmatch(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def show(version: Version) -> str:
    return ".".join(f"{part:02d}" if i == 2 else str(part) for i, part in enumerate(version))


def older(version: Version, minimum: Version) -> bool:
    """Whether `version` is older than `minimum`; a branch alone is compared by branch."""
    if len(version) == 1:
        return version[0] < minimum[0]
    return version < minimum


def architecture_of(labels: Mapping[str, str]) -> str | None:
    """A node's GPU architecture from GFD's labels, or None when GFD has not labelled it yet."""
    major = labels.get("nvidia.com/gpu.compute.major")
    minor = labels.get("nvidia.com/gpu.compute.minor", "0")
    if major and major.isdigit() and minor.isdigit():
        arch = _by_compute(int(major), int(minor))
        if arch:
            return arch
    return _FAMILIES.get(labels.get("nvidia.com/gpu.family", "").lower())


def _by_compute(major: int, minor: int) -> str | None:
    if major in (10, 11, 12):
        return "Blackwell"
    if major == 9:
        return "Hopper"
    if major == 8:
        return "Ada" if minor >= 9 else "Ampere"
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    return {6: "Pascal", 5: "Maxwell", 3: "Kepler"}.get(major)


@dataclass(frozen=True)
class NodeGpus:
    """What the check needs from one node: its GPU architecture, product and MIG use."""

    node: str
    architecture: str | None
    product: str
    mig: bool

    @classmethod
    def from_labels(cls, node: str, labels: Mapping[str, str]) -> NodeGpus:
        mig_config = labels.get(keys.MIG_CONFIG, "")
        return cls(
            node=node,
            architecture=architecture_of(labels),
            product=labels.get(keys.GPU_PRODUCT, ""),
            mig=bool(mig_config) and mig_config != "all-disabled",
        )


@dataclass(frozen=True)
class SupportReport:
    """The problems found in one pool (empty: the version may roll out) and the nodes that could
    not be checked."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _nodes_text(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check(
    version_text: str | None, kernel_module_type: str, nodes: Iterable[NodeGpus]
) -> SupportReport:
    """Check one pool's driver version and kernel module flavor against its nodes' GPUs."""
    report = SupportReport()
    version = parse_version(version_text)
    groups: dict[str, list[str]] = {}
    for node in nodes:
        if node.architecture is None:
            report.unchecked.append(node.node)
            continue
        for problem in _node_problems(version, kernel_module_type, node):
            groups.setdefault(problem, []).append(node.node)
    for problem, names in groups.items():
        report.problems.append(f"{problem} (nodes {_nodes_text(sorted(names))})")
    return report


def _node_problems(version: Version | None, flavor: str, node: NodeGpus) -> list[str]:
    arch = ARCHITECTURES.get(node.architecture or "")
    if arch is None:
        return []
    found: list[str] = []
    if flavor == "open" and not arch.open_modules:
        found.append(
            f"{arch.name} GPUs cannot use the open kernel modules (kernelModuleType: open); "
            f"use proprietary or auto ({OPEN_MODULES_SOURCE})"
        )
    if version is None:
        return found  # a digest or a tag without a version: only the flavor can be checked
    shown = show(version)
    if flavor == "proprietary" and version[0] >= PROPRIETARY_REMOVED_BRANCH:
        found.append(
            f"driver {shown} has no proprietary kernel modules (kernelModuleType: proprietary); "
            f"use open or auto ({PROPRIETARY_REMOVED_SOURCE})"
        )
    if arch.min_driver is not None and older(version, arch.min_driver):
        found.append(
            f"driver {shown} is older than {show(arch.min_driver)}, the first to support "
            f"{arch.name} GPUs ({arch.min_source})"
        )
    if arch.last_branch is not None and version[0] > arch.last_branch:
        found.append(
            f"driver {shown} is newer than R{arch.last_branch}, the last branch that supports "
            f"{arch.name} GPUs ({ARCH_MATRIX_SOURCE})"
        )
    for minimum in PRODUCT_MINIMUMS:
        if minimum.product.lower() in node.product.lower() and older(version, minimum.min_driver):
            found.append(
                f"driver {shown} is older than {show(minimum.min_driver)}, the minimum for "
                f"{minimum.product} ({minimum.source})"
            )
    for issue in KNOWN_ISSUES:
        if version in issue.versions and (node.mig or not issue.when_mig):
            found.append(f"driver {shown} has a known issue: {issue.summary} ({issue.source})")
    return found
