"""State `state-cc-manager`: sets the confidential-computing mode of GPUs on sandbox nodes."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.operands import common, sandbox
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-cc-manager"
DS_NAME = "nvidia-cc-manager"
SA_NAME = "nvidia-cc-manager"
CTR = "nvidia-cc-manager"
READY_FILE = f"{common.VALIDATIONS_DIR}/.cc-manager-ctr-ready"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return sandbox.sandbox_on(policy, "ccManager") and sandbox.mode(policy) == "kata"


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["nvidia-cc-manager"],
        env_vars=[common.node_name_env(), env("DEFAULT_CC_MODE", "on")],
        mounts=[
            mount("host-sys", "/sys"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
        ],
        privileged=True,
    )
    main["lifecycle"] = {"preStop": {"exec": {"command": ["sh", "-c", f"rm -f {READY_FILE}"]}}}
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="cc-manager",
        service_account_name=SA_NAME,
        main=[main],
        volumes=[host_path("host-sys", "/sys", "Directory"), *common.VALIDATION_VOLUMES],
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec.ccManager
    if spec is not None and spec.defaultMode:
        set_env(common.main_container(ds), "DEFAULT_CC_MODE", spec.defaultMode)
    common.apply_operand_spec(ds, spec, "ccManager", facts)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[common.rule([""], ["nodes"], ("get", "list", "watch", "update", "patch"))],
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
