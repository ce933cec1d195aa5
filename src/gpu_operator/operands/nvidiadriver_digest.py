"""`DRIVER_CONFIG_DIGEST` of an NVIDIADriver pool, computed as NVIDIA's operator (26.x) computes it
for NVIDIADriver DaemonSets, so that its pods and ours carry the same number for the same driver.

Upstream fills the same "install state" as for a ClusterPolicy driver (operands/driver_digest.py:
hashed text, go-spew renderings, 32-bit FNV-1a in decimal) but from a different source: not the
finished pod, the NVIDIADriver's spec and the pool's resolved images. So more fields can be set
(driver type, kernel module type, the precompiled kernel, the names of the repo, cert, kernel
module, licensing and topology configs) and fewer volumes count: only the config volumes upstream
adds for the pool (repo and cert ConfigMaps, host subscriptions, kernel module parameters, vGPU
licensing and topology), not the pod's fixed ones. The same driver therefore has a different
digest under a ClusterPolicy and under an NVIDIADriver, as upstream's does; the hand-over between
them compares pod templates, not digests (docs/nvidiadriver.md).
"""

from __future__ import annotations

import dataclasses
import os.path
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.operands import driver_digest
from gpu_operator.operands.driver_digest import go_bool, go_string, go_strings, go_structs

Obj = dict[str, Any]
EnvPair = tuple[str, str]
# (name, ConfigMap name, Secret name, host path)
VolumeRef = tuple[str, str, str, str]
# (name, mount path, subPath, read only)
MountRef = tuple[str, str, str, bool]


@dataclass(frozen=True)
class InstallState:
    """What decides the installed driver, field for field as upstream hashes it."""

    driver_image: str = ""
    driver_manager_image: str = ""
    peermem_image: str = ""
    gds_image: str = ""
    gdrcopy_image: str = ""
    driver_type: str = ""
    kernel_module_type: str = ""
    driver_args: tuple[str, ...] = ()
    driver_env: tuple[EnvPair, ...] = ()
    manager_env: tuple[EnvPair, ...] = ()
    gds_env: tuple[EnvPair, ...] = ()
    gdrcopy_env: tuple[EnvPair, ...] = ()
    secret_env_source: str = ""
    gpu_direct_rdma_enabled: bool = False
    use_host_mofed: bool = False
    gds_enabled: bool = False
    gdrcopy_enabled: bool = False
    licensing_config_name: str = ""
    virtual_topology_config: str = ""
    kernel_module_config: str = ""
    repo_config: str = ""
    cert_config: str = ""
    use_precompiled: bool = False
    kernel_version: str = ""
    volumes: tuple[VolumeRef, ...] = ()
    volume_mounts: tuple[MountRef, ...] = ()
    host_root: str = ""

    def text(self) -> str:
        """The bytes upstream hashes: non-empty fields as `<GoName>:<spew value>`, name order."""
        parts = []
        for go_name, attr in sorted(_GO_NAMES.items()):
            value = getattr(self, attr)
            if value in ("", False, ()):
                continue
            parts.append(f"{go_name}:{_SPEW[attr](value)}")
        return "".join(parts)

    def digest(self) -> str:
        return str(driver_digest.fnv1a_32(self.text().encode()))


