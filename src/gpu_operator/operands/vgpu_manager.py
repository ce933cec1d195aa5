"""State `state-vgpu-manager`: the vGPU host driver on nodes running vGPU-backed VMs."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import images, keys
from gpu_operator.operands import common, driver, sandbox
from gpu_operator.operands.common import Obj, container, host_path, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-vgpu-manager"
DS_NAME = "nvidia-vgpu-manager-daemonset"
SA_NAME = "nvidia-vgpu-manager"
CTR = "nvidia-vgpu-manager-ctr"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    """Like the driver, handed over to NVIDIADriver objects in CRD mode."""
    return sandbox.sandbox_on(policy, "vgpuManager") and not driver.crd_mode(policy)


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["nvidia-driver"],
        args=["init"],
        env_vars=[common.node_name_env()],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount("host-os-release", "/host-etc/os-release", read_only=True),
            mount("host-sys", "/sys"),
        ],
        privileged=True,
    )
    main["lifecycle"] = {
        "preStop": {
            "exec": {
                "command": ["/bin/sh", "-c", "rm -f /run/nvidia/validations/.driver-ctr-ready"]
            }
        }
    }
    ds = common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="vgpu-manager",
        service_account_name=SA_NAME,
        main=[main],
        inits=[driver.manager_container()],
        volumes=[
            host_path("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            host_path("var-log", "/var/log"),
            host_path("dev-log", "/dev/log"),
            host_path("host-os-release", "/etc/os-release"),
            host_path("host-root", "/"),
            host_path("host-sys", "/sys", "Directory"),
            host_path("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
        ],
        host_pid=True,
    )
    # As upstream: kubectl logs/exec default to the manager container.
    ds["spec"]["template"]["metadata"]["annotations"] = {
        driver.DEFAULT_CONTAINER_ANNOTATION: main["name"]
    }
    return ds


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts, image: str) -> None:
    spec = policy.spec.vgpuManager
    common.apply_operand_spec(ds, spec, "vgpuManager", facts, image=image)
    driver.manager_init(ds, spec.driverManager if spec else None, facts, evict=False)
    config = spec.kernelModuleConfig if spec else None
    if config and config.name:
        driver.mount_config_map_files(
            ds,
            common.main_container(ds),
            facts,
            volume="kernel-module-configs",
            config_map=config.name,
            target_dir="/drivers",
            field="spec.vgpuManager.kernelModuleConfig.name",
        )


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    tag = facts.os_tag
    if tag is None:
        raise common.RenderError(
            "the vGPU manager image needs the GPU nodes' OS: no node carries the NFD labels "
            f"{keys.NFD_OS_ID} and {keys.NFD_OS_VERSION_ID}"
        )
    image = images.driver_image(
        images.resolve(policy.spec.vgpuManager, "vgpuManager", facts.operator_env), tag
    )
    objects = driver.rbac(facts, SA_NAME, NAME)
    ds = _base(facts)
    objects.append(
        common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts, image))
    )
    return objects
