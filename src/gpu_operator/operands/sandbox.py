"""Helpers shared by the sandbox (VM workload) states."""

from __future__ import annotations

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj

WORKLOAD_TYPE_FILE = f"{common.VALIDATIONS_DIR}/workload-type"


def sandbox_on(policy: api.ClusterPolicy, section: str | None = None) -> bool:
    """Sandbox workloads are enabled (and, when given, the section too)."""
    spec = policy.spec
    if not enablement.sandbox_enabled(spec):
        return False
    return section is None or enablement.is_enabled(spec, section)


def mode(policy: api.ClusterPolicy) -> str:
    sandbox = policy.spec.sandboxWorkloads
    return sandbox.mode if sandbox else "kubevirt"


def default_workload(policy: api.ClusterPolicy) -> str:
    sandbox = policy.spec.sandboxWorkloads
    return sandbox.defaultWorkload if sandbox else "container"


def plugin_ready_init(*, vgpu: bool) -> Obj:
    """Wait for the node's workload type, then for its GPUs (vfio-pci binding or vGPU devices)."""
    base = common.VALIDATIONS_DIR
    vgpu_wait = (
        f"until [ -f {base}/vgpu-devices-ready ]; do echo waiting for vGPU devices; sleep 5; done"
        if vgpu
        else "echo vGPU workloads are not served by this plugin"
    )
    script = (
        f"until [ -f {WORKLOAD_TYPE_FILE} ]; do echo waiting for the workload type; sleep 5; done; "
        f'if [ "$(cat {WORKLOAD_TYPE_FILE})" = "vm-passthrough" ]; then '
        f"until [ -f {base}/vfio-pci-ready ]; do echo waiting for vfio-pci; sleep 5; done; "
        f"else {vgpu_wait}; fi"
    )
    return common.container(
        "vfio-pci-validation",
        command=["sh", "-c"],
        args=[script],
        mounts=[common.mount("run-nvidia-validations", base, propagation="HostToContainer")],
    )
