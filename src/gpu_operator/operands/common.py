"""Object builders and the DaemonSet transforms every operand state shares (reference §3.5).

Objects are plain dicts shaped like the Kubernetes API. Every object carries the state label
`nvidia.com/gpu-operator.state: <state>` in its own metadata so the controller can prune what a
state no longer wants. DaemonSet selectors and pod template labels are exactly upstream's (the
state label stays off them): selectors are immutable, and a template that differs from the one
NVIDIA's operator wrote would restart every operand pod when we take its DaemonSets over.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpu_operator import api
from gpu_operator.api import enablement, images, keys
from gpu_operator.api.clusterpolicy import ContainerSpec
from gpu_operator.api.core_types import EnvVar, ImageSpec
from gpu_operator.operands import builtin
from gpu_operator.operands.facts import ClusterFacts
from gpu_operator.operands.podspec import Obj as Obj
from gpu_operator.operands.podspec import all_containers as all_containers
from gpu_operator.operands.podspec import containers as containers
from gpu_operator.operands.podspec import env as env
from gpu_operator.operands.podspec import get_env as get_env
from gpu_operator.operands.podspec import init_containers as init_containers
from gpu_operator.operands.podspec import pod_spec as pod_spec
from gpu_operator.operands.podspec import set_env as set_env

STATE_LABEL = keys.OPERATOR_STATE_LABEL
PART_OF_LABEL = "app.kubernetes.io/part-of"
# Upstream's two spellings of part-of: GPU feature discovery selects `nvidia-gpu`, the validators
# select `gpu-operator`; every other operand DaemonSet selects on `app` alone.
PART_OF_VALUE = "nvidia-gpu"
PART_OF_OPERATOR = "gpu-operator"
GPU_TOLERATION: Obj = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
VALIDATIONS_DIR = "/run/nvidia/validations"
DEFAULT_DRIVER_INSTALL_DIR = "/run/nvidia/driver"
CDI_HOOK_NAME = "nvidia-cdi-hook"
NRI_ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/container."
NRI_ANNOTATION_VALUE = "management.nvidia.com/gpu=all"

# Labels a user may not move onto operand pods: they carry selector and ownership meaning.
_RESERVED_POD_LABELS = frozenset({"app", PART_OF_LABEL, STATE_LABEL})


class RenderError(ValueError):
    """A state cannot be rendered from this policy and these facts; the message says why."""


# --- metadata and simple objects ---------------------------------------------------------------


def metadata(
    name: str, state: str, namespace: str | None = None, labels: Mapping[str, str] | None = None
) -> Obj:
    """Object metadata with the state label; `namespace` only for namespaced kinds."""
    meta: Obj = {"name": name, "labels": {**(labels or {}), STATE_LABEL: state}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def service_account(
    name: str, state: str, facts: ClusterFacts, labels: Mapping[str, str] | None = None
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(name, state, facts.namespace, labels),
    }


def rbac(
    name: str,
    state: str,
    facts: ClusterFacts,
    *,
    cluster_rules: Sequence[Obj] = (),
    namespace_rules: Sequence[Obj] = (),
    labels: Mapping[str, str] | None = None,
) -> list[Obj]:
    """A ServiceAccount plus a Role and a ClusterRole (with bindings) when given rules; `labels`
    go on every one of them (upstream labels some operands' RBAC with `app`)."""
    subject = {"kind": "ServiceAccount", "name": name, "namespace": facts.namespace}
    objects = [service_account(name, state, facts, labels)]
    rbac_group = "rbac.authorization.k8s.io"
    if namespace_rules:
        objects.append(
            {
                "apiVersion": f"{rbac_group}/v1",
                "kind": "Role",
                "metadata": metadata(name, state, facts.namespace, labels),
                "rules": [copy.deepcopy(dict(rule)) for rule in namespace_rules],
            }
        )
        objects.append(
            {
                "apiVersion": f"{rbac_group}/v1",
                "kind": "RoleBinding",
                "metadata": metadata(name, state, facts.namespace, labels),
                "roleRef": {"apiGroup": rbac_group, "kind": "Role", "name": name},
                "subjects": [subject],
            }
        )
    if cluster_rules:
        objects.append(
            {
                "apiVersion": f"{rbac_group}/v1",
                "kind": "ClusterRole",
                "metadata": metadata(name, state, labels=labels),
                "rules": [dict(rule) for rule in cluster_rules],
            }
        )
        objects.append(
            {
                "apiVersion": f"{rbac_group}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": metadata(name, state, labels=labels),
                "roleRef": {"apiGroup": rbac_group, "kind": "ClusterRole", "name": name},
                "subjects": [subject],
            }
        )
    return objects


def rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str]) -> Obj:
    """One RBAC policy rule."""
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