# Upstream's field names: they decide the order and are part of the hashed text. (Its OpenShift
# fields, DTK image and proxies, stay empty here: Driver Toolkit pools are not implemented.)
_GO_NAMES = {
    "AdditionalVolumeMounts": "volume_mounts",
    "AdditionalVolumes": "volumes",
    "CertConfig": "cert_config",
    "DriverArgs": "driver_args",
    "DriverEnv": "driver_env",
    "DriverImage": "driver_image",
    "DriverManagerImage": "driver_manager_image",
    "DriverType": "driver_type",
    "GDRCopyEnabled": "gdrcopy_enabled",
    "GDRCopyEnv": "gdrcopy_env",
    "GDRCopyImage": "gdrcopy_image",
    "GDSEnabled": "gds_enabled",
    "GDSEnv": "gds_env",
    "GDSImage": "gds_image",
    "GPUDirectRDMAEnabled": "gpu_direct_rdma_enabled",
    "HostRoot": "host_root",
    "KernelModuleConfig": "kernel_module_config",
    "KernelModuleType": "kernel_module_type",
    "KernelVersion": "kernel_version",
    "LicensingConfigName": "licensing_config_name",
    "ManagerEnv": "manager_env",
    "PeermemImage": "peermem_image",
    "RepoConfig": "repo_config",
    "SecretEnvSource": "secret_env_source",
    "UseHostMOFED": "use_host_mofed",
    "UsePrecompiled": "use_precompiled",
    "VirtualTopologyConfig": "virtual_topology_config",
}
assert set(_GO_NAMES.values()) == {f.name for f in dataclasses.fields(InstallState)}


def _envs(values: Sequence[EnvPair]) -> str:
    rows = ([("Name", go_string(n)), ("Value", go_string(v))] for n, v in values)
    return go_structs("EnvVar", rows)


def _volumes(values: Sequence[VolumeRef]) -> str:
    rows = (
        [("Name", go_string(n)), ("ConfigMapName", go_string(c)), ("SecretName", go_string(s)),
         ("HostPath", go_string(h))]
        for n, c, s, h in values
    )  # fmt: skip
    return go_structs("VolumeConfig", rows)


def _mounts(values: Sequence[MountRef]) -> str:
    rows = (
        [("Name", go_string(n)), ("MountPath", go_string(p)), ("SubPath", go_string(s)),
         ("ReadOnly", go_bool(r))]
        for n, p, s, r in values
    )  # fmt: skip
    return go_structs("VolumeMountConfig", rows)


_BY_TYPE = {
    "str": go_string,
    "bool": go_bool,
    "tuple[str, ...]": go_strings,
    "tuple[EnvPair, ...]": _envs,
    "tuple[VolumeRef, ...]": _volumes,
    "tuple[MountRef, ...]": _mounts,
}
_SPEW: dict[str, Any] = {f.name: _BY_TYPE[str(f.type)] for f in dataclasses.fields(InstallState)}


def env_pairs(env: Iterable[Mapping[str, Any]] | None) -> tuple[EnvPair, ...]:
    """An API object's env list as upstream copies it (every entry's name and value), by name."""
    pairs = [(str(e.get("name", "")), str(e.get("value") or "")) for e in env or ()]
    return tuple(sorted(pairs, key=lambda p: p[0]))


def volume_refs(volumes: Iterable[Mapping[str, Any]]) -> tuple[VolumeRef, ...]:
    refs = [
        (
            str(v.get("name", "")),
            str((v.get("configMap") or {}).get("name") or ""),
            str((v.get("secret") or {}).get("secretName") or ""),
            str((v.get("hostPath") or {}).get("path") or ""),
        )
        for v in volumes
    ]
    return tuple(sorted(refs, key=lambda r: r[0]))


def mount_refs(mounts: Iterable[Mapping[str, Any]]) -> tuple[MountRef, ...]:
    refs = [
        (
            str(m.get("name", "")),
            str(m.get("mountPath", "")),
            str(m.get("subPath") or ""),
            bool(m.get("readOnly", False)),
        )
        for m in mounts
    ]
    return tuple(sorted(refs, key=lambda r: (r[0], r[1])))


# ----- the config volumes upstream adds to a pool ------------------------------------------------

