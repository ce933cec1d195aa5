"""CDI spec building blocks shared by the device plugin and the container toolkit.

Both write specs for the node's GPUs and MIG devices: one entry per device (named as the caller
wants) plus `all`, device nodes with their host paths, and common edits carrying the control
device nodes, the driver's libraries and binaries found under the driver root, and hooks. Pure
builders plus the file finders and an atomic writer (JSON or YAML by the file's suffix).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.agents.device_plugin import devices as dev
from gpu_operator.agents.device_plugin.facts import NodeFacts

# Device nodes with host paths need CDI 0.5.0.
CDI_VERSION = "0.5.0"
# Device nodes every GPU container needs besides its GPUs; listed only where present on the node.
CONTROL_DEVICE_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
# Driver files the runtime must see in a GPU container, relative to the driver root: the compute
# and utility libraries a spec from `nvidia-ctk cdi generate` mounts (R545+ drivers JIT PTX
# through libnvidia-gpucomp; pkcs11 serves H100 confidential computing, nscq NVSwitch queries).
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu")
LIBRARY_PATTERNS = (
    "libcuda.so.*",
    "libcudadebugger.so.*",
    "libnvidia-allocator.so.*",
    "libnvidia-cfg.so.*",
    "libnvidia-gpucomp.so.*",
    "libnvidia-ml.so.*",
    "libnvidia-nscq.so.*",
    "libnvidia-nvvm.so.*",
    "libnvidia-opencl.so.*",
    "libnvidia-pkcs11.so.*",
    "libnvidia-pkcs11-openssl3.so.*",
    "libnvidia-ptxjitcompiler.so.*",
)
BINARIES = (
    "usr/bin/nvidia-smi",
    "usr/bin/nvidia-debugdump",
    "usr/bin/nvidia-persistenced",
    "usr/bin/nvidia-cuda-mps-control",
    "usr/bin/nvidia-cuda-mps-server",
)
# The daemons' sockets (persistence daemon; fabric manager on NVSwitch systems), where present.
SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
SOCKET_MOUNT_OPTIONS = (*MOUNT_OPTIONS, "noexec")


def spec_file_name(kind: str, suffix: str = ".json") -> str:
    """`vendor/class` -> `vendor-class<suffix>`, the name the CDI library derives for a spec."""
    return kind.replace("/", "-") + suffix


def device_node(path: str, dev_root: str) -> dict[str, str]:
    """A device node edit: the container path and where it is on the host."""
    root = dev_root.rstrip("/")
    return {"path": path, "hostPath": f"{root}{path}" if root else path}


def hook(hook_path: str, *args: str) -> dict[str, Any]:
    """A createContainer hook. nvidia-ctk takes hooks as `nvidia-ctk hook <name>`; the standalone
    nvidia-cdi-hook as `nvidia-cdi-hook <name>`."""
    name = os.path.basename(hook_path)
    prefix = [name, "hook"] if name == "nvidia-ctk" else [name]
    return {"hookName": "createContainer", "path": hook_path, "args": [*prefix, *args]}


def library_folders(driver_files: Sequence[str]) -> list[str]:
    """The container folders holding the driver's shared libraries (for the ldcache hook)."""
    return sorted({"/" + os.path.dirname(f) for f in driver_files if ".so" in f})


def ldcache_hook(hook_path: str, driver_files: Sequence[str]) -> dict[str, Any] | None:
    """`update-ldcache --folder ...` over the library folders (None without libraries)."""
    folders = library_folders(driver_files)
    if not folders:
        return None
    args = ["update-ldcache"]
    for folder in folders:
        args += ["--folder", folder]
    return hook(hook_path, *args)


def node_devices(node: NodeFacts) -> list[dev.Device]:
    """Every full GPU and, on MIG-enabled GPUs, each MIG device after its parent."""
    records: list[dev.Device] = []
    for g in node.gpus:
        records.append(dev.gpu_device(g))
        if g.mig_enabled:
            records += [dev.mig_device(g, m, node.mig_minors) for m in g.migs]
    return records


def gpu_class_spec(
    kind: str,
    node: NodeFacts,
    *,
    names: Callable[[dev.Device], Sequence[str]],
    dev_root: str = "/",
    driver_root: str = "/",
    present_control_nodes: Iterable[str] = (),
    driver_files: Sequence[str] = (),
    hooks: Sequence[dict[str, Any]] = (),
    env: Sequence[str] = ("NVIDIA_VISIBLE_DEVICES=void",),
) -> dict[str, Any]:
    """A spec of `kind` with an entry per name of every GPU and MIG device, and `all`.

    `driver_files` are paths relative to the driver root; `driver_root` is where that root is on
    the host (mount sources are host paths, as the runtime reads them).
    """
    entries: list[dict[str, Any]] = []
    every_node: list[str] = []
    for d in node_devices(node):
        edits = {"deviceNodes": [device_node(p, dev_root) for p in d.paths]}
        entries += [{"name": name, "containerEdits": edits} for name in names(d)]
        every_node += [p for p in d.paths if p not in every_node]
    if entries:
        entries.append(
            {
                "name": "all",
                "containerEdits": {"deviceNodes": [device_node(p, dev_root) for p in every_node]},
            }
        )
    present = set(present_control_nodes)
    common: dict[str, Any] = {
        "env": list(env),
        "deviceNodes": [device_node(p, dev_root) for p in CONTROL_DEVICE_NODES if p in present],
    }
    root = driver_root.rstrip("/")
    if driver_files:
        common["mounts"] = [
            {
                "hostPath": f"{root}/{f}",
                "containerPath": f"/{f}",
                "options": list(SOCKET_MOUNT_OPTIONS if f in SOCKETS else MOUNT_OPTIONS),
            }
            for f in driver_files
        ]
    if hooks:
        common["hooks"] = list(hooks)
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": entries, "containerEdits": common}


def find_driver_files(driver_root: Path) -> list[str]:
    """Driver libraries and binaries present under the driver root (relative paths)."""
    found: list[str] = []
    for folder in LIBRARY_DIRS:
        base = driver_root / folder
        for pattern in LIBRARY_PATTERNS:
            found += sorted(str(p.relative_to(driver_root)) for p in base.glob(pattern))
    found += [b for b in BINARIES if (driver_root / b).exists()]
    found += [sock for sock in SOCKETS if (driver_root / sock).exists()]
    return found


def find_nodes(dev_root: Path, patterns: Iterable[str]) -> list[str]:
    """Device node paths (as `/dev/...`) matching `patterns` under the dev root."""
    found: list[str] = []
    for pattern in patterns:
        found += sorted("/" + str(p.relative_to(dev_root)) for p in dev_root.glob(pattern[1:]))
    return found


def present(dev_root: Path, paths: Iterable[str]) -> list[str]:
    """The device nodes among `paths` that exist under the dev root."""
    return [p for p in paths if (dev_root / p.lstrip("/")).exists()]


def write_spec(target: Path, spec: Mapping[str, Any]) -> Path:
    """Write a spec atomically (readers never see half a file): YAML for `.yaml`/`.yml`,
    JSON otherwise. Returns `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=target.suffix)
    with os.fdopen(fd, "w") as f:
        if target.suffix in (".yaml", ".yml"):
            yaml.safe_dump(dict(spec), f, sort_keys=False)
        else:
            json.dump(spec, f, indent=2)
            f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target