READ = ("get", "list", "watch")
WRITE = ("get", "list", "watch", "create", "update", "patch", "delete")
# Upstream's operand Roles let the pods use OpenShift's `privileged` SecurityContextConstraints;
# the rule is inert elsewhere (no such resource) and kept so the Roles equal upstream's.
SCC_USE_PRIVILEGED: Obj = {
    "apiGroups": ["security.openshift.io"],
    "resources": ["securitycontextconstraints"],
    "verbs": ["use"],
    "resourceNames": ["privileged"],
}


def config_map(
    name: str,
    state: str,
    facts: ClusterFacts,
    data: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name, state, facts.namespace, labels),
        "data": dict(data),
    }


def service(
    name: str,
    state: str,
    facts: ClusterFacts,
    *,
    port: int,
    port_name: str,
    service_type: str | None = None,
    internal_traffic_policy: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A Service in front of the pods labelled `app: <name>`."""
    meta = metadata(name, state, facts.namespace, {"app": name})
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: Obj = {
        "selector": {"app": name},
        "ports": [{"name": port_name, "port": port, "protocol": "TCP", "targetPort": port}],
    }
    if service_type:
        spec["type"] = service_type
    if internal_traffic_policy:
        spec["internalTrafficPolicy"] = internal_traffic_policy
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def service_monitor(
    name: str,
    state: str,
    facts: ClusterFacts,
    *,
    port_name: str,
    settings: api.clusterpolicy.ServiceMonitorSpec | None,
    job_label: str,
) -> Obj:
    """A prometheus-operator ServiceMonitor for the Service `name`, with the user's edits.

    `job_label` is upstream's per asset (`operator`, `app`, `node-status`)."""
    endpoint: Obj = {"port": port_name, "path": "/metrics"}
    labels: dict[str, str] = {"app": name}
    if settings is not None:
        labels.update(settings.additionalLabels or {})
        if settings.interval:
            endpoint["interval"] = settings.interval
        if settings.scrapeTimeout:
            endpoint["scrapeTimeout"] = settings.scrapeTimeout
        # Only when true: false is the default, which upstream's object leaves out.
        if settings.honorLabels:
            endpoint["honorLabels"] = True
        if settings.relabelings:
            endpoint["relabelings"] = [r.to_dict() for r in settings.relabelings]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(name, state, facts.namespace, labels),
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "namespaceSelector": {"matchNames": [facts.namespace]},
            "endpoints": [endpoint],
            "jobLabel": job_label,
        },
    }


# --- containers, volumes, env -------------------------------------------------------------------