# Where upstream mounts a pool's repo and cert ConfigMaps, by OS ID (an OS it does not list gets
# none of its config volumes, as upstream's render logs an error and drops them all).
REPO_DIRS = {
    "centos": "/etc/yum.repos.d",
    "debian": "/etc/apt/sources.list.d",
    "ubuntu": "/etc/apt/sources.list.d",
    "rhcos": "/etc/yum.repos.d",
    "rhel": "/etc/yum.repos.d",
    "rocky": "/etc/yum.repos.d",
    "ol": "/etc/yum.repos.d",
    "sles": "/etc/zypp/repos.d",
    "sl-micro": "/etc/zypp/repos.d",
}
CERT_DIRS = {
    "centos": "/etc/pki/ca-trust/extracted/pem",
    "debian": "/usr/local/share/ca-certificates",
    "ubuntu": "/usr/local/share/ca-certificates",
    "rhcos": "/etc/pki/ca-trust/extracted/pem",
    "rhel": "/etc/pki/ca-trust/extracted/pem",
    "rocky": "/etc/pki/ca-trust/extracted/pem",
    "ol": "/etc/pki/ca-trust/extracted/pem",
    "sles": "/etc/pki/trust/anchors",
    "sl-micro": "/etc/pki/trust/anchors",
}
# Host subscription paths (mount path -> host path), for RHEL outside OpenShift and CRI-O, and SLES.
_RHEL_SUBSCRIPTIONS = {
    "/run/secrets/etc-pki-entitlement": "/etc/pki/entitlement",
    "/run/secrets/redhat.repo": "/etc/yum.repos.d/redhat.repo",
    "/run/secrets/rhsm": "/etc/rhsm",
}
_SLES_SUBSCRIPTIONS = {
    "/etc/zypp/credentials.d": "/etc/zypp/credentials.d",
    "/etc/SUSEConnect": "/etc/SUSEConnect",
}
SUBSCRIPTIONS = {
    "rhel": _RHEL_SUBSCRIPTIONS,
    "sles": _SLES_SUBSCRIPTIONS,
    "sl-micro": _SLES_SUBSCRIPTIONS,
}
GRIDD_CONF_PATH = "/drivers/gridd.conf"
NLS_TOKEN_PATH = "/drivers/ClientConfigToken/client_configuration_token.tok"
TOPOLOGY_PATH = "/etc/nvidia/nvidia-topologyd.conf"


@dataclass(frozen=True)
class PoolConfigs:
    """The config volumes and driver-container mounts upstream adds to one pool."""

    volumes: tuple[Obj, ...] = ()
    mounts: tuple[Obj, ...] = ()


def _name(ref: Any) -> str:
    return str(getattr(ref, "name", None) or "") if ref is not None else ""


def pool_configs(
    spec: Any,
    *,
    os_id: str,
    precompiled: bool,
    runtime: str,
    config_map_keys: Mapping[str, Sequence[str]],
) -> PoolConfigs:
    """Upstream's config volumes of a pool: repo/cert ConfigMaps and host subscriptions (not for
    precompiled drivers), kernel module parameters, vGPU licensing and topology."""
    volumes: list[Obj] = []
    mounts: list[Obj] = []

    def config_map_files(name: str, directory: str) -> None:
        for key in sorted(config_map_keys.get(name, ())):
            path = os.path.join(directory, key)
            mounts.append({"name": name, "mountPath": path, "subPath": key, "readOnly": True})
        volumes.append({"name": name, "configMap": {"name": name}})

    repo = _name(spec.repoConfig)
    cert = _name(spec.certConfig)
    if not precompiled:
        if (repo and os_id not in REPO_DIRS) or (cert and os_id not in CERT_DIRS):
            return PoolConfigs()
        if repo:
            config_map_files(repo, REPO_DIRS[os_id])
        if cert:
            config_map_files(cert, CERT_DIRS[os_id])
        if (os_id == "rhel" and runtime != "crio") or os_id in ("sles", "sl-micro"):
            # A RHEL repo ConfigMap replaces the host's subscription (air-gapped installs).
            paths = {} if (repo and os_id == "rhel") else SUBSCRIPTIONS[os_id]
            for number, mount_path in enumerate(sorted(paths)):
                name = f"subscription-config-{number}"
                mounts.append({"name": name, "mountPath": mount_path, "readOnly": True})
                volumes.append({"name": name, "hostPath": {"path": paths[mount_path]}})
    module_config = _name(spec.kernelModuleConfig)
    if module_config:
        config_map_files(module_config, "/drivers")
    licensing = spec.licensingConfig
    if licensing is not None and (licensing.secretName or licensing.name):
        files = [GRIDD_CONF_PATH]
        if licensing.nlsEnabled is not False:  # unset means NLS on, as upstream
            files.append(NLS_TOKEN_PATH)
        for path in files:
            mounts.append(
                {
                    "name": "licensing-config",
                    "mountPath": path,
                    "subPath": os.path.basename(path),
                    "readOnly": True,
                }
            )
        source: Obj
        if licensing.secretName:
            source = {"secret": {"secretName": licensing.secretName}}
        else:
            source = {"configMap": {"name": licensing.name}}
        volumes.append({"name": "licensing-config", **source})
    topology = _name(spec.virtualTopologyConfig)
    if topology:
        mounts.append(
            {
                "name": "topology-config",
                "mountPath": TOPOLOGY_PATH,
                "subPath": os.path.basename(TOPOLOGY_PATH),
                "readOnly": True,
            }
        )
        volumes.append({"name": "topology-config", "configMap": {"name": topology}})
    return PoolConfigs(tuple(volumes), tuple(mounts))


