"""State `state-mig-manager`: applies the MIG layout a node label `nvidia.com/mig.config` names.

The default mig-parted configuration holds upstream's configs, recorded as facts in
`operands.mig_configs`; the `nvidia-mig-manager-entrypoint` script starts upstream's manager
once the driver is validated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common, mig_configs
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-mig-manager"
DS_NAME = "nvidia-mig-manager"
SA_NAME = "nvidia-mig-manager"
CTR = "nvidia-mig-manager"
MIG_CONFIG_CM = "default-mig-parted-config"
GPU_CLIENTS_CM = "default-gpu-clients"
ENTRYPOINT_CM = "nvidia-mig-manager-entrypoint"
CONFIG_DIR = "/mig-parted-config"
CLIENTS_DIR = "/gpu-clients"

# Host services that hold GPUs open and are stopped around a MIG change.
GPU_CLIENT_SERVICES = (
    "nvsm.service",
    "nvsm-mqtt.service",
    "nvsm-core.service",
    "nvsm-api-gateway.service",
    "nvsm-notifier.service",
    "nv_peer_mem.service",
    "nvidia-dcgm.service",
    "dcgm.service",
    "dcgm-exporter.service",
)


# Upstream starts its manager through this script: it waits for the validator's driver-ready
# marker, and stops the host's own GPU services around a MIG change only when the driver is
# installed on the host (a containerised driver leaves no such services to stop). Only
# IS_HOST_DRIVER is taken from the marker: the driver root paths in it are the validator's view,
# while this container sees the driver root at /driver-root. The script sets those paths (the
# pod template carries upstream's env only, so adopting NVIDIA's DaemonSet restarts nothing).
ENTRYPOINT = """#!/bin/sh
ready=/run/nvidia/validations/driver-ready
until [ -f "$ready" ]; do
  echo "waiting for the driver validation ($ready)"; sleep 5
done
host_driver=$(sed -n 's/^IS_HOST_DRIVER=//p' "$ready" | tr -d '"' | tail -n 1)
export WITH_SHUTDOWN_HOST_GPU_CLIENTS="${host_driver:-false}"
export NVIDIA_DRIVER_ROOT="${NVIDIA_DRIVER_ROOT:-/run/nvidia/driver}"
export DRIVER_ROOT_CTR_PATH="${DRIVER_ROOT_CTR_PATH:-/driver-root}"
echo "WITH_SHUTDOWN_HOST_GPU_CLIENTS=$WITH_SHUTDOWN_HOST_GPU_CLIENTS"
exec nvidia-mig-manager
"""


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "migManager")


def _to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML emitter for the config shapes here; strings are JSON-quoted (valid YAML)."""
    pad = " " * indent
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        lines = []
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{pad}{key}:\n{_to_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_to_yaml(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return "[]"
        lines = []
        for item in value:
            text = _to_yaml(item, indent + 2)
            lines.append(
                f"{pad}- {text.lstrip()}" if isinstance(item, Mapping) else f"{pad}- {text}"
            )
        return "\n".join(lines)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))


def default_mig_configs() -> dict[str, list[dict[str, Any]]]:
    """mig-parted `mig-configs` of upstream's default ConfigMap (81 configs, see mig_configs)."""
    return mig_configs.document()


def default_mig_config_yaml() -> str:
    document = {"version": "v1", "mig-configs": default_mig_configs()}
    return _to_yaml(document) + "\n"


def default_gpu_clients_yaml() -> str:
    return _to_yaml({"version": "v1", "systemd-services": list(GPU_CLIENT_SERVICES)}) + "\n"


def _config_name(policy: api.ClusterPolicy) -> str:
    manager = policy.spec.migManager
    config = manager.config if manager else None
    return config.name if config and config.name else MIG_CONFIG_CM


def _clients_name(policy: api.ClusterPolicy) -> str:
    manager = policy.spec.migManager
    clients = manager.gpuClientsConfig if manager else None
    return clients.name if clients and clients.name else GPU_CLIENTS_CM


