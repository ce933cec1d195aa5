"""State `state-driver`: the driver DaemonSet (one per kernel with precompiled drivers)."""

from __future__ import annotations

import functools
import re
from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement, images, keys
from gpu_operator.api.clusterpolicy import DriverSpec
from gpu_operator.api.core_types import ContainerProbeSpec, DriverManagerSpec
from gpu_operator.operands import common, driver_digest
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-driver"
DS_NAME = "nvidia-driver-daemonset"
SA_NAME = "nvidia-driver"
DRIVER_CTR = "nvidia-driver-ctr"
MANAGER_CTR = "k8s-driver-manager"
PEERMEM_CTR = "nvidia-peermem-ctr"
GDS_CTR = "nvidia-fs-ctr"
GDRCOPY_CTR = "nvidia-gdrcopy-ctr"
COMPONENT = "nvidia-driver"
COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_READY = f"{common.VALIDATIONS_DIR}/.driver-ctr-ready"
# Where the driver container reports its daemons (fabric manager, ...): `Ready` once they run.
DAEMONS_STATUS = f"{common.VALIDATIONS_DIR}/.driver-daemons-status"
# kubectl logs/exec pick the driver container without -c (upstream's pod annotation).
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

# Upstream ships the driver container's startup probe as a script in this ConfigMap, mounted
# into the driver container (volume `driver-startup-probe-script`, key `startup-probe.sh`).
STARTUP_PROBE_CM = "nvidia-driver-startup-probe"
STARTUP_PROBE_KEY = "startup-probe.sh"
STARTUP_PROBE_VOLUME = "driver-startup-probe-script"
STARTUP_PROBE_PATH = f"/usr/local/bin/{STARTUP_PROBE_KEY}"
# Upstream's probe semantics, in our words: not ready until the nvidia module is loaded (so that
# nvidia-smi never loads it with default parameters), the daemons the driver container starts
# report `Ready` (when it reports them at all) and nvidia-smi answers; then the ready file
# is written in one step, listing which optional parts this pod enabled, for the validator.
STARTUP_PROBE_SCRIPT = f"""#!/bin/sh
# Startup probe of the driver container (rendered by the GPU operator).
set -eu
ready="{DRIVER_READY}"
mkdir -p "$(dirname "$ready")"
if [ ! -f /sys/module/nvidia/refcnt ]; then
  echo "the nvidia kernel module is not loaded yet"
  exit 1
fi
status="{DAEMONS_STATUS}"
if [ -f "$status" ] && [ "$(cat "$status")" != "Ready" ]; then
  echo "the driver's daemons are not ready yet: $(cat "$status")"
  exit 1
fi
if ! nvidia-smi; then
  echo "nvidia-smi does not answer yet"
  exit 1
fi
{{
  echo "GDRCOPY_ENABLED: ${{GDRCOPY_ENABLED:-false}}"
  echo "GDS_ENABLED: ${{GDS_ENABLED:-false}}"
  echo "GPU_DIRECT_RDMA_ENABLED: ${{GPU_DIRECT_RDMA_ENABLED:-false}}"
}} > "$ready.tmp"
mv "$ready.tmp" "$ready"
"""

# Upstream's startup probe defaults; precompiled drivers start quickly (no build).
STARTUP_DEFAULTS = {
    "initialDelaySeconds": 60,
    "timeoutSeconds": 60,
    "periodSeconds": 10,
    "failureThreshold": 120,
}
PRECOMPILED_INITIAL_DELAY = 5

