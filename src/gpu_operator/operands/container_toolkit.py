"""State `state-container-toolkit`: installs the NVIDIA runtime and wires it into the CRI."""

from __future__ import annotations

import posixpath
from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-container-toolkit"
DS_NAME = "nvidia-container-toolkit-daemonset"
SA_NAME = "nvidia-container-toolkit"
CTR = "nvidia-container-toolkit-ctr"
ENTRYPOINT_CM = "nvidia-container-toolkit-entrypoint"
DEFAULT_INSTALL_DIR = "/usr/local/nvidia"
CDI_KIND = "management.nvidia.com/gpu"
NRI_SOCKET = "/var/run/nri/nri.sock"
# Where the toolkit writes CRI-O's OCI hook (in the container), and the host directory behind it:
# upstream's asset names /run/containers/oci/hooks.d and moves it to CRI-O's default hooks
# directory on CRI-O nodes (off OpenShift, which is all we support).
CRIO_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
CRIO_HOOKS_HOST_DIR = "/run/containers/oci/hooks.d"

# Per runtime: the top-level config, the drop-in file and the control socket on the host.
RUNTIME_CONFIG = {
    "docker": "/etc/docker/daemon.json",
    "containerd": "/etc/containerd/config.toml",
    "crio": "/etc/crio/config.toml",
}
RUNTIME_DROP_IN = {
    "containerd": "/etc/containerd/conf.d/99-nvidia.toml",
    "crio": "/etc/crio/crio.conf.d/99-nvidia.conf",
}
RUNTIME_SOCKET = {
    "docker": "/var/run/docker.sock",
    "containerd": "/run/containerd/containerd.sock",
}

