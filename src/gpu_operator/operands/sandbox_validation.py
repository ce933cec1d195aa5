"""State `state-sandbox-validation`: validates VM-workload nodes (cc, vfio-pci, vGPU) in order."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common, sandbox
from gpu_operator.operands.common import Obj, container, env, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-sandbox-validation"
DS_NAME = "nvidia-sandbox-validator"
SA_NAME = "nvidia-sandbox-validator"
MAIN = "nvidia-sandbox-validator"
STEPS = (
    ("cc-manager", None),
    ("vfio-pci", "vfioPCI"),
    ("vgpu-manager", "vgpuManager"),
    ("vgpu-devices", "vgpuDevices"),
)


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return sandbox.sandbox_on(policy)


def _step(component: str) -> Obj:
    return container(
        f"{component}-validation",
        command=["sh", "-c"],
        args=["nvidia-validator"],
        env_vars=[
            env("WITH_WAIT", "true"),
            env("COMPONENT", component),
            common.node_name_env(),
            common.namespace_env(),
        ],
        mounts=[
            mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
            mount("driver-install-dir", "/run/nvidia/driver", propagation="HostToContainer"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR, propagation="Bidirectional"),
            mount("host-sys", "/sys"),
        ],
        privileged=True,
    )


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        MAIN,
        command=["sh", "-c"],
        args=["echo all validations are successful; sleep infinity"],
        mounts=[
            mount("run-nvidia-validations", common.VALIDATIONS_DIR, propagation="Bidirectional")
        ],
        privileged=True,
    )
    main["lifecycle"] = {
        "preStop": {"exec": {"command": ["sh", "-c", f"rm -f {common.VALIDATIONS_DIR}/*-ready"]}}
    }
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="sandbox-validator",
        service_account_name=SA_NAME,
        # Upstream selects sandbox validator pods on app and part-of `gpu-operator`.
        part_of=common.PART_OF_OPERATOR,
        main=[main],
        inits=[_step(component) for component, _ in STEPS],
        volumes=[
            *common.VALIDATION_VOLUMES,
            *common.DRIVER_VALIDATION_VOLUMES,
            common.host_path("host-sys", "/sys", "Directory"),
        ],
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec
    validator = spec.validator
    common.apply_operand_spec(ds, validator, "validator", facts)
    workload = sandbox.default_workload(policy)
    for component, section in STEPS:
        ctr = common.find_container(ds, f"{component}-validation")
        assert ctr is not None
        set_env(ctr, "DEFAULT_GPU_WORKLOAD_CONFIG", workload)
        settings = getattr(validator, section) if validator and section else None
        if settings is not None:
            common.upsert_env(ctr, settings.env)
    if not enablement.is_enabled(spec, "ccManager"):
        common.remove_container(ds, "cc-manager-validation")


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME, NAME, facts, cluster_rules=[common.rule([""], ["nodes"], common.READ)]
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
