"""The GPUCluster's operand states: `state-dra-driver` and `state-dra-validation` (pure).

What NVIDIA's 26.7 operator lays down for a GPUCluster (its manifests under state-dra-driver and
state-dra-validation), as objects of ours, in apply order:

- state-dra-driver: the kubelet plugin's ServiceAccount; with compute domains the controller's
  ServiceAccount, ClusterRole, Role and bindings and the compute-domain daemons' ServiceAccount and
  ClusterRole; the plugin's Roles (compute-domain cliques; MPS Deployments with the `MPSSupport`
  gate; listing DaemonSets for its driver-validation init container) and ClusterRole; the
  DeviceClasses `gpu.nvidia.com`, `mig.nvidia.com`, `vfio.gpu.nvidia.com` and, with compute
  domains, `compute-domain-daemon.nvidia.com` and `compute-domain-default-channel.nvidia.com`;
  the kubelet-plugin DaemonSet (containers `gpus` and `compute-domains`); the compute-domain
  controller Deployment; a ValidatingAdmissionPolicy (and binding) that lets the plugin's service
  account write only the ResourceSlices of the node it runs on.
- state-dra-validation: the validator's ServiceAccount, a ResourceClaimTemplate for one GPU with
  adminAccess (it never takes a GPU from a workload) and the `nvidia-dra-validator` DaemonSet whose
  init container lists the claimed GPU with `nvidia-smi -L`.

With the builtin agents (draDriver's image is the operator image, operands/builtin.py) the `gpus`
container runs our agent `gpu-operator agent dra-kubelet-plugin`; compute domains have agents of
ours too: the `compute-domains` container runs `gpu-operator agent compute-domain-kubelet-plugin`
and the controller Deployment `gpu-operator agent compute-domain-controller`
(docs/compute-domains.md).
OpenShift's SecurityContextConstraints are out of scope (operands/facts.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from gpu_operator.api import images, keys
from gpu_operator.api.clusterpolicy import DCGMExporterSpec, DCGMSpec
from gpu_operator.api.core_types import EnvVar, ResourceRequirements
from gpu_operator.api.gpucluster import (
    COMPUTE_DOMAINS_HEALTHCHECK_PORT,
    COMPUTE_DOMAINS_HTTP_PORT,
    GPUS_HEALTHCHECK_PORT,
    GPUS_HTTP_PORT,
    DRADriverHealthcheckSpec,
    DRADriverSpec,
    GPUCluster,
    GPUClusterSpec,
)
from gpu_operator.nodes import labelling
from gpu_operator.operands import builtin, common, dcgm, dcgm_exporter
from gpu_operator.operands.common import (
    READ,
    WRITE,
    RenderError,
    host_path,
    metadata,
    mount,
    rule,
    upsert_env,
)
from gpu_operator.operands.facts import ClusterFacts
from gpu_operator.operands.podspec import env, set_env

Obj = dict[str, Any]

STATE_DRIVER = "state-dra-driver"
STATE_DCGM = "state-dcgm"
STATE_DCGM_EXPORTER = "state-dcgm-exporter"
STATE_VALIDATION = "state-dra-validation"
# Upstream's order of a GPUCluster's states (its internal/state/manager.go).
STATES = (STATE_DRIVER, STATE_DCGM, STATE_DCGM_EXPORTER, STATE_VALIDATION)

DRA_DRIVER_IMAGE_ENV = "DRA_DRIVER_IMAGE"
VALIDATOR_IMAGE_ENV = "VALIDATOR_IMAGE"
PLUGIN_ACCOUNT = "nvidia-dra-driver-kubeletplugin"
PLUGIN_DAEMONSET = "nvidia-dra-driver-kubelet-plugin"
CONTROLLER = "nvidia-dra-driver-controller"
CD_DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
CD_DAEMON_ROLE = "compute-domain-daemon"
VALIDATOR = "nvidia-dra-validator"
VALIDATOR_CLAIM_TEMPLATE = "nvidia-dra-validator-gpu"
SLICES_POLICY = "resourceslices-policy-nvidia-dra-driver"
DEVICE_CLASSES_GPU = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
DEVICE_CLASSES_CD = (
    "compute-domain-daemon.nvidia.com",
    "compute-domain-default-channel.nvidia.com",
)
# Node labels the two DaemonSets select on (written by the GPUCluster reconciler).
DEPLOY_DRA_DRIVER = keys.DEPLOY_PREFIX + "dra-driver"
DEPLOY_DRA_VALIDATOR = keys.DEPLOY_PREFIX + "dra-validator"
# Our agent, and NVIDIA's entry points in its image.
BUILTIN_COMMAND = ("gpu-operator", "agent", "dra-kubelet-plugin")
BUILTIN_CD_PLUGIN_COMMAND = ("gpu-operator", "agent", "compute-domain-kubelet-plugin")
BUILTIN_CD_CONTROLLER_COMMAND = ("gpu-operator", "agent", "compute-domain-controller")
GPU_PLUGIN_ENTRY = "gpu-kubelet-plugin"
CD_PLUGIN_ENTRY = "compute-domain-kubelet-plugin"
CD_CONTROLLER_ENTRY = "compute-domain-controller"
# The namespace label that allows adminAccess claims (the validator's) in the namespace.
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
# DCGM and its exporter under a GPUCluster: their own names, node labels and admin-access claims
# of every GPU of the node (they watch GPUs workloads hold; they never take one away).
DCGM_DRA = "nvidia-dcgm-dra"
DCGM_EXPORTER_DRA = "nvidia-dcgm-exporter-dra"
DCGM_EXPORTER_READ_PODS = "nvidia-dcgm-exporter-dra-read-pods"
DCGM_ADMIN_TEMPLATE = "nvidia-dcgm-admin"
DCGM_EXPORTER_ADMIN_TEMPLATE = "nvidia-dcgm-exporter-admin"
ADMIN_CLAIM = "admin-gpus"
DEPLOY_DCGM_DRA = keys.DEPLOY_PREFIX + "dcgm-dra"
DEPLOY_DCGM_EXPORTER_DRA = keys.DEPLOY_PREFIX + "dcgm-exporter-dra"
# What the reconciler sets on every GPU node under a GPUCluster (upstream sets all four).
DEPLOY_LABELS = (DEPLOY_DRA_DRIVER, DEPLOY_DRA_VALIDATOR, DEPLOY_DCGM_DRA, DEPLOY_DCGM_EXPORTER_DRA)

CREATE_DELETE = ("create", "update", "delete")
_HOLD_READY = "echo all validations are successful; while true; do sleep 86400; done"
_APP_NAME = "app.kubernetes.io/name"
_APP_COMPONENT = "app.kubernetes.io/component"
_DRIVER_LABELS = {_APP_NAME: "nvidia-dra-driver"}
_RESERVED_POD_LABELS = frozenset({"app", "app.kubernetes.io/part-of"})
_DRIVER_READY_SCRIPT = """\
# The driver-validation init container writes the driver root it found here.
set -a
source /run/nvidia/validations/driver-ready
set +a
# Only where asked (nvkind and the like): keep the driver from creating device nodes.
if [ "${{MASK_NVIDIA_DRIVER_PARAMS}}" = "true" ]; then
  cp /proc/driver/nvidia/params /root/gpu-params
  sed -i 's/^ModifyDeviceFiles: 1$/ModifyDeviceFiles: 0/' /root/gpu-params
  mount --bind /root/gpu-params /proc/driver/nvidia/params