ENTRYPOINT = """#!/bin/sh
# Wait for the validated driver, take its root paths, then run the toolkit installer.
until [ -f /run/nvidia/validations/driver-ready ]; do
  echo "waiting for the driver validation"; sleep 5
done
set -o allexport
. /run/nvidia/validations/driver-ready
set +o allexport
exec nvidia-toolkit
"""


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "toolkit")


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["/bin/sh", "-c"],
        args=["/bin/entrypoint.sh"],
        env_vars=[
            env("ROOT", DEFAULT_INSTALL_DIR),
            env("NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", CDI_KIND),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("TOOLKIT_PID_FILE", "/run/nvidia/toolkit/toolkit.pid"),
            # The namespace whose pods may ask the NRI plugin for devices by annotation (the
            # operator's own: its management pods), as upstream sets it.
            common.namespace_env("NRI_NAMESPACE"),
        ],
        mounts=[
            mount("nvidia-container-toolkit-entrypoint", "/bin/entrypoint.sh", read_only=True),
            mount("toolkit-root", "/run/nvidia/toolkit"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
            mount("toolkit-install-dir", DEFAULT_INSTALL_DIR),
            mount("crio-hooks", CRIO_HOOKS_DIR),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            # Host mounts made later (the driver root) must show through.
            mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    main["securityContext"]["seLinuxOptions"] = {"level": "s0"}
    main["volumeMounts"][0]["subPath"] = "entrypoint.sh"
    volumes = [
        {
            "name": "nvidia-container-toolkit-entrypoint",
            "configMap": {"name": ENTRYPOINT_CM, "defaultMode": 448},
        },
        host_path("toolkit-root", "/run/nvidia/toolkit", "DirectoryOrCreate"),
        *common.VALIDATION_VOLUMES,
        host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
        host_path("host-root", "/"),
        host_path("toolkit-install-dir", DEFAULT_INSTALL_DIR),
        host_path("crio-hooks", CRIO_HOOKS_HOST_DIR),
        host_path("host-dev-char", "/dev/char"),
        host_path("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
    ]
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="container-toolkit",
        service_account_name=SA_NAME,
        main=[main],
        inits=[common.driver_validation_init(with_wait=True)],
        volumes=volumes,
        host_pid=True,
    )


def _mount_host_file(
    ds: Obj,
    ctr: Obj,
    volume: str,
    host_file: str,
    ctr_dir: str,
    kind: str | None = "DirectoryOrCreate",
) -> str:
    """Mount the directory of a host file; return the file's path inside the container."""
    directory, base = posixpath.split(host_file)
    common.add_volume(ds, host_path(volume, directory, kind))
    common.add_mount(ctr, mount(volume, ctr_dir))
    return f"{ctr_dir.rstrip('/')}/{base}"


def _wire_runtime(ds: Obj, ctr: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    runtime = facts.runtime
    upper = runtime.upper()
    set_env(ctr, "RUNTIME", runtime)
    if enablement.nri_plugin_enabled(policy.spec):
        # NRI injects devices without touching the runtime config: only its socket is needed.
        host_socket = common.get_env(ctr, "NRI_SOCKET") or NRI_SOCKET
        path = _mount_host_file(ds, ctr, "nri-socket", host_socket, "/runtime/nri-sock-dir/")
        set_env(ctr, "NRI_SOCKET", path)
        return
    if runtime == "containerd":
        set_env(ctr, "CONTAINERD_RUNTIME_CLASS", policy.spec.operator.runtimeClass or "nvidia")
    # A user may point the config at another host path (k3s, RKE2) through the env.
    config = (
        common.get_env(ctr, "RUNTIME_CONFIG")
        or common.get_env(ctr, f"{upper}_CONFIG")
        or RUNTIME_CONFIG[runtime]
    )
    # Volumes are named after the runtime, as upstream names them.
    path = _mount_host_file(ds, ctr, f"{runtime}-config", config, "/runtime/config-dir/")
    set_env(ctr, "RUNTIME_CONFIG", path)
    set_env(ctr, f"{upper}_CONFIG", path)
    drop_in = common.get_env(ctr, "RUNTIME_DROP_IN_CONFIG") or RUNTIME_DROP_IN.get(runtime)
    if drop_in:
        path = _mount_host_file(
            ds, ctr, f"{runtime}-drop-in-config", drop_in, "/runtime/config-dir.d/"
        )
        set_env(ctr, "RUNTIME_DROP_IN_CONFIG", path)
        set_env(ctr, "RUNTIME_DROP_IN_CONFIG_HOST_PATH", drop_in)
    socket = (
        common.get_env(ctr, "RUNTIME_SOCKET")
        or common.get_env(ctr, f"{upper}_SOCKET")
        or RUNTIME_SOCKET.get(runtime)
    )
    if socket:
        # The socket's directory must exist already (no type), as upstream mounts it.
        path = _mount_host_file(
            ds, ctr, f"{runtime}-socket", socket, "/runtime/sock-dir/", kind=None
        )
        set_env(ctr, "RUNTIME_SOCKET", path)
        set_env(ctr, f"{upper}_SOCKET", path)
    source = common.get_env(ctr, "RUNTIME_CONFIG_SOURCE")
    if source:
        # `file=` sources name host files, which the container sees under /host.
        parts = [
            f"file=/host{p[len('file=') :]}" if p.startswith("file=/") else p
            for p in source.split(",")
        ]
        set_env(ctr, "RUNTIME_CONFIG_SOURCE", ",".join(parts))


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec
    toolkit = spec.toolkit
    ctr = common.main_container(ds)
    # User env goes first here: the runtime wiring reads the host paths users set and rewrites
    # them to the paths inside the container.
    common.apply_operand_spec(ds, toolkit, "toolkit", facts)
    cdi_on = enablement.is_enabled(spec, "cdi")
    if cdi_on:
        set_env(ctr, "CDI_ENABLED", "true")
        set_env(ctr, "NVIDIA_RUNTIME_SET_AS_DEFAULT", "false")
        set_env(ctr, "NVIDIA_CONTAINER_RUNTIME_MODE", "cdi")
        # Set whatever the runtime, as upstream does (CRI-O reads it; others ignore it).
        set_env(ctr, "CRIO_CONFIG_MODE", "config")
        if enablement.nri_plugin_enabled(spec):
            set_env(ctr, "ENABLE_NRI_PLUGIN", "true")
    elif facts.runtime == "crio":
        set_env(ctr, "CRIO_CONFIG_MODE", "hook")
    install_dir = toolkit.installDir or DEFAULT_INSTALL_DIR
    if install_dir != DEFAULT_INSTALL_DIR:
        set_env(ctr, "ROOT", install_dir)
        common.add_volume(ds, host_path("toolkit-install-dir", install_dir))
        common.add_mount(ctr, mount("toolkit-install-dir", install_dir))
    if facts.runtime == "crio":
        hooks = common.find_volume(ds, "crio-hooks")
        assert hooks is not None
        hooks["hostPath"]["path"] = CRIO_HOOKS_DIR
    _wire_runtime(ds, ctr, policy, facts)
    _add_guard(ds, policy, facts)


# The runtime-config guard (ours) next to NVIDIA's toolkit: `runtime-config-save` (an init
# container) copies the node's runtime config before the toolkit first edits it, and the native
# sidecar `runtime-config-guard`, which Kubernetes stops after the toolkit container, puts it back
# byte for byte when the pod goes (uninstall, or a toolkit update). Both run the operator image.
GUARD_SAVE = "runtime-config-save"
GUARD = "runtime-config-guard"
GUARD_ENV = "RUNTIME_CONFIG_GUARD"
GUARD_DIR_NAME = "runtime-config-guard"
# Native sidecars are on by default from Kubernetes 1.29; before, the API server drops the field
# and the guard would block the pod as an init container that never ends.
GUARD_MIN_KUBERNETES = (1, 29)
# Toolkit mounts the guard does not need.
_GUARD_SKIPPED_MOUNTS = frozenset(
    {"nvidia-container-toolkit-entrypoint", "driver-install-dir", "cdi-root", "toolkit-root"}
)


def _kubernetes_at_least(version: str, wanted: tuple[int, int]) -> bool:
    parts = version.lstrip("v").split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= wanted
    except (IndexError, ValueError):
        return True  # unknown: assume a current cluster


def guard_enabled(policy: api.ClusterPolicy, facts: ClusterFacts, toolkit_image: str) -> bool:
    """The guard runs next to a toolkit that is not ours (ours saves and restores by itself)
    when the operator is told so (`RUNTIME_CONFIG_GUARD`, the chart's
    `toolkit.runtimeConfigGuard`), knows its own image, the runtime config is edited at all (not
    with NRI) and the cluster has native sidecars."""
    from gpu_operator.operands import builtin

    wanted = facts.operator_env.get(GUARD_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return (
        wanted
        and builtin.operator_image(facts) is not None
        and not builtin.runs_ours(toolkit_image, facts)
        and not enablement.nri_plugin_enabled(policy.spec)
        and _kubernetes_at_least(facts.kubernetes_version, GUARD_MIN_KUBERNETES)
    )


def _add_guard(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    """The guard's two containers, with the toolkit's runtime env and mounts (see above)."""
    from gpu_operator.operands import builtin

    toolkit = common.main_container(ds)
    if not guard_enabled(policy, facts, str(toolkit.get("image", ""))):
        return
    image = builtin.operator_image(facts)
    assert image is not None
    root = common.get_env(toolkit, "ROOT") or DEFAULT_INSTALL_DIR
    env_vars = [dict(e) for e in toolkit.get("env", [])]
    mounts = [
        dict(m) for m in toolkit.get("volumeMounts", []) if m["name"] not in _GUARD_SKIPPED_MOUNTS
    ]

    def guard(name: str, action: str) -> Obj:
        ctr = container(
            name,
            command=["gpu-operator", "agent", GUARD, action],
            env_vars=[dict(e) for e in env_vars],
            mounts=[dict(m) for m in mounts],
            image=image,
        )
        set_env(ctr, "RUNTIME_CONFIG_BACKUP_DIR", posixpath.join(root, GUARD_DIR_NAME))
        if not any(e["name"] == "NODE_NAME" for e in ctr.get("env", [])):
            ctr.setdefault("env", []).append(common.node_name_env())
        ctr["securityContext"] = {"seLinuxOptions": {"level": "s0"}}
        return ctr

    sidecar = guard(GUARD, "watch")
    sidecar["restartPolicy"] = "Always"
    common.pod_spec(ds).setdefault("initContainers", []).extend(
        [guard(GUARD_SAVE, "save"), sidecar]
    )


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        # Ours: the toolkit reports config drift and restores as Events on its Node.
        cluster_rules=[common.rule([""], ["nodes"], ("get",))],
        # Upstream's Role (the SCC; listing DaemonSets), plus ours: the Node's Events.
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule(["apps"], ["daemonsets"], ("list",)),
            common.rule([""], ["events"], ("create",)),
        ],
    )
    objects.append(
        common.config_map(
            ENTRYPOINT_CM, NAME, facts, {"entrypoint.sh": ENTRYPOINT}, labels={"app": DS_NAME}
        )
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