# Where the package manager of each distribution reads repository files and trusted certs.
_REPO_DIRS = {
    "ubuntu": "/etc/apt/sources.list.d",
    "debian": "/etc/apt/sources.list.d",
    "rhel": "/etc/yum.repos.d",
    "rocky": "/etc/yum.repos.d",
    "centos": "/etc/yum.repos.d",
    "ol": "/etc/yum.repos.d",
    "amzn": "/etc/yum.repos.d",
    "fedora": "/etc/yum.repos.d",
    "sles": "/etc/zypp/repos.d",
    "sl-micro": "/etc/zypp/repos.d",
}
_CERT_DIRS = {
    "ubuntu": "/usr/local/share/ca-certificates",
    "debian": "/usr/local/share/ca-certificates",
    "rhel": "/etc/pki/ca-trust/extracted/pem",
    "rocky": "/etc/pki/ca-trust/extracted/pem",
    "centos": "/etc/pki/ca-trust/extracted/pem",
    "ol": "/etc/pki/ca-trust/extracted/pem",
    "amzn": "/etc/pki/ca-trust/extracted/pem",
    "fedora": "/etc/pki/ca-trust/extracted/pem",
    "sles": "/etc/pki/trust/anchors",
    "sl-micro": "/etc/pki/trust/anchors",
}
GRIDD_CONF = "gridd.conf"
NLS_TOKEN = "client_configuration_token.tok"
TOPOLOGY_PATH = "/etc/nvidia/nvidia-topologyd.conf"
TOPOLOGY_KEY = "virtual-topology.conf"


def crd_mode(policy: api.ClusterPolicy) -> bool:
    """NVIDIADriver objects own the driver; the ClusterPolicy hands its driver states over."""
    return bool(policy.spec.driver.useNvidiaDriverCRD)


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "driver") and not crd_mode(policy)


def sanitize_kernel(kernel: str) -> str:
    """A kernel version as it appears in DaemonSet names and label values."""
    name = re.sub(r"[.-]?(x86_64|aarch64)(_64k)?", "", kernel)
    # Names and label values must end with an alphanumeric character.
    name = name.replace("_", ".").rstrip(".-")
    return name.lower()


def startup_probe_config_map(facts: ClusterFacts, state: str = NAME) -> Obj:
    """The ConfigMap holding the driver container's startup probe script."""
    cm = common.config_map(
        STARTUP_PROBE_CM, state, facts, {STARTUP_PROBE_KEY: STARTUP_PROBE_SCRIPT}
    )
    cm["metadata"]["labels"].update({"app": DS_NAME, COMPONENT_LABEL: COMPONENT})
    return cm