fi
exec {program} -v "${{LOG_VERBOSITY}}\""""


@dataclass(frozen=True)
class Rendered:
    """The objects of both states, in apply order, and what the render wants said."""

    states: tuple[tuple[str, tuple[Obj, ...]], ...]
    notes: tuple[str, ...] = ()
    builtin: bool = False

    def objects(self) -> list[Obj]:
        return [obj for _, objs in self.states for obj in objs]


@dataclass(frozen=True)
class Spec:
    """A GPUCluster's spec with NVIDIA's defaults applied (the controller's view)."""

    dra: DRADriverSpec
    compute_domains: bool
    gpus_port: int  # -1: health service off
    cd_port: int
    driver_install_dir: str
    kubelet_root: str
    gates: Mapping[str, bool] = field(default_factory=dict)


def effective(spec: GPUClusterSpec) -> Spec:
    """NVIDIA's defaults: computeDomains on, health services on at 51516 / 51515, the driver
    under /run/nvidia/driver, the kubelet under /var/lib/kubelet."""
    dra = spec.draDriver
    cds = dra.computeDomains
    gpus_plugin = dra.gpus.kubeletPlugin if dra.gpus else None
    cd_plugin = cds.kubeletPlugin if cds else None
    paths = spec.hostPaths
    return Spec(
        dra=dra,
        compute_domains=cds.enabled if cds is not None else True,
        gpus_port=_port(gpus_plugin.healthcheck if gpus_plugin else None, GPUS_HEALTHCHECK_PORT),
        cd_port=_port(
            cd_plugin.healthcheck if cd_plugin else None, COMPUTE_DOMAINS_HEALTHCHECK_PORT
        ),
        driver_install_dir=(paths.driverInstallDir if paths else None) or "/run/nvidia/driver",
        kubelet_root=(paths.kubeletRootDir if paths else None) or "/var/lib/kubelet",
        gates=dict(dra.featureGates or {}),
    )


def _port(health: DRADriverHealthcheckSpec | None, default: int) -> int:
    if health is not None and not health.enabled:
        return -1
    if health is not None and health.port is not None:
        return health.port
    return default


def feature_gates_env(gates: Mapping[str, bool]) -> str:
    """FEATURE_GATES as NVIDIA's operator writes it: `Name=true,Other=false`, sorted by name."""
    return ",".join(f"{name}={'true' if gates[name] else 'false'}" for name in sorted(gates))


def driver_image(spec: DRADriverSpec, facts: ClusterFacts) -> str:
    try:
        return images.image_path(
            spec.repository, spec.image, spec.version, env_name=DRA_DRIVER_IMAGE_ENV,
            environ=facts.operator_env, what="GPUCluster spec.draDriver",
        )  # fmt: skip
    except images.ImageError as err:
        raise RenderError(str(err)) from None


def validator_image(facts: ClusterFacts) -> str:
    try:
        return images.image_path(
            None, None, None, env_name=VALIDATOR_IMAGE_ENV, environ=facts.operator_env,
            what="the DRA driver's validator",
        )  # fmt: skip
    except images.ImageError as err:
        raise RenderError(str(err)) from None


# --- resources ---------------------------------------------------------------------------------

_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
    "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity's value (`500m` -> 0.5, `1Gi` -> 1073741824, `1e3` -> 1000)."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            try:
                return Decimal(text[: -len(suffix)]) * Decimal(str(_SUFFIXES[suffix]))
            except InvalidOperation:
                break
    try:
        return Decimal(text)
    except InvalidOperation:
        raise RenderError(f"{value!r} is not a resource quantity") from None


def max_resources(*reqs: ResourceRequirements | None) -> Obj | None:
    """The larger of each request and limit over `reqs`, a request never above its limit (the
    init container that runs before both plugin containers gets this, as upstream's)."""
    requests: dict[str, int | str] = {}
    limits: dict[str, int | str] = {}
    for req in reqs:
        if req is None:
            continue
        for target, source in ((requests, req.requests), (limits, req.limits)):
            for name, value in (source or {}).items():
                if name not in target or quantity(value) > quantity(target[name]):
                    target[name] = value
    for name, value in requests.items():
        if name in limits and quantity(value) > quantity(limits[name]):
            limits[name] = value
    found: Obj = {}
    if limits:
        found["limits"] = limits
    if requests:
        found["requests"] = requests
    return found or None


# --- objects -----------------------------------------------------------------------------------


