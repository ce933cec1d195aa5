"""State `state-operator-validation`: the validator DaemonSet that gates the stack node by node.

Its init containers run in order driver -> toolkit -> cuda -> plugin; each writes a status file
under /run/nvidia/validations that other operands wait for (reference §6).
"""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement, images
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj, container, env, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-operator-validation"
DS_NAME = "nvidia-operator-validator"
SA_NAME = "nvidia-operator-validator"
MAIN = "nvidia-operator-validator"
STEPS = ("driver", "toolkit", "cuda", "plugin")
# Upstream grants the validator the ClusterPolicy and NVIDIADriver finalizers (ClusterRole): the
# workload pods it creates name an owner with blockOwnerDeletion, which clusters enforcing
# OwnerReferencesPermissionEnforcement allow only with update on the owner's finalizers. Upstream
# grants every verb there; `update` is the only one the API server checks.
FINALIZERS_RULE: Obj = common.rule(
    ["nvidia.com"], ["clusterpolicies/finalizers", "nvidiadrivers/finalizers"], ("update",)
)


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return True


def _step(component: str, *, with_wait: bool) -> Obj:
    """One validation step with upstream's env (names and order) for its component."""
    wait = env("WITH_WAIT", str(with_wait).lower())
    what = env("COMPONENT", component)
    if component == "toolkit":
        # The toolkit check runs nvidia-smi in a container the NVIDIA runtime must fill:
        # upstream asks for every GPU.
        env_vars = [env("NVIDIA_VISIBLE_DEVICES", "all"), wait, what]
    elif component == "plugin":
        env_vars = [what, wait]
    else:
        env_vars = [wait, what]
    if component in ("cuda", "plugin"):
        # Both start workload pods on this node (set later: image, pull policy, runtime class).
        env_vars += [common.node_name_env(), common.namespace_env()]
    return container(
        f"{component}-validation",
        command=["sh", "-c"],
        args=["nvidia-validator"],
        env_vars=env_vars,
        mounts=[
            mount("run-nvidia-validations", common.VALIDATIONS_DIR, propagation="Bidirectional")
        ],
        privileged=True,
    )


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        MAIN,
        command=["sh", "-c"],
        args=["echo all validations are successful; while true; do sleep 86400; done"],
        mounts=[
            mount("run-nvidia-validations", common.VALIDATIONS_DIR, propagation="Bidirectional")
        ],
        privileged=True,
    )
    main["securityContext"]["runAsUser"] = 0
    # Removing the status files on stop makes every waiting operand wait again after a restart.
    main["lifecycle"] = {
        "preStop": {"exec": {"command": ["sh", "-c", f"rm -f {common.VALIDATIONS_DIR}/*-ready"]}}
    }
    inits = [
        common.driver_validation_init(with_wait=True, host_root_first=True),
        _step("toolkit", with_wait=False),
        _step("cuda", with_wait=False),
        _step("plugin", with_wait=False),
    ]
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="operator-validator",
        service_account_name=SA_NAME,
        # Upstream selects validator pods on app and part-of `gpu-operator`.
        part_of=common.PART_OF_OPERATOR,
        main=[main],
        inits=inits,
        volumes=[
            *common.VALIDATION_VOLUMES,
            # No type: the driver root may be the host's own (a preinstalled driver).
            common.host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR),
            common.host_path("host-root", "/"),
            common.host_path("host-dev-char", "/dev/char"),
        ],
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec
    validator = spec.validator
    image = images.resolve(validator, "validator", facts.operator_env)
    common.apply_operand_spec(ds, validator, "validator", facts, image=image)
    pull_policy = images.pull_policy(validator.imagePullPolicy if validator else None)
    secrets = ",".join(validator.imagePullSecrets or ()) if validator else ""
    runtime_class = (
        spec.operator.runtimeClass or "nvidia"
        if common.runtime_class_applies(policy, facts)
        else ""
    )
    plugin = common.find_container(ds, "plugin-validation")
    assert plugin is not None
    # Upstream's order: these two come before the node and namespace env.
    for at, item in enumerate(
        (
            env("WITH_WORKLOAD", "false"),
            env("MIG_STRATEGY", enablement.mig_strategy(spec) or "none"),
        )
    ):
        plugin["env"].insert(2 + at, item)
    # The cuda and plugin steps start workload pods with the validator image themselves.
    for component in ("cuda", "plugin"):
        ctr = common.find_container(ds, f"{component}-validation")
        assert ctr is not None
        set_env(ctr, "VALIDATOR_IMAGE", image)
        set_env(ctr, "VALIDATOR_IMAGE_PULL_POLICY", pull_policy)
        if secrets:
            set_env(ctr, "VALIDATOR_IMAGE_PULL_SECRETS", secrets)
        if runtime_class:
            set_env(ctr, "VALIDATOR_RUNTIME_CLASS", runtime_class)
    for component in STEPS:
        ctr = common.find_container(ds, f"{component}-validation")
        section = getattr(validator, component) if validator else None
        if ctr is not None and section is not None:
            common.upsert_env(ctr, section.env)
    if not enablement.is_enabled(spec, "devicePlugin"):
        common.remove_container(ds, "plugin-validation")
    common.apply_runtime_class(ds, policy, facts)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[common.rule([""], ["nodes"], common.READ), FINALIZERS_RULE],
        # The cuda and plugin steps create, watch and delete their workload pods.
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule([""], ["pods"], common.WRITE),
            common.rule(["apps"], ["daemonsets"], common.READ),
        ],
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
