"""Which vfio driver takes a device: the `vfio_pci:` aliases of `modules.alias`.

A vfio variant driver (such as `nvgrace_gpu_vfio_pci` for Grace Hopper GPUs) declares the devices
it serves with `alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci` lines. The
device's `modalias` (`pci:v...`) with the `vfio_` prefix is matched against them (shell globs, as
the kernel's module aliases); among several matches the most specific (fewest wildcards, then
longest) wins; no match means plain vfio-pci.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agents.pci import sysfs

PREFIX = "vfio_pci:"


@dataclass(frozen=True)
class Alias:
    pattern: str
    module: str

    @property
    def specificity(self) -> tuple[int, int]:
        return (-self.pattern.count("*"), len(self.pattern))


def parse(text: str) -> list[Alias]:
    """The `vfio_pci:` aliases of a modules.alias file, in file order."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "alias" and parts[1].startswith(PREFIX):
            out.append(Alias(parts[1], parts[2]))
    return out


def load(root: Path) -> list[Alias]:
    """The host's aliases (`/lib/modules/<release>/modules.alias`; none if it is missing)."""
    path = root / "lib" / "modules" / sysfs.kernel_release(root) / "modules.alias"
    try:
        return parse(path.read_text())
    except OSError:
        return []


def driver_for(modalias: str, aliases: list[Alias]) -> str:
    """The vfio driver for a device: the best matching variant module, else vfio-pci."""
    if not modalias.startswith("pci:"):
        return sysfs.VFIO_PCI
    key = "vfio_" + modalias
    matches = [a for a in aliases if fnmatch.fnmatchcase(key, a.pattern)]
    if not matches:
        return sysfs.VFIO_PCI
    best = max(matches, key=lambda a: a.specificity)  # max keeps the first of equals
    return best.module


def module_of(driver: str) -> str:
    """The module that registers a driver (`vfio-pci` is module `vfio_pci`)."""
    return driver.replace("-", "_")