def _meta(name: str, state: str, ns: str | None, labels: Mapping[str, str] | None = None) -> Obj:
    return metadata(name, state, ns, labels)


def _account(name: str, state: str, ns: str, component: str, app: str = "nvidia-dra-driver") -> Obj:
    labels = {_APP_NAME: app, _APP_COMPONENT: component}
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, state, ns, labels),
    }


def _role(kind: str, name: str, state: str, ns: str | None, rules: Sequence[Obj]) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, state, ns),
        "rules": [copy.deepcopy(r) for r in rules],
    }


def _binding(kind: str, name: str, role: str, state: str, ns: str, account: str) -> Obj:
    role_kind = "ClusterRole" if kind == "ClusterRoleBinding" else "Role"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, state, ns if kind == "RoleBinding" else None),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }


def _device_class(name: str, expression: str, state: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": _meta(name, state, None),
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _gpu_class(name: str, kind: str, state: str) -> Obj:
    return _device_class(
        name,
        "device.driver == 'gpu.nvidia.com' && "
        f"device.attributes['gpu.nvidia.com'].type == '{kind}'",
        state,
    )


def _workload_meta(name: str, state: str, ns: str, component: str, spec: GPUClusterSpec) -> Obj:
    ds = spec.daemonsets
    labels = {
        **_DRIVER_LABELS,
        _APP_COMPONENT: component,
        "app": name,
        **((ds.labels if ds else None) or {}),
    }
    meta = _meta(name, state, ns, labels)
    if ds is not None and ds.annotations:
        meta["annotations"] = dict(ds.annotations)
    return meta


def _pod_labels(base: Mapping[str, str], spec: GPUClusterSpec) -> dict[str, str]:
    extra = (spec.daemonsets.labels if spec.daemonsets else None) or {}
    return {**base, **{k: v for k, v in extra.items() if k not in _RESERVED_POD_LABELS}}


def _pod_meta(labels: Mapping[str, str], spec: GPUClusterSpec) -> Obj:
    found: Obj = {"labels": _pod_labels(labels, spec)}
    annotations = spec.daemonsets.annotations if spec.daemonsets else None
    if annotations:
        found["annotations"] = dict(annotations)
    return found


def _tolerations(spec: GPUClusterSpec, facts: ClusterFacts) -> list[Obj]:
    found = [
        t.to_dict() for t in ((spec.daemonsets.tolerations if spec.daemonsets else None) or ())
    ]
    if facts.startup_toleration is not None and facts.startup_toleration not in found:
        found.append(dict(facts.startup_toleration))
    return found


def _pull_policy(dra: DRADriverSpec) -> str:
    return images.pull_policy(dra.imagePullPolicy)


def _with_env(ctr: Obj, user: Iterable[EnvVar] | None) -> Obj:
    upsert_env(ctr, user)
    return ctr


def _probes(ctr: Obj, port: int, liveness_period: int) -> None:
    if port <= 0:
        return
    check = {"port": port, "service": "liveness"}
    ctr["startupProbe"] = {
        "grpc": dict(check), "failureThreshold": 600, "periodSeconds": 1, "timeoutSeconds": 10,
    }  # fmt: skip
    ctr["livenessProbe"] = {
        "grpc": dict(check), "failureThreshold": 3, "periodSeconds": liveness_period,
        "timeoutSeconds": 10,
    }  # fmt: skip


def _plugin_env(
    eff: Spec, *, http_port: int, health_port: int, image: str | None, extra: Sequence[Obj]
) -> list[Obj]:
    kubelet = eff.kubelet_root
    found = [
        env("HTTP_ENDPOINT", f":{http_port}"),
        env("METRICS_PATH", "/metrics"),
        env("LOG_VERBOSITY", "4"),
        env("MASK_NVIDIA_DRIVER_PARAMS", ""),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
        env("CDI_ROOT", "/var/run/cdi"),
        *extra,
        env("NVIDIA_MIG_CONFIG_DEVICES", "all"),
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    if image is not None:
        found.append(env("IMAGE_NAME", image))
    found += [
        env("KUBELET_REGISTRAR_DIRECTORY_PATH", f"{kubelet}/plugins_registry"),
        env("KUBELET_PLUGINS_DIRECTORY_PATH", f"{kubelet}/plugins"),
        env("HEALTHCHECK_PORT", str(health_port)),
    ]
    return found


def _plugin_mounts(eff: Spec) -> list[Obj]:
    return [
        mount("plugins-registry", f"{eff.kubelet_root}/plugins_registry"),
        mount("plugins", f"{eff.kubelet_root}/plugins", propagation="Bidirectional"),
        mount("cdi", "/var/run/cdi"),
        mount("validations", "/run/nvidia/validations", read_only=True),
        mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
        mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
    ]


POD_RESOURCES_VOLUME = "pod-resources"


def _pod_resources_dir(eff: Spec) -> str:
    return f"{eff.kubelet_root.rstrip('/')}/pod-resources"


def _gpus_container(eff: Spec, image: str, ours: bool) -> Obj:
    dra = eff.dra
    plugin = dra.gpus.kubeletPlugin if dra.gpus else None
    ctr: Obj = {"name": "gpus", "image": image, "imagePullPolicy": _pull_policy(dra)}
    if ours:
        # Our agent reads the same environment; it needs root for the kubelet's plugin sockets.
        ctr["securityContext"] = {"privileged": True, **builtin.ROOT}
        ctr["command"] = list(BUILTIN_COMMAND)
    else:
        ctr["securityContext"] = {"privileged": True}
        ctr["command"] = ["bash", "-c"]
        ctr["args"] = [_DRIVER_READY_SCRIPT.format(program=GPU_PLUGIN_ENTRY)]
    ctr["env"] = _plugin_env(
        eff, http_port=GPUS_HTTP_PORT, health_port=eff.gpus_port, image=image,
        extra=[env("HOST_ROOT", "/host")],
    )  # fmt: skip
    if eff.gates:
        set_env(ctr, "FEATURE_GATES", feature_gates_env(eff.gates))
    _with_env(ctr, plugin.env if plugin else None)
    _probes(ctr, eff.gpus_port, 30)
    if plugin is not None and plugin.resources is not None:
        ctr["resources"] = plugin.resources.to_dict()
    ctr["volumeMounts"] = _plugin_mounts(eff)
    if ours:
        # Our agent finds the kubelet's directories under KUBELET_ROOT_DIR (kubeletRootDir).
        set_env(ctr, "KUBELET_ROOT_DIR", eff.kubelet_root)
        # Ours only (NVIDIA's plugin has no such mount): the hand-over from the device plugin
        # lists the kubelet's pod-resources API to leave out GPUs still held (docs/dra.md).
        ctr["volumeMounts"].append(
            mount(POD_RESOURCES_VOLUME, _pod_resources_dir(eff), read_only=True)
        )
    if eff.gates.get("PassthroughSupport"):
        ctr["volumeMounts"] += [
            mount("lib-modules", "/lib/modules/", read_only=True, propagation="HostToContainer"),
            mount("sysfs", "/sys/", propagation="Bidirectional"),
            mount("procfs", "/proc/", propagation="Bidirectional"),
        ]
    return ctr


def _cd_container(eff: Spec, image: str, ours: bool) -> Obj:
    dra = eff.dra
    plugin = dra.computeDomains.kubeletPlugin if dra.computeDomains else None
    ctr: Obj = {
        "name": "compute-domains", "image": image, "imagePullPolicy": _pull_policy(dra),
        "securityContext": {"privileged": True}, "command": ["bash", "-c"],
        "args": [_DRIVER_READY_SCRIPT.format(program=CD_PLUGIN_ENTRY)],
    }  # fmt: skip
    if ours:
        ctr["securityContext"] = {"privileged": True, **builtin.ROOT}
        ctr["command"] = list(BUILTIN_CD_PLUGIN_COMMAND)
        del ctr["args"]
    ctr["env"] = _plugin_env(
        eff, http_port=COMPUTE_DOMAINS_HTTP_PORT, health_port=eff.cd_port, image=None, extra=[]
    )
    set_env(ctr, "GPU_CLIQUE_LABEL_ENABLED", "true")
    if eff.gates:
        set_env(ctr, "FEATURE_GATES", feature_gates_env(eff.gates))
    _with_env(ctr, plugin.env if plugin else None)
    _probes(ctr, eff.cd_port, 10)
    if plugin is not None and plugin.resources is not None:
        ctr["resources"] = plugin.resources.to_dict()
    ctr["volumeMounts"] = _plugin_mounts(eff)
    return ctr


def _validation_init(eff: Spec, image: str, resources: Obj | None) -> Obj:
    ctr: Obj = {
        "name": "driver-validation", "image": image, "imagePullPolicy": _pull_policy(eff.dra),
        "command": ["nvidia-validator"],
    }  # fmt: skip
    if resources:
        ctr["resources"] = resources
    # Root: the validator chroots into the host root to find a host-installed driver.
    ctr["securityContext"] = {"privileged": True, "runAsUser": 0}
    ctr["env"] = [
        env("COMPONENT", "driver"),
        env("WITH_WAIT", "true"),
        # GPUs may be bound to vfio-pci: `nvidia-smi --version` only.
        env("DRIVER_VALIDATION_SKIP_GPU_INIT", "true"),
        # The kubelet plugin creates the device nodes it hands out itself.
        env("DISABLE_DEV_CHAR_SYMLINK_CREATION", "true"),
        {
            "name": "OPERATOR_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        env("HOST_ROOT", "/"),
        env("DRIVER_INSTALL_DIR", eff.driver_install_dir),
        env("DRIVER_INSTALL_DIR_CTR_PATH", "/driver-root"),
    ]
    ctr["volumeMounts"] = [
        mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
        mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
        mount("validations", "/run/nvidia/validations"),
    ]
    return ctr


def _plugin_daemonset(
    cluster: GPUClusterSpec, eff: Spec, facts: ClusterFacts, image: str, ours: bool
) -> Obj:
    dra = eff.dra
    cds_on = eff.compute_domains
    gpus_plugin = dra.gpus.kubeletPlugin if dra.gpus else None
    cd_plugin = dra.computeDomains.kubeletPlugin if dra.computeDomains else None
    init_resources = max_resources(
        gpus_plugin.resources if gpus_plugin else None,
        *([cd_plugin.resources if cd_plugin else None] if cds_on else []),
    )
    component = "nvidia-dra-driver-kubelet-plugin"
    pod: Obj = {
        "priorityClassName": _priority(cluster),
        "serviceAccountName": PLUGIN_ACCOUNT,
        "nodeSelector": {DEPLOY_DRA_DRIVER: "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]}
                for k, v in (
                    ("feature.node.kubernetes.io/pci-10de.present", "true"),
                    ("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"),
                    (keys.GPU_PRESENT, "true"),
                )
            ],
        }}},
        "initContainers": [_validation_init(eff, validator_image(facts), init_resources)],
        "containers": [
            _gpus_container(eff, image, ours),
            *([_cd_container(eff, image, ours)] if cds_on else []),
        ],
        "volumes": [
            host_path("plugins-registry", f"{eff.kubelet_root}/plugins_registry"),
            host_path("plugins", f"{eff.kubelet_root}/plugins"),
            host_path("cdi", "/var/run/cdi"),
            host_path("host-root", "/"),
            host_path("driver-install-dir", eff.driver_install_dir, "DirectoryOrCreate"),
            host_path("validations", "/run/nvidia/validations", "DirectoryOrCreate"),
        ],
    }  # fmt: skip
    if ours:
        pod["volumes"].append(host_path(POD_RESOURCES_VOLUME, _pod_resources_dir(eff)))
    if eff.gates.get("PassthroughSupport"):
        pod["volumes"] += [
            host_path("lib-modules", "/lib/modules/", "Directory"),
            host_path("sysfs", "/sys/", "Directory"),
            host_path("procfs", "/proc/", "Directory"),
        ]
    if dra.imagePullSecrets:
        pod["imagePullSecrets"] = [{"name": name} for name in dra.imagePullSecrets]
    tolerations = _tolerations(cluster, facts)
    if tolerations:
        pod["tolerations"] = tolerations
    base = {**_DRIVER_LABELS, _APP_COMPONENT: component, "app": PLUGIN_DAEMONSET}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _workload_meta(
            PLUGIN_DAEMONSET, STATE_DRIVER, facts.namespace, component, cluster
        ),
        "spec": {
            "selector": {"matchLabels": {"app": PLUGIN_DAEMONSET}},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "100%"},
            },
            "template": {"metadata": _pod_meta(base, cluster), "spec": pod},
        },
    }