def anti_affinity(components: list[str]) -> Obj:
    """At most one driver pod per node, whichever DaemonSet it belongs to (upstream's rule)."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": COMPONENT_LABEL, "operator": "In", "values": components}
                        ]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


def rbac(facts: ClusterFacts, name: str, state: str) -> list[Obj]:
    """The driver manager evicts GPU pods and pauses operands through node labels."""
    return common.rbac(
        name,
        state,
        facts,
        # Upstream's ClusterRole: the driver manager reads the OpenShift version (inert
        # elsewhere), labels and cordons nodes, evicts GPU pods (resolving their DRA claims to
        # find them) and reads the driver DaemonSet.
        cluster_rules=[
            common.rule(["config.openshift.io"], ["clusterversions"], ("get", "list")),
            common.rule([""], ["nodes"], ("get", "list", "patch", "update", "watch")),
            common.rule([""], ["pods"], common.READ),
            common.rule([""], ["pods/eviction"], ("create",)),
            common.rule(["resource.k8s.io"], ["resourceclaims"], ("get", "list")),
            common.rule(["apps"], ["daemonsets"], ("get",)),
        ],
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule([""], ["configmaps", "secrets"], common.READ),
            # Ours: the driver manager records its decisions (pause, eviction refused, preinstalled
            # driver) as Events on the Node, written in the operator namespace.
            common.rule([""], ["events"], ("create",)),
        ],
    )


def manager_init(
    ds: Obj,
    manager: DriverManagerSpec | None,
    facts: ClusterFacts,
    *,
    evict: bool,
    rdma: tuple[bool, bool] = (False, False),
) -> None:
    """Fill the k8s-driver-manager init container (image, RDMA flags, user env last)."""
    ctr = common.find_container(ds, MANAGER_CTR)
    if ctr is None:
        return
    common.apply_image(ds, ctr, manager, "driverManager", facts)
    set_env(ctr, "ENABLE_GPU_POD_EVICTION", str(evict).lower())
    set_env(ctr, "ENABLE_AUTO_DRAIN", "false")
    rdma_enabled, host_mofed = rdma
    if rdma_enabled:
        set_env(ctr, "GPU_DIRECT_RDMA_ENABLED", "true")
        if host_mofed:
            set_env(ctr, "USE_HOST_MOFED", "true")
    common.upsert_env(ctr, manager.env if manager else None)


def manager_container() -> Obj:
    return container(
        MANAGER_CTR,
        command=["driver-manager"],
        args=["uninstall_driver"],
        env_vars=[
            common.node_name_env(),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("ENABLE_GPU_POD_EVICTION", "true"),
            env("ENABLE_AUTO_DRAIN", "false"),
            env("DRAIN_USE_FORCE", "false"),
            # Unset (no value), as upstream's asset leaves it.
            {"name": "DRAIN_POD_SELECTOR_LABEL"},
            env("DRAIN_TIMEOUT_SECONDS", "0s"),
            env("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
            common.namespace_env(),
        ],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
            mount("host-sys", "/sys"),
            mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer"),
        ],
        privileged=True,
    )


def _driver_container() -> Obj:
    ctr = container(
        DRIVER_CTR,
        command=["nvidia-driver"],
        args=["init"],
        env_vars=[common.node_name_env(), common.field_env("NODE_IP", "status.hostIP")],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
            mount("run-nvidia-topologyd", "/run/nvidia-topologyd"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount("host-os-release", "/host-etc/os-release", read_only=True),
            mount(
                "mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", propagation="HostToContainer"
            ),
            mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer"),
            # The whole of /sys/devices/system (memory blocks, CPU topology), as upstream mounts it.
            mount("host-sys-devices-system", "/sys/devices/system"),
            mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            mount("nv-firmware", "/lib/firmware"),
            {**mount(STARTUP_PROBE_VOLUME, STARTUP_PROBE_PATH), "subPath": STARTUP_PROBE_KEY},
        ],
        privileged=True,
    )
    ctr["securityContext"]["seLinuxOptions"] = {"level": "s0"}
    ctr["lifecycle"] = {
        "preStop": {
            "exec": {"command": ["/bin/sh", "-c", f"rm -f {DRIVER_READY} {DAEMONS_STATUS}"]}
        }
    }
    return ctr


def _probe_command() -> list[str]:
    return ["sh", STARTUP_PROBE_PATH]


def _sidecar(name: str, command: str, args: list[str], extra: list[Obj] | None = None) -> Obj:
    return container(
        name,
        command=[command],
        args=args,
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log", read_only=True),
            *(extra or []),
        ],
        privileged=True,
    )


def _volumes() -> list[Obj]:
    return [
        host_path("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
        host_path("var-log", "/var/log"),
        host_path("dev-log", "/dev/log"),
        host_path("host-os-release", "/etc/os-release"),
        host_path("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager", "DirectoryOrCreate"),
        host_path("run-nvidia-topologyd", "/run/nvidia-topologyd", "DirectoryOrCreate"),
        host_path("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", "DirectoryOrCreate"),
        host_path("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
        host_path("run-nvidia-validations", common.VALIDATIONS_DIR, "DirectoryOrCreate"),
        host_path("host-root", "/"),
        host_path("host-sys", "/sys", "Directory"),
        host_path("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        host_path("host-sys-devices-system", "/sys/devices/system", "Directory"),
        host_path("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
        {
            "name": STARTUP_PROBE_VOLUME,
            "configMap": {"name": STARTUP_PROBE_CM, "defaultMode": 0o755},
        },
    ]


def probe(defaults: dict[str, int], override: ContainerProbeSpec | None) -> Obj:
    """An exec probe from defaults; non-zero override values win, as upstream applies them."""
    found: Obj = {"exec": {"command": _probe_command()}, **defaults}
    if override is not None:
        for key, value in override.to_dict().items():
            if value:
                found[key] = value
    return found


def config_digest(ds: Obj) -> str:
    """`DRIVER_CONFIG_DIGEST` of a rendered ClusterPolicy driver DaemonSet, as NVIDIA's operator
    computes it from the finished pod (see operands/driver_digest.py for what counts)."""
    return driver_digest.digest(common.pod_spec(ds))


def mount_config_map_files(
    ds: Obj,
    ctr: Obj,
    facts: ClusterFacts,
    *,
    volume: str,
    config_map: str,
    target_dir: str,
    field: str,
) -> None:
    """Mount every key of a ConfigMap as a file in `target_dir` (the directory keeps its files).

    Offline, a ConfigMap `render` was not given has unknown keys: its volume is rendered without
    the file mounts (validate_refs warns that it was not given)."""
    if config_map not in facts.config_map_keys and not facts.config_maps_complete:
        common.add_volume(ds, {"name": volume, "configMap": {"name": config_map}})
        return
    if config_map not in facts.config_map_keys:
        raise common.RenderError(
            f"{field}: ConfigMap {config_map!r} not found in namespace {facts.namespace!r}"
        )
    common.add_volume(ds, {"name": volume, "configMap": {"name": config_map}})
    for key in facts.config_map_keys[config_map]:
        item = mount(volume, f"{target_dir.rstrip('/')}/{key}", read_only=True)
        item["subPath"] = key
        common.add_mount(ctr, item)


def _driver_configs(ds: Obj, ctr: Obj, driver: DriverSpec, facts: ClusterFacts) -> None:
    os_id = facts.os_id or ""
    if driver.repoConfig and driver.repoConfig.configMapName:
        if os_id not in _REPO_DIRS:
            raise common.RenderError(
                f"spec.driver.repoConfig: no package repository directory known for OS {os_id!r}"
            )
        mount_config_map_files(
            ds,
            ctr,
            facts,
            volume="repo-config",
            config_map=driver.repoConfig.configMapName,
            target_dir=_REPO_DIRS[os_id],
            field="spec.driver.repoConfig.configMapName",
        )
    if driver.certConfig and driver.certConfig.name:
        if os_id not in _CERT_DIRS:
            raise common.RenderError(
                f"spec.driver.certConfig: no certificate directory known for OS {os_id!r}"
            )
        mount_config_map_files(
            ds,
            ctr,
            facts,
            volume="cert-config",
            config_map=driver.certConfig.name,
            target_dir=_CERT_DIRS[os_id],
            field="spec.driver.certConfig.name",
        )
    if driver.kernelModuleConfig and driver.kernelModuleConfig.name:
        mount_config_map_files(
            ds,
            ctr,
            facts,
            volume="kernel-module-configs",
            config_map=driver.kernelModuleConfig.name,
            target_dir="/drivers",
            field="spec.driver.kernelModuleConfig.name",
        )
    licensing = driver.licensingConfig
    if licensing and (licensing.secretName or licensing.configMapName):
        items = [{"key": GRIDD_CONF, "path": GRIDD_CONF}]
        if licensing.nlsEnabled:
            items.append({"key": NLS_TOKEN, "path": NLS_TOKEN})
        source: Obj
        if licensing.secretName:
            source = {"secret": {"secretName": licensing.secretName, "items": items}}
        else:
            source = {"configMap": {"name": licensing.configMapName, "items": items}}
        common.add_volume(ds, {"name": "licensing-config", **source})
        conf = mount("licensing-config", f"/drivers/{GRIDD_CONF}", read_only=True)
        conf["subPath"] = GRIDD_CONF
        common.add_mount(ctr, conf)
        if licensing.nlsEnabled:
            token = mount(
                "licensing-config", f"/drivers/ClientConfigToken/{NLS_TOKEN}", read_only=True
            )
            token["subPath"] = NLS_TOKEN
            common.add_mount(ctr, token)
    topology = driver.virtualTopology
    if topology and topology.config:
        common.add_volume(
            ds,
            {
                "name": "topology-config",
                "configMap": {
                    "name": topology.config,
                    "items": [{"key": TOPOLOGY_KEY, "path": TOPOLOGY_KEY}],
                },
            },
        )
        item = mount("topology-config", TOPOLOGY_PATH, read_only=True)
        item["subPath"] = TOPOLOGY_KEY
        common.add_mount(ctr, item)
    if driver.secretEnv:
        ctr["envFrom"] = [{"secretRef": {"name": driver.secretEnv}}]


def _transform(
    ds: Obj,
    policy: api.ClusterPolicy,
    facts: ClusterFacts,
    *,
    image: str,
    precompiled: bool,
) -> None:
    spec = policy.spec
    driver = spec.driver
    ctr = common.find_container(ds, DRIVER_CTR)
    assert ctr is not None
    common.apply_operand_spec(ds, driver, "driver", facts, image=image)
    rdma = enablement.rdma_enabled(spec)
    host_mofed = bool(rdma and driver.rdma and driver.rdma.useHostMofed)
    manager_init(ds, driver.manager, facts, evict=True, rdma=(rdma, host_mofed))

    kernel_module_type = driver.kernelModuleType
    if driver.useOpenKernelModules:
        kernel_module_type = "open"
        set_env(ctr, "OPEN_KERNEL_MODULES_ENABLED", "true")
    set_env(ctr, "KERNEL_MODULE_TYPE", kernel_module_type)

    startup = dict(STARTUP_DEFAULTS)
    if precompiled:
        startup["initialDelaySeconds"] = PRECOMPILED_INITIAL_DELAY
    ctr["startupProbe"] = probe(startup, driver.startupProbe)
    # Liveness/readiness exist only when asked for; they reuse the startup check.
    probe_defaults = {"timeoutSeconds": 60, "periodSeconds": 10, "failureThreshold": 3}
    if driver.livenessProbe is not None:
        ctr["livenessProbe"] = probe(probe_defaults, driver.livenessProbe)
    if driver.readinessProbe is not None:
        ctr["readinessProbe"] = probe(probe_defaults, driver.readinessProbe)

    if rdma:
        set_env(ctr, "GPU_DIRECT_RDMA_ENABLED", "true")
        peermem = common.find_container(ds, PEERMEM_CTR)
        assert peermem is not None
        peermem["image"] = image
        peermem["imagePullPolicy"] = ctr["imagePullPolicy"]
        set_env(peermem, "GPU_DIRECT_RDMA_ENABLED", "true")
        if host_mofed:
            set_env(ctr, "USE_HOST_MOFED", "true")
            set_env(peermem, "USE_HOST_MOFED", "true")
            # With the host's MOFED its sources live in the host's /usr/src.
            volume = common.find_volume(ds, "mlnx-ofed-usr-src")
            assert volume is not None
            volume["hostPath"]["path"] = "/usr/src"
    else:
        common.remove_container(ds, PEERMEM_CTR)

    tag = facts.os_tag or ""
    sidecars = (("gds", GDS_CTR, "GDS_ENABLED"), ("gdrcopy", GDRCOPY_CTR, "GDRCOPY_ENABLED"))
    for section, name, flag in sidecars:
        if not enablement.is_enabled(spec, section):
            common.remove_container(ds, name)
            continue
        if precompiled and section == "gds":
            raise common.RenderError(
                "spec.gds.enabled: GPUDirect Storage (nvidia-fs) cannot be used with "
                "precompiled drivers (spec.driver.usePrecompiled)"
            )
        sidecar_spec = getattr(spec, section)
        sidecar = common.find_container(ds, name)
        assert sidecar is not None
        path = images.resolve(sidecar_spec, section, facts.operator_env)
        common.apply_image(
            ds, sidecar, sidecar_spec, section, facts, image=images.driver_image(path, tag)
        )
        if sidecar_spec is not None:
            if sidecar_spec.args:
                sidecar["args"] = list(sidecar_spec.args)
            common.upsert_env(sidecar, sidecar_spec.env)
        # The sidecars build their modules like the driver does, with the same secret env.
        if driver.secretEnv:
            sidecar["envFrom"] = [{"secretRef": {"name": driver.secretEnv}}]
        set_env(ctr, flag, "true")

    _driver_configs(ds, ctr, driver, facts)

    # Last, as upstream: the digest covers the pod as every transform above left it.
    digest = config_digest(ds)
    for name in (MANAGER_CTR, DRIVER_CTR):
        target = common.find_container(ds, name)
        if target is not None:
            set_env(target, driver_digest.ENV_NAME, digest)


def _base(
    facts: ClusterFacts,
    name: str,
    extra_selector: dict[str, str],
    labels: dict[str, str],
    service_account: str = SA_NAME,
) -> Obj:
    main = [
        _driver_container(),
        _sidecar(PEERMEM_CTR, "nvidia-driver", ["reload_nvidia_peermem"]),
        _sidecar(GDS_CTR, "nvidia-gds-driver", ["start"]),
        _sidecar(GDRCOPY_CTR, "nvidia-gdrcopy-driver", ["start"]),
    ]
    ds = common.daemonset(
        name,
        NAME,
        facts,
        deploy_label="driver",
        service_account_name=service_account,
        main=main,
        inits=[manager_container()],
        volumes=_volumes(),
        extra_node_selector=extra_selector,
        labels=labels,
        host_pid=True,
    )
    # The driver is replaced node by node through the upgrade flow, never by a rolling update.
    ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    template = ds["spec"]["template"]
    template["metadata"]["annotations"] = {DEFAULT_CONTAINER_ANNOTATION: DRIVER_CTR}
    # A new driver pod never starts beside another driver pod on its node.
    template["spec"]["affinity"] = anti_affinity([COMPONENT])
    return ds


def daemonset(
    policy: api.ClusterPolicy,
    facts: ClusterFacts,
    *,
    name: str,
    image: str,
    precompiled: bool,
    extra_selector: dict[str, str],
    labels: dict[str, str],
    service_account: str = SA_NAME,
) -> Obj:
    """One driver DaemonSet: the base pod, the common transforms and the driver's own."""
    ds = _base(facts, name, extra_selector, labels, service_account)
    return common.finalize(
        ds,
        policy,
        facts,
        functools.partial(
            _transform, policy=policy, facts=facts, image=image, precompiled=precompiled
        ),
    )


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """RBAC, then one DaemonSet (or one per kernel with precompiled drivers)."""
    tag = facts.os_tag
    if tag is None:
        raise common.RenderError(
            "the driver image needs the GPU nodes' OS: no node carries the NFD labels "
            f"{keys.NFD_OS_ID} and {keys.NFD_OS_VERSION_ID}"
        )
    path = images.resolve(policy.spec.driver, "driver", facts.operator_env)
    objects: list[Obj] = [*rbac(facts, SA_NAME, NAME), startup_probe_config_map(facts)]
    component = {COMPONENT_LABEL: COMPONENT}
    if not policy.spec.driver.usePrecompiled:
        objects.append(
            daemonset(
                policy,
                facts,
                name=DS_NAME,
                image=images.driver_image(path, tag),
                precompiled=False,
                extra_selector={},
                labels={**component, keys.PRECOMPILED: "false"},
            )
        )
        return objects
    for kernel in sorted(set(facts.kernels)):
        name = f"{DS_NAME}-{sanitize_kernel(kernel)}-{tag}"
        labels = {**component, keys.PRECOMPILED: "true"}
        ds = _base(facts, name, {keys.NFD_KERNEL_FULL: kernel}, labels)
        # As upstream: every per-kernel DaemonSet keeps the name, selector and pod label
        # `app: nvidia-driver-daemonset` (selectors overlap; pods are told apart by their
        # controller reference, and each DaemonSet's nodeSelector names its kernel).
        _share_app_label(ds)
        image = images.precompiled_driver_image(path, kernel, tag)
        objects.append(
            common.finalize(
                ds,
                policy,
                facts,
                functools.partial(
                    _transform, policy=policy, facts=facts, image=image, precompiled=True
                ),
            )
        )
    return objects


def _share_app_label(ds: Obj) -> None:
    ds["metadata"]["labels"]["app"] = DS_NAME
    ds["spec"]["template"]["metadata"]["labels"]["app"] = DS_NAME
    ds["spec"]["selector"] = {"matchLabels": {"app": DS_NAME}}