# ----- the install state of a pool -------------------------------------------------------------


def _enabled(section: Any) -> bool:
    return bool(section is not None and getattr(section, "enabled", None))


def _env(items: Any) -> list[Mapping[str, Any]]:
    return [e.to_dict() if hasattr(e, "to_dict") else dict(e) for e in items or ()]


def install_state(
    spec: Any,
    pod: Mapping[str, Any],
    *,
    kernel: str | None,
    host_root: str,
    configs: PoolConfigs,
) -> InstallState:
    """A pool's install state from its NVIDIADriver spec, as upstream maps it; the images come
    from the pool's rendered pod (`pod`), resolved as upstream's render data resolves them."""
    images: dict[str, str] = {}
    for key in ("initContainers", "containers"):
        for ctr in pod.get(key) or ():
            images[str(ctr.get("name"))] = str(ctr.get("image") or "")
    driver_image = images.get(driver_digest.DRIVER_CTR, "")
    licensing = spec.licensingConfig
    fields: dict[str, Any] = {
        "driver_image": driver_image,
        "driver_manager_image": images.get(driver_digest.MANAGER_CTR, ""),
        "driver_type": spec.driverType or "",
        "kernel_module_type": spec.kernelModuleType or "",
        "driver_args": tuple(spec.args or ()),
        "secret_env_source": spec.secretEnv or "",
        "driver_env": env_pairs(_env(spec.env)),
        "manager_env": env_pairs(_env(spec.manager.env if spec.manager else None)),
        "licensing_config_name": (licensing.secretName or "") if licensing else "",
        "virtual_topology_config": _name(spec.virtualTopologyConfig),
        "kernel_module_config": _name(spec.kernelModuleConfig),
        "repo_config": _name(spec.repoConfig),
        "cert_config": _name(spec.certConfig),
        "volumes": volume_refs(configs.volumes),
        "volume_mounts": mount_refs(configs.mounts),
        "host_root": host_root,
    }
    if _enabled(spec.rdma):
        fields["gpu_direct_rdma_enabled"] = True
        fields["peermem_image"] = driver_image
        fields["use_host_mofed"] = bool(spec.rdma.useHostMofed)
    if _enabled(spec.gds):
        fields["gds_image"] = images.get(driver_digest.GDS_CTR, "")
        fields["gds_enabled"] = True
        fields["gds_env"] = env_pairs(_env(spec.gds.env))
    if _enabled(spec.gdrcopy):
        fields["gdrcopy_image"] = images.get(driver_digest.GDRCOPY_CTR, "")
        fields["gdrcopy_enabled"] = True
        fields["gdrcopy_env"] = env_pairs(_env(spec.gdrcopy.env))
    if kernel:
        fields["use_precompiled"] = True
        fields["kernel_version"] = kernel
    return InstallState(**fields)