def _priority(cluster: GPUClusterSpec) -> str:
    ds = cluster.daemonsets
    return (ds.priorityClassName if ds else None) or "system-node-critical"


def _controller_deployment(
    cluster: GPUClusterSpec, eff: Spec, facts: ClusterFacts, image: str, ours: bool
) -> Obj:
    dra = eff.dra
    ctl = dra.computeDomains.controller if dra.computeDomains else None
    ns = facts.namespace
    ctr: Obj = {
        "name": "compute-domain", "image": image, "imagePullPolicy": _pull_policy(dra),
        "command": [CD_CONTROLLER_ENTRY, "-v", "$(LOG_VERBOSITY)"],
        "env": [
            env("HTTP_ENDPOINT", ":8080"), env("METRICS_PATH", "/metrics"), env("PPROF_PATH", ""),
            env("LOG_VERBOSITY", "4"), env("LOG_VERBOSITY_CD_DAEMON", "4"),
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            env("IMAGE_NAME", image), env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("LEADER_ELECTION_ENABLED", "false"),
            env("LEADER_ELECTION_LEASE_LOCK_NAME", CONTROLLER),
            env("LEADER_ELECTION_LEASE_LOCK_NAMESPACE", ns),
            env("LEADER_ELECTION_LEASE_DURATION", "15s"),
            env("LEADER_ELECTION_RENEW_DEADLINE", "10s"),
            env("LEADER_ELECTION_RETRY_PERIOD", "2s"),
        ],
    }  # fmt: skip
    if ours:
        ctr["command"] = list(BUILTIN_CD_CONTROLLER_COMMAND)
    if eff.gates:
        set_env(ctr, "FEATURE_GATES", feature_gates_env(eff.gates))
    _with_env(ctr, ctl.env if ctl else None)
    if ctl is not None and ctl.resources is not None:
        ctr["resources"] = ctl.resources.to_dict()
    user_tolerations = (cluster.daemonsets.tolerations if cluster.daemonsets else None) or ()
    pod: Obj = {
        "priorityClassName": _priority(cluster),
        "serviceAccountName": CONTROLLER,
        "affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "preference": {"matchExpressions": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                ]},
            }]},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app": CONTROLLER}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }]},
        },
        "tolerations": [
            *({"effect": "NoSchedule", "key": f"node-role.kubernetes.io/{role}",
               "operator": "Exists"} for role in ("control-plane", "master")),
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            *[t.to_dict() for t in user_tolerations],
        ],
        "containers": [ctr],
    }  # fmt: skip
    if dra.imagePullSecrets:
        pod["imagePullSecrets"] = [{"name": name} for name in dra.imagePullSecrets]
    component = "nvidia-dra-driver-controller"
    base = {**_DRIVER_LABELS, _APP_COMPONENT: component, "app": CONTROLLER}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _workload_meta(CONTROLLER, STATE_DRIVER, ns, component, cluster),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": CONTROLLER}},
            "template": {"metadata": _pod_meta(base, cluster), "spec": pod},
        },
    }


