"""The management CDI spec `/var/run/cdi/management.nvidia.com-gpu.yaml`, generated from NVML.

Kind `management.nvidia.com/gpu` (CDI_KIND). Upstream's management spec has only `all`; ours also
names every GPU by index and UUID and every MIG device by `<gpu>:<mig>` and `MIG-...`, so a
management container can ask for one device. Device edits: the GPU's `/dev/nvidia<minor>` (MIG:
the parent's node plus its `nvidia-caps` access nodes). Common edits: the control device nodes
present on the node, read-only mounts of the driver's libraries and binaries found under the
driver root (host paths rewritten from where this container sees the driver root), and the
createContainer hooks of `nvidia-cdi-hook`: `create-symlinks` (libcuda.so), `enable-cuda-compat`
(the host driver version) and `update-ldcache` over the library folders.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpu_operator import nvml
from gpu_operator.agents import cdi
from gpu_operator.agents.device_plugin import facts

log = logging.getLogger("gpu_operator.agents.container_toolkit")

MANAGEMENT_KIND = "management.nvidia.com/gpu"


class CdiError(Exception):
    """The spec could not be generated (the message names why: NVML, the kind, the file)."""


def check_kind(kind: str) -> tuple[str, str]:
    """`vendor/class` as the CDI library validates it; CdiError names what is wrong."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        raise CdiError(f"CDI_KIND: {kind!r} is not of the form vendor/class")
    vendor_ok = all(c.isalnum() or c in "-_." for c in vendor) and vendor[0].isalnum()
    class_ok = all(c.isalnum() or c in "-_" for c in cls) and cls[0].isalnum()
    if not vendor_ok or not vendor[-1].isalnum():
        raise CdiError(f"CDI_KIND: invalid vendor name {vendor!r}")
    if not class_ok or not cls[-1].isalnum():
        raise CdiError(f"CDI_KIND: invalid class name {cls!r}")
    return vendor, cls


def hooks(
    hook_path: str, driver_files: Sequence[str], driver_version: str | None
) -> list[dict[str, Any]]:
    """The spec's createContainer hooks, in the order the runtime runs them."""
    out: list[dict[str, Any]] = []
    libcuda = next(
        (f for f in driver_files if posixpath.basename(f).startswith("libcuda.so.")), None
    )
    if libcuda is not None:
        folder = "/" + posixpath.dirname(libcuda)
        out.append(
            cdi.hook(hook_path, "create-symlinks", "--link", f"libcuda.so.1::{folder}/libcuda.so")
        )
        if driver_version:
            out.append(
                cdi.hook(hook_path, "enable-cuda-compat", f"--host-driver-version={driver_version}")
            )
    ldcache = cdi.ldcache_hook(hook_path, driver_files)
    if ldcache is not None:
        out.append(ldcache)
    return out


def management_spec(
    node: facts.NodeFacts,
    *,
    kind: str = MANAGEMENT_KIND,
    driver_root: str = "/run/nvidia/driver",
    dev_root: str = "/run/nvidia/driver",
    driver_files: Sequence[str] = (),
    present_control_nodes: Sequence[str] = (),
    hook_path: str = "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
    driver_version: str | None = None,
) -> dict[str, Any]:
    """The management spec for the node's devices (pure)."""
    check_kind(kind)
    env = ["NVIDIA_VISIBLE_DEVICES=void"]
    libcuda = next(
        (f for f in driver_files if posixpath.basename(f).startswith("libcuda.so.")), None
    )
    if libcuda is not None:
        env.append(f"NVIDIA_CTK_LIBCUDA_DIR=/{posixpath.dirname(libcuda)}")
    return cdi.gpu_class_spec(
        kind,
        node,
        names=lambda d: [d.index, d.uuid],
        dev_root=dev_root,
        driver_root=driver_root,
        present_control_nodes=present_control_nodes,
        driver_files=driver_files,
        hooks=hooks(hook_path, driver_files, driver_version),
        env=env,
    )


def generate(
    open_nvml: Callable[[], nvml.Nvml],
    output_dir: Path,
    *,
    kind: str,
    driver_root: str,
    driver_root_view: Path,
    dev_root: str,
    dev_root_view: Path,
    hook_path: str,
    sys_root: Path = Path("/"),
) -> tuple[Path, dict[str, Any]]:
    """Read the node's GPUs and write the spec (atomically); returns its path and the spec."""
    check_kind(kind)
    try:
        lib = open_nvml()
        lib.init()
    except nvml.NvmlError as err:
        raise CdiError(f"failed to initialize NVML: {err}") from err
    try:
        # procfs sits beside sysfs: the node's own on a real node, the simulated node's root in
        # the demo.
        node = facts.collect(
            lib, driver_root=driver_root_view, sys_root=sys_root, proc_root=sys_root
        )
        version = lib.driver_version()
    except nvml.NvmlError as err:
        raise CdiError(f"reading the GPUs from NVML: {err}") from err
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()
    spec = management_spec(
        node,
        kind=kind,
        driver_root=driver_root,
        dev_root=dev_root,
        driver_files=cdi.find_driver_files(driver_root_view),
        present_control_nodes=cdi.present(dev_root_view, cdi.CONTROL_DEVICE_NODES),
        hook_path=hook_path,
        driver_version=version,
    )
    target = output_dir / cdi.spec_file_name(kind, ".yaml")
    try:
        cdi.write_spec(target, spec)
    except OSError as err:
        raise CdiError(f"writing {target}: {err}") from err
    return target, spec