def _base(policy: api.ClusterPolicy, facts: ClusterFacts) -> Obj:
    # Upstream's env: the host paths, reboot and host-client settings are the manager's own
    # defaults, so the pod template leaves them out (as upstream's does).
    main = container(
        CTR,
        command=["/bin/sh", "-c"],
        args=["/bin/entrypoint.sh"],
        env_vars=[
            common.node_name_env(),
            # The manager publishes its hardware-generated config as a ConfigMap owned by its pod.
            common.field_env("POD_NAME", "metadata.name"),
            common.namespace_env("POD_NAMESPACE"),
            env("GPU_CLIENTS_FILE", f"{CLIENTS_DIR}/clients.yaml"),
            common.namespace_env("DEFAULT_GPU_CLIENTS_NAMESPACE"),
        ],
        mounts=[
            mount(ENTRYPOINT_CM, "/bin/entrypoint.sh", read_only=True),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
            mount("host-sys", "/sys"),
            mount("host-root", "/host", propagation="HostToContainer"),
            mount("gpu-clients", CLIENTS_DIR),
            mount("mig-parted-config", CONFIG_DIR),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    main["volumeMounts"][0]["subPath"] = "entrypoint.sh"
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="mig-manager",
        service_account_name=SA_NAME,
        main=[main],
        inits=[
            common.toolkit_ready_init(
                what="nvidia container toolkit", volume="run-nvidia-validations"
            )
        ],
        volumes=[
            {"name": ENTRYPOINT_CM, "configMap": {"name": ENTRYPOINT_CM, "defaultMode": 448}},
            host_path("host-sys", "/sys", "Directory"),
            *common.VALIDATION_VOLUMES,
            host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
            host_path("host-root", "/"),
            {"name": "gpu-clients", "configMap": {"name": _clients_name(policy)}},
            # Its ConfigMap (and items) are set by the transform.
            {"name": "mig-parted-config", "configMap": {"name": _config_name(policy)}},
            host_path("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
        ],
        host_pid=True,
        host_ipc=True,
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec
    ctr = common.main_container(ds)
    name = _config_name(policy)
    if name == MIG_CONFIG_CM:
        # The default file is only a fallback: the manager prefers a config generated from
        # the node's hardware, and uses this one when generation fails.
        volume = {
            "name": "mig-parted-config",
            "configMap": {
                "name": name,
                "items": [{"key": "config.yaml", "path": "config-default.yaml"}],
            },
        }
        set_env(ctr, "DEFAULT_CONFIG_FILE", f"{CONFIG_DIR}/config-default.yaml")
    else:
        volume = {"name": "mig-parted-config", "configMap": {"name": name}}
        set_env(ctr, "CONFIG_FILE", f"{CONFIG_DIR}/config.yaml")
    # In place: the volume keeps upstream's position in the list.
    volumes = common.pod_spec(ds)["volumes"]
    volumes[:] = [volume if v["name"] == volume["name"] else v for v in volumes]
    if enablement.is_enabled(spec, "cdi"):
        set_env(ctr, "CDI_ENABLED", "true")
        set_env(ctr, "NVIDIA_CDI_HOOK_PATH", common.cdi_hook_path(policy))
    common.apply_runtime_class(ds, policy, facts)
    common.apply_operand_spec(ds, spec.migManager, "migManager", facts)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """RBAC, the default ConfigMaps (unless custom ones are named) and the DaemonSet."""
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        # As upstream: node labels, and listing the pods on its node (GPU clients to wait for);
        # nothing cluster-wide beyond that.
        cluster_rules=[
            common.rule([""], ["nodes"], ("get", "list", "watch", "update", "patch")),
            common.rule([""], ["pods"], ("list",)),
        ],
        # Upstream's Role, in the operator namespace only: its own pod (owner of the published
        # config), the validator pods it deletes so they re-validate the new layout
        # (agents/mig_manager/reconfigure.py), the `<node>-mig-config` it publishes. Ours also
        # watches and deletes that ConfigMap, and records Events.
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule([""], ["pods"], ("get", "list", "watch", "delete")),
            common.rule([""], ["configmaps"], common.WRITE),
            common.rule([""], ["events"], ("create",)),
        ],
    )
    if _config_name(policy) == MIG_CONFIG_CM:
        objects.append(
            common.config_map(
                MIG_CONFIG_CM, NAME, facts, {"config.yaml": default_mig_config_yaml()}
            )
        )
    if _clients_name(policy) == GPU_CLIENTS_CM:
        objects.append(
            common.config_map(
                GPU_CLIENTS_CM, NAME, facts, {"clients.yaml": default_gpu_clients_yaml()}
            )
        )
    objects.append(
        common.config_map(
            ENTRYPOINT_CM, NAME, facts, {"entrypoint.sh": ENTRYPOINT}, labels={"app": DS_NAME}
        )
    )
    ds = _base(policy, facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