def _of_request(expr: str) -> str:
    """A CEL expression on the slice a request writes (the old one for a DELETE)."""
    return f'(request.operation == "DELETE" ? oldObject : object).spec.{expr}'


def _slices_policy(ns: str) -> list[Obj]:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(SLICES_POLICY, STATE_DRIVER, None),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1", "v1beta1", "v1beta2"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"],
            }]},
            "matchConditions": [{
                "name": "isRestrictedUser",
                "expression": "request.userInfo.username == "
                f'"system:serviceaccount:{ns}:{PLUGIN_ACCOUNT}"',
            }],
            "variables": [
                {"name": "userNodeName", "expression":
                    "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "objectNodeName", "expression": _of_request('?nodeName.orValue("")')},
                {"name": "nodeSelectorValue",
                 "expression": _of_request("?nodeSelector.orValue(null)")},
                {"name": "allNodesValue", "expression": _of_request("?allNodes.orValue(false)")},
            ],
            "validations": [
                {"expression": 'variables.userNodeName != ""', "message":
                    "no node association found for user, this user must run in a pod on a node "
                    "and ServiceAccountTokenPodNodeInfo must be enabled"},
                {"expression": "variables.userNodeName == variables.objectNodeName || "
                    "variables.allNodesValue == true || variables.nodeSelectorValue != null",
                 "messageExpression": "\"this user running on node '\"+variables.userNodeName+\"' "
                    "may not modify cluster or node resourceslices\""},
            ],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(SLICES_POLICY, STATE_DRIVER, None),
        "spec": {"policyName": SLICES_POLICY, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def _driver_state(
    cluster: GPUClusterSpec, eff: Spec, facts: ClusterFacts, image: str, ours: bool
) -> list[Obj]:
    ns, s = facts.namespace, STATE_DRIVER
    cds = eff.compute_domains
    objs: list[Obj] = [_account(PLUGIN_ACCOUNT, s, ns, "nvidia-dra-driver-kubelet-plugin")]
    if cds:
        objs += [
            _account(CONTROLLER, s, ns, "nvidia-dra-driver-controller"),
            _role("ClusterRole", CONTROLLER, s, None, [
                rule(["resource.nvidia.com"], ["computedomains"], [*READ, "update"]),
                rule(["resource.nvidia.com"], ["computedomains/status"], ["update"]),
                rule(["resource.k8s.io"], ["resourceclaimtemplates"], [*READ, *CREATE_DELETE]),
                rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update"]),
                rule([""], ["nodes"], [*READ, "update"]),
                rule([""], ["pods"], READ),
                # Ours (controller/computedomain.py) writes with patches and watches the
                # compute-domain driver's ResourceSlices for the nodes' cliques.
                *([rule(["resource.nvidia.com"], ["computedomains", "computedomains/status"],
                        ["patch"]),
                   rule([""], ["nodes"], ["patch"]),
                   rule(["resource.k8s.io"], ["resourceslices"], READ)] if ours else []),
            ]),
            _role("Role", CONTROLLER, s, ns, [
                rule(["apps"], ["daemonsets"], [*READ, "create", "update", "patch", "delete"]),
                rule(["resource.nvidia.com"], ["computedomaincliques"], [*READ, "update"]),
                *([rule(["resource.nvidia.com"], ["computedomaincliques"],
                        ["create", "patch", "delete"]),
                   rule(["resource.k8s.io"], ["resourceclaimtemplates"], ["patch"]),
                   rule([""], ["events"], ["create", "patch"])] if ours else []),
            ]),
            _binding("ClusterRoleBinding", CONTROLLER, CONTROLLER, s, ns, CONTROLLER),
            _binding("RoleBinding", CONTROLLER, CONTROLLER, s, ns, CONTROLLER),
            _account(CD_DAEMON_ACCOUNT, s, ns, "compute-domain-daemon"),
            _role("ClusterRole", CD_DAEMON_ROLE, s, None, [
                rule(["resource.nvidia.com"], ["computedomains", "computedomains/status"],
                     [*READ, "update", "patch"]),
                rule(["resource.nvidia.com"], ["computedomaincliques"],
                     [*READ, "create", "update", "patch"]),
                rule([""], ["pods"], [*READ, "patch"]),
            ]),
            _binding("ClusterRoleBinding", CD_DAEMON_ROLE, CD_DAEMON_ROLE, s, ns,
                     CD_DAEMON_ACCOUNT),
            _role("Role", PLUGIN_ACCOUNT, s, ns,
                  [rule(["resource.nvidia.com"], ["computedomaincliques"], ["get"])]),
            _binding("RoleBinding", PLUGIN_ACCOUNT, PLUGIN_ACCOUNT, s, ns, PLUGIN_ACCOUNT),
        ]  # fmt: skip
    if eff.gates.get("MPSSupport"):
        mps = f"{PLUGIN_ACCOUNT}-mps"
        objs += [
            _role("Role", mps, s, ns, [rule(["apps"], ["deployments"], WRITE)]),
            _binding("RoleBinding", mps, mps, s, ns, PLUGIN_ACCOUNT),
        ]  # fmt: skip
    validation = f"{PLUGIN_ACCOUNT}-driver-validation"
    objs += [
        _role("Role", validation, s, ns, [rule(["apps"], ["daemonsets"], ["list"])]),
        _binding("RoleBinding", validation, validation, s, ns, PLUGIN_ACCOUNT),
        _role("ClusterRole", PLUGIN_ACCOUNT, s, None, [
            rule(["resource.nvidia.com"], ["computedomains"], READ),
            rule(["resource.k8s.io"], ["resourceclaims"], READ),
            rule(["resource.k8s.io"], ["resourceslices"], [*READ, "create", "update", "delete"]),
            rule([""], ["nodes"], [*READ, "update", "patch"]),
            rule([""], ["pods"], READ),
        ]),
        _binding("ClusterRoleBinding", PLUGIN_ACCOUNT, PLUGIN_ACCOUNT, s, ns, PLUGIN_ACCOUNT),
        _gpu_class("gpu.nvidia.com", "gpu", s),
        _gpu_class("mig.nvidia.com", "mig", s),
    ]  # fmt: skip
    if cds:
        cd = (
            "device.driver == 'compute-domain.nvidia.com' && "
            "device.attributes['compute-domain.nvidia.com']"
        )
        objs += [
            _device_class("compute-domain-daemon.nvidia.com", f"{cd}.type == 'daemon'", s),
            _device_class(
                "compute-domain-default-channel.nvidia.com",
                f"{cd}.type == 'channel' && "
                "device.attributes['compute-domain.nvidia.com'].id == 0", s,
            ),
        ]  # fmt: skip
    objs.append(_gpu_class("vfio.gpu.nvidia.com", "vfio", s))
    objs.append(_plugin_daemonset(cluster, eff, facts, image, ours))
    if cds:
        objs.append(_controller_deployment(cluster, eff, facts, image, ours))
    objs += _slices_policy(ns)
    return objs


def _validation_state(cluster: GPUClusterSpec, eff: Spec, facts: ClusterFacts) -> list[Obj]:
    ns, s = facts.namespace, STATE_VALIDATION
    dra = eff.dra
    image = validator_image(facts)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(VALIDATOR_CLAIM_TEMPLATE, s, ns),
        "spec": {"spec": {"devices": {"requests": [{
            "name": "validation-gpu",
            # adminAccess: the validator never takes a GPU a workload could have.
            "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                "adminAccess": True,
            },
        }]}}},
    }  # fmt: skip
    pull = _pull_policy(dra)
    pod: Obj = {
        "priorityClassName": "system-node-critical",
        "serviceAccountName": VALIDATOR,
        "nodeSelector": {DEPLOY_DRA_VALIDATOR: "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": keys.GPU_PRESENT, "operator": "In", "values": ["true"]}
            ]}],
        }}},
        "resourceClaims": [
            {"name": "validation-gpu", "resourceClaimTemplateName": VALIDATOR_CLAIM_TEMPLATE}
        ],
        "initContainers": [{
            "name": "gpu-validation", "image": image, "imagePullPolicy": pull,
            # nvidia-smi comes with the GPU's CDI injection, not from the image.
            "command": ["sh", "-c", "nvidia-smi -L"],
            "resources": {"claims": [{"name": "validation-gpu"}]},
        }],
        "containers": [{
            "name": VALIDATOR, "image": image, "imagePullPolicy": pull,
            "command": ["sh", "-c", _HOLD_READY],
        }],
    }  # fmt: skip
    if dra.imagePullSecrets:
        pod["imagePullSecrets"] = [{"name": name} for name in dra.imagePullSecrets]
    tolerations = _tolerations(cluster, facts)
    if tolerations:
        pod["tolerations"] = tolerations
    meta = _meta(VALIDATOR, s, ns, {
        _APP_NAME: VALIDATOR, _APP_COMPONENT: VALIDATOR, "app": VALIDATOR,
        **((cluster.daemonsets.labels if cluster.daemonsets else None) or {}),
    })  # fmt: skip
    if cluster.daemonsets is not None and cluster.daemonsets.annotations:
        meta["annotations"] = dict(cluster.daemonsets.annotations)
    # The pods carry `app: nvidia-operator-validator`, the label the upgrade flow waits on.
    base = {_APP_NAME: VALIDATOR, _APP_COMPONENT: VALIDATOR, "app": "nvidia-operator-validator"}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {_APP_NAME: VALIDATOR}},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "100%"},
            },
            "template": {"metadata": _pod_meta(base, cluster), "spec": pod},
        },
    }
    account = _account(VALIDATOR, s, ns, VALIDATOR, app=VALIDATOR)
    return [account, template, daemonset]


