"""CDI specs the plugin writes at start, so `cdi-*` device list strategies name devices that exist.

Like upstream's generated specs: kind `k8s.device-plugin.nvidia.com/gpu` with one device per GPU
and MIG device (named by the device ID strategy) and an `all` device, each with its device nodes;
common edits carry the control device nodes, the driver's libraries and binaries found under the
driver root, and the ldcache hook. The building blocks are shared with the container toolkit
(`gpu_operator.agents.cdi`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_operator.agents import cdi as common
from gpu_operator.agents.device_plugin.allocate import CDI_VENDOR
from gpu_operator.agents.device_plugin.facts import NodeFacts

CDI_VERSION = common.CDI_VERSION
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
# Device nodes behind the optional classes (their specs are written only when some exist).
EXTRA_CLASS_NODES: Mapping[str, tuple[str, ...]] = {
    "gds": ("/dev/nvidia-fs*",),
    "mofed": ("/dev/infiniband/*",),
    "gdrcopy": ("/dev/gdrdrv",),
}
find_driver_files = common.find_driver_files
find_nodes = common.find_nodes


def spec_file_name(cdi_class: str) -> str:
    """`k8s.device-plugin.nvidia.com-gpu.json`, the name the CDI library derives for a spec."""
    return common.spec_file_name(f"{CDI_VENDOR}/{cdi_class}")


def gpu_spec(
    node: NodeFacts,
    *,
    id_strategy: str = "uuid",
    dev_root: str = "/",
    driver_root: str = "/",
    present_control_nodes: Iterable[str] = (),
    driver_files: Sequence[str] = (),
    hook_path: str = "/usr/bin/nvidia-ctk",
    hooks: bool = True,
) -> dict[str, Any]:
    """The `gpu` class spec for every GPU and MIG device of the node.

    `driver_files` are paths relative to the driver root (libraries and binaries found there).
    """
    ldcache = common.ldcache_hook(hook_path, driver_files) if hooks else None
    return common.gpu_class_spec(
        f"{CDI_VENDOR}/gpu",
        node,
        names=lambda d: [d.index if id_strategy == "index" else d.uuid],
        dev_root=dev_root,
        driver_root=driver_root,
        present_control_nodes=present_control_nodes,
        driver_files=driver_files,
        hooks=[ldcache] if ldcache is not None else [],
    )


def imex_spec(channels: Sequence[str], dev_root: str = "/") -> dict[str, Any]:
    """The `imex-channel` class spec: one device per IMEX channel."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"{CDI_VENDOR}/imex-channel",
        "devices": [
            {
                "name": c,
                "containerEdits": {
                    "deviceNodes": [common.device_node(f"{IMEX_CHANNEL_DIR}/channel{c}", dev_root)]
                },
            }
            for c in channels
        ],
    }


def extra_spec(cdi_class: str, nodes: Sequence[str], dev_root: str = "/") -> dict[str, Any]:
    """A `gds`/`mofed`/`gdrcopy` spec with one device `all` holding the class's device nodes."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"{CDI_VENDOR}/{cdi_class}",
        "devices": [
            {
                "name": "all",
                "containerEdits": {"deviceNodes": [common.device_node(n, dev_root) for n in nodes]},
            }
        ],
    }


def write_spec(cdi_root: Path, cdi_class: str, spec: Mapping[str, Any]) -> Path:
    """Write a spec atomically (readers never see half a file); returns its path."""
    return common.write_spec(cdi_root / spec_file_name(cdi_class), spec)
