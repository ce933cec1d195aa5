"""CDI specs the plugin writes at start, so `cdi-*` device list strategies name devices that exist.

Pure builders plus one writer. Like upstream's generated specs: kind
`k8s.device-plugin.nvidia.com/gpu` with one device per GPU and MIG device (named by the device ID
strategy) and an `all` device, each with its device nodes; common edits carry the control device
nodes, the driver's libraries and binaries found under the driver root, and the ldcache hook.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_operator.agents.device_plugin import devices as dev
from gpu_operator.agents.device_plugin.allocate import CDI_VENDOR, CONTROL_DEVICE_NODES
from gpu_operator.agents.device_plugin.facts import NodeFacts

# Device nodes with host paths need CDI 0.5.0.
CDI_VERSION = "0.5.0"
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
# Driver files the runtime must see in a GPU container, relative to the driver root.
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu")
LIBRARY_PATTERNS = (
    "libcuda.so.*",
    "libnvidia-ml.so.*",
    "libnvidia-ptxjitcompiler.so.*",
    "libnvidia-nvvm.so.*",
)
BINARIES = ("usr/bin/nvidia-smi", "usr/bin/nvidia-debugdump", "usr/bin/nvidia-persistenced")
# Device nodes behind the optional classes (their specs are written only when some exist).
EXTRA_CLASS_NODES: Mapping[str, tuple[str, ...]] = {
    "gds": ("/dev/nvidia-fs*",),
    "mofed": ("/dev/infiniband/*",),
    "gdrcopy": ("/dev/gdrdrv",),
}


def spec_file_name(cdi_class: str) -> str:
    """`k8s.device-plugin.nvidia.com-gpu.json`, the name the CDI library derives for a spec."""
    return f"{CDI_VENDOR}-{cdi_class}.json"


def _node(path: str, dev_root: str) -> dict[str, str]:
    root = dev_root.rstrip("/")
    return {"path": path, "hostPath": f"{root}{path}" if root else path}


def _hook(hook_path: str, *args: str) -> dict[str, Any]:
    # nvidia-ctk takes hooks as `nvidia-ctk hook <name>`; the standalone nvidia-cdi-hook as
    # `nvidia-cdi-hook <name>`.
    name = os.path.basename(hook_path)
    prefix = [name, "hook"] if name == "nvidia-ctk" else [name]
    return {"hookName": "createContainer", "path": hook_path, "args": [*prefix, *args]}


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
    entries: list[dict[str, Any]] = []
    every_node: list[str] = []
    for g in node.gpus:
        records = [dev.gpu_device(g)]
        if g.mig_enabled:
            records += [dev.mig_device(g, m, node.mig_minors) for m in g.migs]
        for d in records:
            name = d.index if id_strategy == "index" else d.uuid
            entries.append(
                {
                    "name": name,
                    "containerEdits": {"deviceNodes": [_node(p, dev_root) for p in d.paths]},
                }
            )
            every_node += [p for p in d.paths if p not in every_node]
    if entries:
        entries.append(
            {
                "name": "all",
                "containerEdits": {"deviceNodes": [_node(p, dev_root) for p in every_node]},
            }
        )
    root = driver_root.rstrip("/")
    common: dict[str, Any] = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
            _node(p, dev_root) for p in CONTROL_DEVICE_NODES if p in set(present_control_nodes)
        ],
    }
    if driver_files:
        common["mounts"] = [
            {
                "hostPath": f"{root}/{f}",
                "containerPath": f"/{f}",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
            for f in driver_files
        ]
        folders = sorted({"/" + os.path.dirname(f) for f in driver_files if ".so" in f})
        if hooks and folders:
            args = ["update-ldcache"]
            for folder in folders:
                args += ["--folder", folder]
            common["hooks"] = [_hook(hook_path, *args)]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"{CDI_VENDOR}/gpu",
        "devices": entries,
        "containerEdits": common,
    }


def imex_spec(channels: Sequence[str], dev_root: str = "/") -> dict[str, Any]:
    """The `imex-channel` class spec: one device per IMEX channel."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"{CDI_VENDOR}/imex-channel",
        "devices": [
            {
                "name": c,
                "containerEdits": {
                    "deviceNodes": [_node(f"{IMEX_CHANNEL_DIR}/channel{c}", dev_root)]
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
            {"name": "all", "containerEdits": {"deviceNodes": [_node(n, dev_root) for n in nodes]}}
        ],
    }


def find_driver_files(driver_root: Path) -> list[str]:
    """Driver libraries and binaries present under the driver root (relative paths)."""
    found: list[str] = []
    for folder in LIBRARY_DIRS:
        base = driver_root / folder
        for pattern in LIBRARY_PATTERNS:
            found += sorted(str(p.relative_to(driver_root)) for p in base.glob(pattern))
    found += [b for b in BINARIES if (driver_root / b).exists()]
    return found


def find_nodes(dev_root: Path, patterns: Iterable[str]) -> list[str]:
    """Device node paths (as `/dev/...`) matching `patterns` under the dev root."""
    found: list[str] = []
    for pattern in patterns:
        found += sorted("/" + str(p.relative_to(dev_root)) for p in dev_root.glob(pattern[1:]))
    return found


def write_spec(cdi_root: Path, cdi_class: str, spec: Mapping[str, Any]) -> Path:
    """Write a spec atomically (readers never see half a file); returns its path."""
    cdi_root.mkdir(parents=True, exist_ok=True)
    target = cdi_root / spec_file_name(cdi_class)
    fd, tmp = tempfile.mkstemp(dir=cdi_root, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target