def dcgm_enabled(spec: GPUClusterSpec) -> bool:
    """The standalone host engine runs only when asked (`dcgm.enabled: true`): unlike a
    ClusterPolicy's, an unset `enabled` means off (the exporter then embeds its own engine)."""
    return spec.dcgm is not None and spec.dcgm.enabled is True


def dcgm_exporter_enabled(spec: GPUClusterSpec) -> bool:
    """The exporter runs when the section is there and not switched off (upstream's rule)."""
    return spec.dcgmExporter is not None and spec.dcgmExporter.enabled is not False


def _admin_template(name: str, state: str, ns: str) -> Obj:
    """A claim for every GPU of the node with adminAccess: DCGM sees the GPUs workloads hold,
    and takes none from them."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(name, state, ns),
        "spec": {"spec": {"devices": {"requests": [{
            "name": ADMIN_CLAIM,
            "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True,
            },
        }]}}},
    }  # fmt: skip


def _dcgm_daemonset(
    cluster: GPUClusterSpec,
    facts: ClusterFacts,
    *,
    name: str,
    state: str,
    deploy_label: str,
    template: str,
    main: Obj,
    section: DCGMSpec | DCGMExporterSpec,
    section_name: str,
    volumes: Sequence[Obj] = (),
) -> Obj:
    """A DCGM DaemonSet of a GPUCluster: the ClusterPolicy operand's container, its GPUs
    through an admin-access claim `admin-gpus`, no toolkit-ready init container or runtime class
    (GPUs come by CDI from the DRA driver), the GPUCluster's daemonsets settings."""
    state_ds = common.daemonset(
        name, state, facts, deploy_label=deploy_label.removeprefix(keys.DEPLOY_PREFIX),
        service_account_name=name, main=[main], volumes=volumes,
    )  # fmt: skip
    ds_spec = cluster.daemonsets
    state_ds["metadata"]["labels"].update((ds_spec.labels if ds_spec else None) or {})
    if ds_spec is not None and ds_spec.annotations:
        state_ds["metadata"]["annotations"] = dict(ds_spec.annotations)
    template_meta = state_ds["spec"]["template"]["metadata"]
    template_meta.update(_pod_meta({"app": name}, cluster))
    state_ds["spec"]["updateStrategy"] = {"type": "RollingUpdate"}
    pod = common.pod_spec(state_ds)
    pod["priorityClassName"] = "system-node-critical"
    tolerations = _tolerations(cluster, facts)
    if tolerations:
        pod["tolerations"] = tolerations
    else:
        pod.pop("tolerations", None)
    pod["resourceClaims"] = [{"name": ADMIN_CLAIM, "resourceClaimTemplateName": template}]
    common.apply_operand_spec(state_ds, section, section_name, facts)
    for ctr in common.containers(state_ds):
        resources = ctr.setdefault("resources", {})
        resources["claims"] = [{"name": ADMIN_CLAIM}]
    builtin.apply(state_ds, facts)
    return state_ds


