"""Where `libnvidia-ml.so.1` is: searched under a driver root as NVIDIA's node components search it.

Pure (standard library only). A container that the NVIDIA runtime does not set up (the toolkit
itself, any pod without `NVIDIA_VISIBLE_DEVICES`) has no NVML on its loader path; it must load the
library from where the driver lives: the host root (`/host`), or a driver container's root
(`/run/nvidia/driver`, seen as `/driver-root` in the plugin and toolkit pods).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

NVML_LIBRARY = "libnvidia-ml.so.1"
# Folders under a driver root that may hold the library, in the order they are tried: the root
# itself, then the multiarch and lib64 folders of Debian/Ubuntu, RHEL/SUSE and arm64 systems.
SEARCH_DIRS = (
    "",
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
)
# Where our pods see a driver root when nobody says (plugin/toolkit/MIG manager, node status
# exporter, host root); tried after the explicit roots and the default loader.
WELL_KNOWN_ROOTS = ("/driver-root", "/run/nvidia/driver", "/host")


def candidates(root: str | Path) -> list[Path]:
    """Every path of the library under `root`, in search order."""
    base = Path(root)
    return [base / d / NVML_LIBRARY if d else base / NVML_LIBRARY for d in SEARCH_DIRS]


def find(roots: Iterable[str | Path]) -> Path | None:
    """The first existing library under the first root that has one (None: nowhere)."""
    for root in roots:
        for path in candidates(root):
            if path.exists():
                return path
    return None


def describe(roots: Iterable[str | Path]) -> str:
    """`/run/nvidia/driver, /host (and their lib folders)`, for error messages."""
    names = [str(r) for r in roots]
    if not names:
        return "no driver root"
    return f"{', '.join(names)} (and their {', '.join(d for d in SEARCH_DIRS if d)} folders)"