def field_env(name: str, field_path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def node_name_env() -> Obj:
    return field_env("NODE_NAME", "spec.nodeName")


def namespace_env(name: str = "OPERATOR_NAMESPACE") -> Obj:
    return field_env(name, "metadata.namespace")


def mount(name: str, path: str, *, read_only: bool = False, propagation: str | None = None) -> Obj:
    found: Obj = {"name": name, "mountPath": path}
    if read_only:
        found["readOnly"] = True
    if propagation:
        found["mountPropagation"] = propagation
    return found


def host_path(name: str, path: str, kind: str | None = None) -> Obj:
    source: Obj = {"path": path}
    if kind:
        source["type"] = kind
    return {"name": name, "hostPath": source}


def container(
    name: str,
    *,
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    env_vars: Iterable[Obj] = (),
    mounts: Iterable[Obj] = (),
    privileged: bool = False,
    image: str = "",
) -> Obj:
    """A container; the image is usually filled in later by image resolution."""
    found: Obj = {"name": name, "image": image, "imagePullPolicy": "IfNotPresent"}
    if command is not None:
        found["command"] = list(command)
    if args is not None:
        found["args"] = list(args)
    env_list = list(env_vars)
    if env_list:
        found["env"] = env_list
    mount_list = list(mounts)
    if mount_list:
        found["volumeMounts"] = mount_list
    if privileged:
        found["securityContext"] = {"privileged": True}
    return found


def upsert_env(ctr: Obj, env_vars: Iterable[EnvVar] | None) -> None:
    """Apply user env after the operator's own, so users can override anything."""
    for var in env_vars or ():
        set_env(ctr, var.name, var.value or "")


def add_mount(ctr: Obj, item: Obj) -> None:
    """Add or replace (by mount path) a volume mount."""
    mounts: list[Obj] = ctr.setdefault("volumeMounts", [])
    mounts[:] = [m for m in mounts if m["mountPath"] != item["mountPath"]]
    mounts.append(item)


def main_container(ds: Obj) -> Obj:
    return containers(ds)[0]


def find_container(ds: Obj, name: str) -> Obj | None:
    for ctr in all_containers(ds):
        if ctr["name"] == name:
            return ctr
    return None


def remove_container(ds: Obj, name: str) -> None:
    spec = pod_spec(ds)
    for key in ("initContainers", "containers"):
        if key in spec:
            spec[key] = [c for c in spec[key] if c["name"] != name]


def add_volume(ds: Obj, volume: Obj) -> None:
    """Add or replace (by name) a pod volume."""
    volumes: list[Obj] = pod_spec(ds).setdefault("volumes", [])
    volumes[:] = [v for v in volumes if v["name"] != volume["name"]]
    volumes.append(volume)


def find_volume(ds: Obj, name: str) -> Obj | None:
    for volume in pod_spec(ds).get("volumes", []):
        if volume["name"] == name:
            found: Obj = volume
            return found
    return None


def add_pull_secrets(ds: Obj, names: Iterable[str] | None) -> None:
    """Add image pull secrets to the pod, each name once."""
    spec = pod_spec(ds)
    existing: list[Obj] = spec.setdefault("imagePullSecrets", [])
    seen = {s["name"] for s in existing}
    for name in names or ():
        if name and name not in seen:
            existing.append({"name": name})
            seen.add(name)
    if not existing:
        del spec["imagePullSecrets"]


RUN_NVIDIA = "/run/nvidia"


def run_nvidia_volume(kind: str | None = "Directory") -> Obj:
    """The host's /run/nvidia, which upstream's toolkit-ready waits read the status file through
    (`Directory` in most assets; the exporter's asset gives no type)."""
    return host_path("run-nvidia", RUN_NVIDIA, kind)


def toolkit_ready_init(*, what: str = "nvidia container stack", volume: str = "run-nvidia") -> Obj:
    """An init container that waits for the toolkit validation status file (reference §6).

    The wording, privileged mode and the volume read through (`run-nvidia` for /run/nvidia or
    `run-nvidia-validations`) are each operand asset's own, kept so pod templates equal
    upstream's (a different template restarts every pod when NVIDIA's DaemonSets are adopted)."""
    ready = f"{VALIDATIONS_DIR}/toolkit-ready"
    return container(
        "toolkit-validation",
        command=["sh", "-c"],
        args=[f"until [ -f {ready} ]; do echo waiting for {what} to be setup; sleep 5; done"],
        mounts=[
            mount(
                volume,
                RUN_NVIDIA if volume == "run-nvidia" else VALIDATIONS_DIR,
                propagation="HostToContainer",
            )
        ],
        privileged=True,
    )


def wait_for_file_init(name: str, paths: Sequence[str], what: str) -> Obj:
    """An init container that loops until one of `paths` exists (validator image, set later)."""
    test = " || ".join(f"[ -f {p} ]" for p in paths)
    script = f"until {test}; do echo waiting for {what}; sleep 5; done; echo {what} is ready"
    return container(
        name,
        command=["sh", "-c"],
        args=[script],
        mounts=[mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer")],
    )


def driver_validation_init(*, with_wait: bool = True, host_root_first: bool = False) -> Obj:
    """The validator's driver check, used as an init container by the toolkit and validator.

    Mount order is each asset's: the validator lists host-root first, the toolkit last but one."""
    host_root = mount("host-root", "/host", read_only=True, propagation="HostToContainer")
    mounts = [
        mount("driver-install-dir", DEFAULT_DRIVER_INSTALL_DIR, propagation="HostToContainer"),
        mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional"),
    ]
    mounts.insert(0 if host_root_first else len(mounts), host_root)
    found = container(
        "driver-validation",
        command=["sh", "-c"],
        args=["nvidia-validator"],
        env_vars=[
            env("WITH_WAIT", str(with_wait).lower()),
            env("COMPONENT", "driver"),
            namespace_env(),
        ],
        mounts=[*mounts, mount("host-dev-char", "/host-dev-char")],
        privileged=True,
    )
    found["securityContext"]["seLinuxOptions"] = {"level": "s0"}
    return found


VALIDATION_VOLUMES: tuple[Obj, ...] = (
    host_path("run-nvidia-validations", VALIDATIONS_DIR, "DirectoryOrCreate"),
)
DRIVER_VALIDATION_VOLUMES: tuple[Obj, ...] = (
    host_path("host-root", "/"),
    host_path("driver-install-dir", DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
    host_path("host-dev-char", "/dev/char"),
)


def daemonset(
    name: str,
    state: str,
    facts: ClusterFacts,
    *,
    deploy_label: str,
    service_account_name: str,
    main: Sequence[Obj],
    inits: Sequence[Obj] = (),
    volumes: Iterable[Obj] = (),
    extra_node_selector: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    part_of: str | None = None,
    host_pid: bool = False,
    host_ipc: bool = False,
) -> Obj:
    """The base DaemonSet of an operand, before the common and operand transforms.

    Selector: `app` (plus `app.kubernetes.io/part-of` when upstream selects on it); pod labels:
    the selector plus `labels`; the DaemonSet's own labels add the state label.
    """
    selector = {"app": name, **({PART_OF_LABEL: part_of} if part_of else {})}
    pod_labels = {**(labels or {}), **selector}
    node_selector = {f"{keys.DEPLOY_PREFIX}{deploy_label}": "true", **(extra_node_selector or {})}
    spec: Obj = {
        "serviceAccountName": service_account_name,
        "nodeSelector": node_selector,
        "tolerations": [dict(GPU_TOLERATION)],
        "containers": [copy.deepcopy(c) for c in main],
    }
    if inits:
        spec["initContainers"] = [copy.deepcopy(c) for c in inits]
    if host_pid:
        spec["hostPID"] = True
    if host_ipc:
        spec["hostIPC"] = True
    volume_list = [copy.deepcopy(v) for v in volumes]
    if volume_list:
        spec["volumes"] = volume_list
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(name, state, facts.namespace, pod_labels),
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "template": {"metadata": {"labels": pod_labels}, "spec": spec},
        },
    }


# --- per-operand helpers shared by several states -----------------------------------------------


def apply_image(
    ds: Obj,
    ctr: Obj,
    spec: ImageSpec | None,
    section: str,
    facts: ClusterFacts,
    *,
    image: str | None = None,
) -> None:
    """Resolve a section's image into `ctr`, with its pull policy and pull secrets."""
    ctr["image"] = image or images.resolve(spec, section, facts.operator_env)
    ctr["imagePullPolicy"] = images.pull_policy(spec.imagePullPolicy if spec else None)
    add_pull_secrets(ds, spec.imagePullSecrets if spec else None)


def apply_operand_spec(
    ds: Obj,
    spec: ContainerSpec | None,
    section: str,
    facts: ClusterFacts,
    *,
    image: str | None = None,
    host_network: bool | None = None,
) -> None:
    """The common operand fields: image, pull policy/secrets, resources, args, env, hostNetwork."""
    main = main_container(ds)
    apply_image(ds, main, spec, section, facts, image=image)
    if spec is None:
        return
    if spec.resources is not None:
        resources = spec.resources.to_dict()
        for ctr in containers(ds):
            ctr["resources"] = copy.deepcopy(resources)
    if spec.args:
        main["args"] = list(spec.args)
    upsert_env(main, spec.env)
    wants_host_network = host_network if host_network is not None else None
    if wants_host_network is None:
        wants_host_network = bool(getattr(spec, "hostNetwork", None))
    if wants_host_network:
        set_host_network(ds)


def set_host_network(ds: Obj) -> None:
    pod = pod_spec(ds)
    pod["hostNetwork"] = True
    pod["dnsPolicy"] = "ClusterFirstWithHostNet"


def runtime_class_applies(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    """Upstream leaves runtimeClassName off with NRI injection, or on CRI-O without CDI."""
    spec = policy.spec
    if enablement.nri_plugin_enabled(spec):
        return False
    return not (not enablement.is_enabled(spec, "cdi") and facts.runtime == "crio")


def apply_runtime_class(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    """runtimeClassName, or the NRI annotation per container when NRI injects GPUs instead."""
    if enablement.nri_plugin_enabled(policy.spec):
        annotations = ds["spec"]["template"]["metadata"].setdefault("annotations", {})
        for ctr in containers(ds):
            annotations[f"{NRI_ANNOTATION_PREFIX}{ctr['name']}"] = NRI_ANNOTATION_VALUE
        return
    if runtime_class_applies(policy, facts):
        pod_spec(ds)["runtimeClassName"] = policy.spec.operator.runtimeClass or "nvidia"


def apply_mig_env(ctr: Obj, policy: api.ClusterPolicy) -> None:
    """MIG_STRATEGY and NVIDIA_MIG_MONITOR_DEVICES as upstream sets them for MIG-aware operands."""
    strategy = enablement.mig_strategy(policy.spec)
    if strategy is None:
        set_env(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all")
        return
    set_env(ctr, "MIG_STRATEGY", strategy)
    if strategy != "none":
        set_env(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all")


def cdi_hook_path(policy: api.ClusterPolicy) -> str:
    return f"{policy.spec.toolkit.installDir.rstrip('/')}/toolkit/{CDI_HOOK_NAME}"


# --- the common transform pipeline --------------------------------------------------------------

OperandTransform = Callable[[Obj], None]


def finalize(
    ds: Obj,
    policy: api.ClusterPolicy,
    facts: ClusterFacts,
    operand_transform: OperandTransform,
) -> Obj:
    """Apply the common transforms around the operand's own one, in upstream's order."""
    spec = policy.spec
    _apply_update_strategy(ds, spec)
    daemonsets = spec.daemonsets
    pod = pod_spec(ds)
    if daemonsets.priorityClassName:
        pod["priorityClassName"] = daemonsets.priorityClassName
    if daemonsets.tolerations:
        pod["tolerations"] = [t.to_dict() for t in daemonsets.tolerations]
    _apply_startup_toleration(pod, facts)
    if daemonsets.podSecurityContext is not None:
        pod["securityContext"] = daemonsets.podSecurityContext.to_dict()
    _apply_host_root(ds, spec)
    _apply_driver_install_dir(ds, spec)
    operand_transform(ds)
    _apply_metadata(ds, spec)
    _apply_validation_inits(ds, policy, facts)
    # Last: containers that run our image get what our agents need (operands/builtin.py).
    builtin.apply(ds, facts)
    return ds


def _apply_update_strategy(ds: Obj, spec: api.ClusterPolicySpec) -> None:
    # The driver keeps its own OnDelete strategy: driver pods are replaced by the upgrade flow.
    if ds["metadata"]["name"].startswith("nvidia-driver-daemonset"):
        return
    daemonsets = spec.daemonsets
    if daemonsets.updateStrategy == "OnDelete":
        ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
        return
    strategy: Obj = {"type": "RollingUpdate"}
    max_unavailable = daemonsets.rollingUpdate.maxUnavailable if daemonsets.rollingUpdate else None
    if max_unavailable:
        value: int | str = int(max_unavailable) if max_unavailable.isdigit() else max_unavailable
        strategy["rollingUpdate"] = {"maxUnavailable": value}
    ds["spec"]["updateStrategy"] = strategy


def _apply_startup_toleration(pod: Obj, facts: ClusterFacts) -> None:
    """Operand pods tolerate the readiness gate's startup taint: they must run on a new node to
    validate it, while workloads wait for the operator to remove the taint (nodes/gate.py)."""
    wanted = facts.startup_toleration
    if not wanted:
        return
    tolerations: list[Obj] = pod.setdefault("tolerations", [])
    for have in tolerations:
        key_ok = have.get("key") == wanted["key"] or (
            not have.get("key") and have.get("operator") == "Exists"
        )
        if key_ok and have.get("effect") in (None, "", wanted["effect"]):
            return  # already tolerated (a user toleration, or everything)
    tolerations.append(dict(wanted))


def _apply_host_root(ds: Obj, spec: api.ClusterPolicySpec) -> None:
    root = enablement.host_paths(spec).rootFS
    if not root or root == "/":
        return
    for volume in pod_spec(ds).get("volumes", []):
        if volume["name"] == "host-root" and "hostPath" in volume:
            volume["hostPath"]["path"] = root
        elif volume["name"] == "host-dev-char" and "hostPath" in volume:
            volume["hostPath"]["path"] = f"{root.rstrip('/')}/dev/char"
    for ctr in all_containers(ds):
        set_env(ctr, "HOST_ROOT", root)


def _apply_driver_install_dir(ds: Obj, spec: api.ClusterPolicySpec) -> None:
    install_dir = enablement.host_paths(spec).driverInstallDir
    if not install_dir or install_dir == DEFAULT_DRIVER_INSTALL_DIR:
        return
    volume = find_volume(ds, "driver-install-dir")
    if volume is None or "hostPath" not in volume:
        return
    volume["hostPath"]["path"] = install_dir
    validation = find_container(ds, "driver-validation")
    if validation is not None:
        set_env(validation, "DRIVER_INSTALL_DIR", install_dir)
        set_env(validation, "DRIVER_INSTALL_DIR_CTR_PATH", install_dir)
        for item in validation.get("volumeMounts", []):
            if item["name"] == "driver-install-dir":
                item["mountPath"] = install_dir


def _apply_metadata(ds: Obj, spec: api.ClusterPolicySpec) -> None:
    daemonsets = spec.daemonsets
    user_labels = {
        k: v for k, v in (daemonsets.labels or {}).items() if k not in _RESERVED_POD_LABELS
    }
    template_meta = ds["spec"]["template"]["metadata"]
    for target in (template_meta, ds["metadata"]):
        if user_labels:
            target.setdefault("labels", {}).update(user_labels)
        if daemonsets.annotations:
            target.setdefault("annotations", {}).update(daemonsets.annotations)


def _apply_validation_inits(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    inits = [c for c in init_containers(ds) if "validation" in c["name"]]
    if not inits:
        if not init_containers(ds):
            pod_spec(ds).pop("initContainers", None)
        return
    validator = policy.spec.validator
    image = images.resolve(validator, "validator", facts.operator_env)
    for ctr in inits:
        ctr["image"] = image
        ctr["imagePullPolicy"] = images.pull_policy(
            validator.imagePullPolicy if validator else None
        )
        ctr.setdefault("securityContext", {})["runAsUser"] = 0
        if validator is not None and validator.resources is not None:
            ctr["resources"] = validator.resources.to_dict()
        component = {"driver-validation": "driver", "toolkit-validation": "toolkit"}.get(
            ctr["name"]
        )
        if component and validator is not None:
            section = getattr(validator, component)
            upsert_env(ctr, section.env if section else None)
    add_pull_secrets(ds, validator.imagePullSecrets if validator else None)