def _dcgm_state(cluster: GPUClusterSpec, facts: ClusterFacts) -> list[Obj]:
    """`nvidia-dcgm-dra`: the host engine on every GPU node, and its node-local Service."""
    ns, s = facts.namespace, STATE_DCGM
    objs = common.rbac(
        DCGM_DRA, s, facts, namespace_rules=[rule(["resource.k8s.io"], ["resourceclaims"], READ)]
    )
    objs.append(_admin_template(DCGM_ADMIN_TEMPLATE, s, ns))
    main = dcgm.host_engine_container()
    # The image's entrypoint starts the host engine, as upstream's DaemonSet runs it.
    main.pop("command", None)
    main.pop("args", None)
    objs.append(_dcgm_daemonset(
        cluster, facts, name=DCGM_DRA, state=s, deploy_label=DEPLOY_DCGM_DRA,
        template=DCGM_ADMIN_TEMPLATE, main=main, section=cluster.dcgm or DCGMSpec(),
        section_name="dcgm",
    ))  # fmt: skip
    objs.append(common.service(
        DCGM_DRA, s, facts, port=dcgm.PORT, port_name="dcgm", service_type="ClusterIP",
        internal_traffic_policy="Local",
    ))  # fmt: skip
    return objs


def _exporter_state(cluster: GPUClusterSpec, eff: Spec, facts: ClusterFacts) -> list[Obj]:
    """`nvidia-dcgm-exporter-dra`: metrics of every GPU of the node (admin access), attributed
    to pods through the DRA claims (KUBERNETES_ENABLE_DRA and the read-pods ClusterRole)."""
    exporter = cluster.dcgmExporter or DCGMExporterSpec()
    config_map = exporter.config.name if exporter.config and exporter.config.name else None
    dcgm_exporter.check_metrics_csv(config_map, facts)
    ns, s = facts.namespace, STATE_DCGM_EXPORTER
    labels = {"app": DCGM_EXPORTER_DRA}
    objs = common.rbac(
        DCGM_EXPORTER_DRA, s, facts,
        namespace_rules=[
            rule(["resource.k8s.io"], ["resourceclaims"], READ),
            rule([""], ["configmaps"], ("get", "list")),
        ],
    )  # fmt: skip
    read_pods = common.rbac(
        DCGM_EXPORTER_READ_PODS, s, facts,
        cluster_rules=[
            rule([""], ["pods"], READ), rule(["resource.k8s.io"], ["resourceslices"], READ),
        ],
        labels=labels,
    )[1:]  # fmt: skip
    read_pods[1]["subjects"][0]["name"] = DCGM_EXPORTER_DRA  # the exporter's own account
    # Upstream's order: the Role, the ClusterRole, then their bindings.
    objs = [objs[0], objs[1], read_pods[0], objs[2], read_pods[1]]
    objs.append(_admin_template(DCGM_EXPORTER_ADMIN_TEMPLATE, s, ns))
    service = exporter.service
    objs.append(common.service(
        DCGM_EXPORTER_DRA, s, facts, port=dcgm_exporter.PORT, port_name=dcgm_exporter.PORT_NAME,
        service_type=(service.type if service else None) or "ClusterIP",
        internal_traffic_policy=service.internalTrafficPolicy if service else None,
        annotations={"prometheus.io/scrape": "true"},
    ))  # fmt: skip
    main = dcgm_exporter.exporter_container(DCGM_EXPORTER_DRA)
    ds = _dcgm_daemonset(
        cluster, facts, name=DCGM_EXPORTER_DRA, state=s, deploy_label=DEPLOY_DCGM_EXPORTER_DRA,
        template=DCGM_EXPORTER_ADMIN_TEMPLATE, main=main, section=exporter,
        section_name="dcgmExporter",
        volumes=[host_path("pod-gpu-resources", f"{eff.kubelet_root.rstrip('/')}/pod-resources")],
    )  # fmt: skip
    common.pod_spec(ds)["automountServiceAccountToken"] = True
    dcgm_exporter.apply_metrics_config(ds, config_map)
    remote = f"{DCGM_DRA}:{dcgm.PORT}" if dcgm_enabled(cluster) else None
    # The user's env comes last, after the operator's own (apply_operand_spec put it first).
    ctr = common.main_container(ds)
    user_env = [e for e in ctr.get("env", []) if e["name"] in {v.name for v in exporter.env or ()}]
    ctr["env"] = [e for e in ctr.get("env", []) if e not in user_env]
    dcgm_exporter.apply_exporter_options(ds, exporter, remote=remote, dra=True)
    ctr["env"] += user_env
    objs.append(ds)
    monitor = exporter.serviceMonitor
    if facts.has_servicemonitor_crd and monitor is not None and monitor.enabled:
        objs.append(common.service_monitor(
            DCGM_EXPORTER_DRA, s, facts, port_name=dcgm_exporter.PORT_NAME, settings=monitor,
            job_label="app",
        ))  # fmt: skip
    return objs


