"""State `state-mig-manager`: applies the MIG layout a node label `nvidia.com/mig.config` names.

The default mig-parted configuration is generated from the GPU catalog's MIG profile tables, so
every catalogued MIG-capable model gets `all-<profile>` layouts and `all-balanced`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.nvml import catalog
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-mig-manager"
DS_NAME = "nvidia-mig-manager"
SA_NAME = "nvidia-mig-manager"
CTR = "nvidia-mig-manager"
MIG_CONFIG_CM = "default-mig-parted-config"
GPU_CLIENTS_CM = "default-gpu-clients"
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

# all-balanced per GPU size (compute slices): counts of the plain 1g/2g/3g profiles.
_BALANCED = {7: {1: 2, 2: 1, 3: 1}, 4: {1: 2, 2: 1}}
_PLAIN_PROFILES = (
    catalog.GI_PROFILE_1_SLICE,
    catalog.GI_PROFILE_2_SLICE,
    catalog.GI_PROFILE_3_SLICE,
)


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
    """mig-parted `mig-configs`: all-disabled, all-enabled, all-<profile> and all-balanced."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    per_profile: dict[str, list[tuple[str, dict[str, int]]]] = {}
    balanced: list[tuple[str, dict[str, int]]] = []
    for model in catalog.mig_capable_models():
        for profile in model.mig_profiles:
            name = f"all-{profile.resource_name}"
            per_profile.setdefault(name, []).append(
                (model.pci_device_id_hex, {profile.name: profile.instance_count})
            )
        plain = {
            p.slice_count: p.name for p in model.mig_profiles if p.profile_id in _PLAIN_PROFILES
        }
        layout = _BALANCED.get(model.mig_compute_slices, {})
        if layout and all(slices in plain for slices in layout):
            balanced.append(
                (model.pci_device_id_hex, {plain[s]: count for s, count in layout.items()})
            )
    for name in sorted(per_profile, key=_profile_sort_key):
        configs[name] = _grouped(per_profile[name])
    configs["all-balanced"] = _grouped(balanced)
    return configs


def _profile_sort_key(name: str) -> tuple[int, str]:
    slices = name.removeprefix("all-").split("g", 1)[0]
    return (int(slices) if slices.isdigit() else 99, name)


def _grouped(entries: list[tuple[str, dict[str, int]]]) -> list[dict[str, Any]]:
    """One spec per distinct layout, filtered to the models that share it."""
    by_layout: dict[str, tuple[list[str], dict[str, int]]] = {}
    for device_id, devices in entries:
        key = json.dumps(devices, sort_keys=True)
        by_layout.setdefault(key, ([], devices))[0].append(device_id)
    return [
        {"device-filter": ids, "devices": "all", "mig-enabled": True, "mig-devices": devices}
        for ids, devices in by_layout.values()
    ]


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
    main = container(
        CTR,
        command=["nvidia-k8s-mig-manager"],
        env_vars=[
            common.node_name_env(),
            env("GPU_CLIENTS_FILE", f"{CLIENTS_DIR}/clients.yaml"),
            env("HOST_ROOT_MOUNT", "/host"),
            env("HOST_NVIDIA_DIR", "/usr/local/nvidia"),
            env(
                "HOST_MIG_MANAGER_STATE_FILE",
                "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf",
            ),
            env(
                "HOST_GPU_CLIENT_SERVICES_FILE", "/etc/systemd/system/nvidia-gpu-reset.target.wants"
            ),
            env("WITH_REBOOT", "false"),
            env("WITH_SHUTDOWN_HOST_GPU_CLIENTS", "false"),
            env("DEFAULT_GPU_CLIENTS_NAMESPACE", facts.namespace),
            env("NVIDIA_DRIVER_ROOT", common.DEFAULT_DRIVER_INSTALL_DIR),
            env("DRIVER_ROOT_CTR_PATH", "/driver-root"),
            # The manager publishes its hardware-generated config as a ConfigMap owned by its pod.
            common.field_env("POD_NAME", "metadata.name"),
            common.namespace_env("POD_NAMESPACE"),
        ],
        mounts=[
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
            mount("mig-parted-config", CONFIG_DIR),
            mount("gpu-clients", CLIENTS_DIR),
            mount("host-root", "/host"),
            mount("host-sys", "/sys"),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="mig-manager",
        service_account_name=SA_NAME,
        main=[main],
        inits=[common.toolkit_ready_init()],
        volumes=[
            *common.VALIDATION_VOLUMES,
            {"name": "gpu-clients", "configMap": {"name": _clients_name(policy)}},
            host_path("host-root", "/"),
            host_path("host-sys", "/sys", "Directory"),
            host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
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
    common.add_volume(ds, volume)
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
        cluster_rules=[
            common.rule([""], ["nodes"], ("get", "list", "watch", "update", "patch")),
            common.rule([""], ["pods"], ("get", "list", "watch", "delete")),
        ],
        # The manager publishes the hardware-generated config as `<node>-mig-config`, and
        # records Events about its node's MIG changes.
        namespace_rules=[
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
    ds = _base(policy, facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
