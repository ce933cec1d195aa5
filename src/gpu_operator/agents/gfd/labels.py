"""GPU feature discovery labels: a pure function of node facts and the plugin config.

Label names, values, merge order and sanitisation follow upstream GFD (reference §2), so selectors
written for NVIDIA's GFD keep matching.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd.facts import GpuFacts, MigDeviceFacts, NodeFacts
from gpu_operator.nvml import catalog

PREFIX = "nvidia.com/"
TIMESTAMP = "nvidia.com/gfd.timestamp"
FULL_GPU = "nvidia.com/gpu"
_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")

Labels = dict[str, str]


class LabelError(ValueError):
    """The facts cannot be labelled (e.g. a malformed driver version)."""


@dataclass(frozen=True)
class LabelOptions:
    """Inputs that are neither facts nor config: the timestamp to stamp (unix seconds)."""

    timestamp: int


def sanitise(text: str) -> str:
    """Drop characters outside `[A-Za-z0-9-_. ]`, then join the words with `-`."""
    return "-".join(_UNSAFE.sub("", text).split())


def family(major: int, minor: int) -> str:
    """The architecture family GFD derives from the CUDA compute capability."""
    match major:
        case 1:
            return "tesla"
        case 2:
            return "fermi"
        case 3:
            return "kepler"
        case 5:
            return "maxwell"
        case 6:
            return "pascal"
        case 7:
            return "volta" if minor < 5 else "turing"
        case 8:
            return "ampere" if minor < 9 else "ada-lovelace"
        case 9:
            return "hopper"
        case 10 | 12:
            return "blackwell"
        case 13:
            return "rubin"
    return "undefined"


def _versions(facts: NodeFacts) -> Labels:
    parts = facts.driver_version.split(".")
    if not 2 <= len(parts) <= 3:
        raise LabelError(f'driver version "{facts.driver_version}" does not match format "X.Y[.Z]"')
    major, minor = parts[0], parts[1]
    rev = parts[2] if len(parts) == 3 else ""
    cuda_major = str(facts.cuda_driver_version // 1000)
    cuda_minor = str(facts.cuda_driver_version % 1000 // 10)
    return {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": facts.driver_version,
        "nvidia.com/cuda.runtime.major": cuda_major,
        "nvidia.com/cuda.runtime.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


class _Resource:
    """Labels of one resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`); sharing None = off."""

    def __init__(self, name: str, sharing: pc.Sharing | None) -> None:
        self.name = name
        self.sharing = sharing
        self.replicated: pc.ReplicatedResource | None = None
        active = sharing.replicated() if sharing is not None else None
        if active is not None:
            self.replicated = next((r for r in active.resources if r.name == name), None)

    def key(self, suffix: str) -> str:
        return f"{self.name}.{suffix}"

    def replicas(self) -> int:
        if self.sharing is None:
            return 0
        if self.replicated is not None and self.replicated.replicas > 0:
            return self.replicated.replicas
        return 1

    def product(self, parts: Iterable[str]) -> str:
        words = [sanitise(p) for p in parts if p]
        shared = self.replicated is not None and self.replicated.replicas > 1
        if shared and not self.replicated.rename:  # type: ignore[union-attr]
            words.append("SHARED")
        return "-".join(words)

    def base(self, count: int, parts: Iterable[str]) -> Labels:
        replicas = self.replicas()
        strategy = pc.SharingStrategy.NONE
        if self.sharing is not None and replicas > 1:
            strategy = self.sharing.strategy()
        return {
            self.key("product"): self.product(parts),
            self.key("count"): str(count),
            self.key("replicas"): str(replicas),
            self.key("sharing-strategy"): strategy.value,
        }


def _full_gpu(gpu: GpuFacts, count: int, sharing: pc.Sharing | None) -> Labels:
    r = _Resource(FULL_GPU, sharing)
    labels = r.base(count, [gpu.name])
    if gpu.memory_mib:
        labels[r.key("memory")] = str(gpu.memory_mib)
    major, minor = gpu.compute_capability
    if major:
        labels[r.key("family")] = family(major, minor)
        labels[r.key("compute.major")] = str(major)
        labels[r.key("compute.minor")] = str(minor)
    return labels


def _mig(name: str, parent: str, mig: MigDeviceFacts, count: int, sharing: pc.Sharing) -> Labels:
    r = _Resource(name, sharing)
    profile = mig.profile.replace("+", ".")
    labels = r.base(count, [parent, "MIG", profile])
    labels.update(
        {
            r.key("memory"): str(mig.memory_mb),
            r.key("multiprocessors"): str(mig.multiprocessors),
            r.key("slices.gi"): str(mig.slices_gi),
            r.key("slices.ci"): str(mig.slices_ci),
            r.key("engines.copy"): str(mig.engines_copy),
            r.key("engines.decoder"): str(mig.engines_decoder),
            r.key("engines.encoder"): str(mig.engines_encoder),
            r.key("engines.jpeg"): str(mig.engines_jpeg),
            r.key("engines.ofa"): str(mig.engines_ofa),
        }
    )
    return labels


def _full_gpus(gpus: tuple[GpuFacts, ...], sharing: pc.Sharing) -> Labels:
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.name] = counts.get(g.name, 0) + 1
    labels: Labels = {}
    # MIG-enabled GPUs first and without sharing info; full GPUs of the same model override them.
    # Several models on one node overwrite each other; sorting keeps the winner deterministic.
    for mig_enabled in (True, False):
        seen: dict[str, GpuFacts] = {}
        for g in gpus:
            if g.mig_enabled == mig_enabled:
                seen.setdefault(g.name, g)
        for name in sorted(seen):
            labels.update(_full_gpu(seen[name], counts[name], None if mig_enabled else sharing))
    return labels


def _group_migs(gpus: Iterable[GpuFacts]) -> dict[str, tuple[str, MigDeviceFacts, int]]:
    groups: dict[str, tuple[str, MigDeviceFacts, int]] = {}
    for g in gpus:
        for m in g.mig_devices:
            parent, first, n = groups.get(m.profile, (g.name, m, 0))
            groups[m.profile] = (parent, first, n + 1)
    return groups


def _invalid_single(gpu: GpuFacts) -> Labels:
    r = _Resource(FULL_GPU, None)
    return {
        r.key("product"): r.product([gpu.name, "MIG", "INVALID"]),
        r.key("count"): "0",
        r.key("replicas"): "0",
        r.key("memory"): "0",
        r.key("sharing-strategy"): "",
    }


def _single(gpus: tuple[GpuFacts, ...], sharing: pc.Sharing) -> Labels:
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return {}
    if any(not g.mig_devices for g in enabled):
        return _invalid_single(enabled[0])  # a MIG-enabled GPU is empty
    if len(enabled) != len(gpus):
        return _invalid_single(enabled[0])  # MIG-enabled and disabled GPUs are mixed
    groups = _group_migs(enabled)
    if len(groups) != 1:
        return _invalid_single(enabled[0])  # more than one MIG profile on the node
    ((parent, mig, count),) = groups.values()
    return _mig(FULL_GPU, parent, mig, count, sharing)


def _mixed(gpus: tuple[GpuFacts, ...], sharing: pc.Sharing) -> Labels:
    labels: Labels = {}
    for profile, (parent, mig, count) in sorted(_group_migs(gpus).items()):
        name = f"{PREFIX}mig-{profile.replace('+', '.')}"
        labels.update(_mig(name, parent, mig, count, sharing))
    return labels


def _mode(gpus: tuple[GpuFacts, ...]) -> str:
    modes = set()
    for g in gpus:
        if g.mig_enabled or g.pci_class == catalog.PCI_CLASS_3D:
            modes.add("compute")
        elif g.pci_class == catalog.PCI_CLASS_VGA:
            modes.add("graphics")
        else:
            modes.add("unknown")
    return modes.pop() if len(modes) == 1 else "unknown"


def _clique(gpus: tuple[GpuFacts, ...]) -> Labels:
    attached = {g.fabric for g in gpus if g.fabric is not None}
    clusters = {c for c, _ in attached}
    cliques = {q for _, q in attached}
    if len(clusters) != 1 or len(cliques) != 1:
        return {}
    return {"nvidia.com/gpu.clique": f"{clusters.pop()}.{cliques.pop()}"}


def compute_labels(facts: NodeFacts, config: pc.PluginConfig, options: LabelOptions) -> Labels:
    """Every GFD label for a node, merged in upstream's order (later groups win)."""
    labels: Labels = {}
    if not config.flags.gfd.no_timestamp:
        labels[TIMESTAMP] = str(options.timestamp)
    if not facts.gpus:
        return labels
    gpus = facts.gpus
    sharing = config.sharing
    strategy = config.flags.mig_strategy
    labels["nvidia.com/gpu.machine"] = sanitise(facts.machine_type)
    labels.update(_versions(facts))
    labels["nvidia.com/mig.capable"] = str(any(g.mig_capable for g in gpus)).lower()
    mps = sharing.strategy() is pc.SharingStrategy.MPS
    mps_capable = mps and not any(g.mig_enabled for g in gpus)
    labels["nvidia.com/mps.capable"] = str(mps_capable).lower()
    labels.update(_full_gpus(gpus, sharing))
    if strategy is not pc.MigStrategy.NONE:
        labels["nvidia.com/mig.strategy"] = strategy.value
        if strategy is pc.MigStrategy.SINGLE:
            labels.update(_single(gpus, sharing))
        else:
            labels.update(_mixed(gpus, sharing))
    labels["nvidia.com/gpu.mode"] = _mode(gpus)
    labels.update(_clique(gpus))
    if facts.vgpu is None:
        labels["nvidia.com/vgpu.present"] = "false"
    else:
        labels["nvidia.com/vgpu.present"] = "true"
        labels["nvidia.com/vgpu.host-driver-version"] = facts.vgpu.host_driver_version
        labels["nvidia.com/vgpu.host-driver-branch"] = facts.vgpu.host_driver_branch
    return labels


def render(labels: Labels) -> str:
    """`key=value` lines sorted by key, the features.d and stdout format."""
    return "".join(f"{k}={labels[k]}\n" for k in sorted(labels))