def is_gpu_node(labels: Mapping[str, str]) -> bool:
    return labelling.has_gpu(labels) or labels.get(keys.GPU_PRESENT) == "true"


def node_label_patch(
    labels: Mapping[str, str], wanted: bool, holds_claims: bool = False
) -> dict[str, str | None] | None:
    """The labels a node needs for the DRA DaemonSets (None: nothing to change). A node where
    pods still hold `gpu.nvidia.com` claims (`holds_claims`) keeps the DRA driver's label it has
    until they are gone (status/gpucluster.py, nodes_holding_gpu_claims)."""
    desired: dict[str, str | None]
    if wanted and is_gpu_node(labels):
        desired = dict.fromkeys(DEPLOY_LABELS, "true")
        if labelling.has_gpu(labels):
            desired[keys.GPU_PRESENT] = "true"
    else:
        desired = dict.fromkeys(DEPLOY_LABELS, None)
        if holds_claims and DEPLOY_DRA_DRIVER in labels:
            del desired[DEPLOY_DRA_DRIVER]
    patch = {k: v for k, v in desired.items() if labels.get(k) != v}
    return patch or None


def render(cluster: GPUCluster, facts: ClusterFacts) -> Rendered:
    """Both states' objects for a GPUCluster; RenderError when an image cannot be resolved."""
    if cluster.spec is None:
        raise RenderError("GPUCluster has no spec: spec.draDriver is required")
    eff = effective(cluster.spec)
    image = driver_image(eff.dra, facts)
    ours = builtin.runs_ours(image, facts)
    notes: list[str] = []
    spec = cluster.spec
    states = (
        (STATE_DRIVER, tuple(_driver_state(spec, eff, facts, image, ours))),
        (STATE_DCGM, tuple(_dcgm_state(spec, facts) if dcgm_enabled(spec) else ())),
        (
            STATE_DCGM_EXPORTER,
            tuple(_exporter_state(spec, eff, facts) if dcgm_exporter_enabled(spec) else ()),
        ),
        (STATE_VALIDATION, tuple(_validation_state(spec, eff, facts))),
    )
    return Rendered(states=states, notes=tuple(notes), builtin=ours)


__all__ = [
    "STATES",
    "Rendered",
    "Spec",
    "dcgm_enabled",
    "dcgm_exporter_enabled",
    "effective",
    "feature_gates_env",
    "max_resources",
    "node_label_patch",
    "quantity",
    "render",
]
