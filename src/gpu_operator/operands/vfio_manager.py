"""State `state-vfio-manager`: binds GPUs to vfio-pci on nodes that pass them through to VMs."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.operands import common, driver, sandbox
from gpu_operator.operands.common import Obj, container, host_path, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-vfio-manager"
DS_NAME = "nvidia-vfio-manager"
SA_NAME = "nvidia-vfio-manager"
CTR = "nvidia-vfio-manager"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return sandbox.sandbox_on(policy, "vfioManager")


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["/bin/sh", "-c"],
        args=["vfio-manage bind --all && sleep inf"],
        env_vars=[common.node_name_env()],
        mounts=[mount("host-sys", "/sys"), mount("host-root", "/host", read_only=True)],
        privileged=True,
    )
    main["lifecycle"] = {
        "preStop": {"exec": {"command": ["/bin/sh", "-c", "vfio-manage unbind --all"]}}
    }
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="vfio-manager",
        service_account_name=SA_NAME,
        main=[main],
        inits=[driver.manager_container()],
        volumes=[
            host_path("host-sys", "/sys", "Directory"),
            host_path("host-root", "/"),
            host_path("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            host_path("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
        ],
        host_pid=True,
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec.vfioManager
    common.apply_operand_spec(ds, spec, "vfioManager", facts)
    # Only unload the driver: no GPU workloads run on passthrough nodes to evict.
    driver.manager_init(ds, spec.driverManager if spec else None, facts, evict=False)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = driver.rbac(facts, SA_NAME, NAME)
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
