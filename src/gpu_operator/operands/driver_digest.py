"""`DRIVER_CONFIG_DIGEST`: the number upstream's driver containers compare to skip a reinstall.

The driver container (NVIDIA's image) records the digest it installed with on the host; when a new
pod carries the same value, the driver manager keeps the loaded driver and the driver container
takes its fast path. The value must therefore be computed exactly as NVIDIA's operator computes it
(26.x, ClusterPolicy mode), or a swap between the two operators changes every driver pod template
and reinstalls every driver.

Facts about upstream's computation (observed from its output, rewritten here): it is taken from the
finished driver pod spec, before the digest itself is set. The install-relevant parts are
gathered into named fields; each field that is not empty is written as `<Name>:` followed by Go's
go-spew `%#v` rendering of its value, fields in byte order of their names, and the text is hashed
with 32-bit FNV-1a, printed in decimal. Fields (with go-spew's rendering):
- DriverManagerImage, ManagerEnv: the `k8s-driver-manager` init container's image and literal env;
- DriverImage, DriverCommand, DriverArgs, DriverEnv, SecretEnvSource, AdditionalVolumeMounts: the
  `nvidia-driver-ctr` container's image, command, args, literal env, envFrom secret and mounts;
- PeermemImage/GPUDirectRDMAEnabled, GDSImage/GDSEnabled/GDSEnv, GDRCopyImage/GDRCopyEnabled/
  GDRCopyEnv: from the sidecars present;
- AdditionalVolumes: every pod volume; HostRoot: the `host-root` volume's path.
Env lists keep literal values only (valueFrom entries are skipped) and are sorted by name; mounts
are sorted by name then path; volumes by name. Strings print raw, so `(string)abc`.

Probes, resources, tolerations and labels are not part of it: changing them restarts driver pods
without reinstalling the driver. The driver manager's image and env are part of it, as upstream's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV_NAME = "DRIVER_CONFIG_DIGEST"
MANAGER_CTR = "k8s-driver-manager"
DRIVER_CTR = "nvidia-driver-ctr"
PEERMEM_CTR = "nvidia-peermem-ctr"
GDS_CTR = "nvidia-fs-ctr"
GDRCOPY_CTR = "nvidia-gdrcopy-ctr"

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a."""
    value = _FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return value


# --- go-spew `%#v` renderings of the few shapes the digest uses ------------------------------


def go_string(value: str) -> str:
    return f"(string){value}"


def go_bool(value: bool) -> str:
    return f"(bool){'true' if value else 'false'}"


def go_strings(values: Sequence[str]) -> str:
    return "([]string)[" + " ".join(values) + "]"


def go_structs(type_name: str, rows: Iterable[Sequence[tuple[str, str]]]) -> str:
    """A slice of structs: fields as `Name:(type)value`, elements separated by spaces."""
    items = ["{" + " ".join(f"{name}:{value}" for name, value in row) + "}" for row in rows]
    return f"([]config.{type_name})[" + " ".join(items) + "]"


# --- the fields ------------------------------------------------------------------------------


def _literal_env(ctr: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = [
        (str(e["name"]), str(e.get("value") or ""))
        for e in ctr.get("env") or []
        if "valueFrom" not in e and e.get("name") != ENV_NAME
    ]
    return sorted(found, key=lambda item: item[0])


def _env_field(ctr: Mapping[str, Any]) -> str | None:
    items = _literal_env(ctr)
    if not items:
        return None
    rows = ([("Name", go_string(n)), ("Value", go_string(v))] for n, v in items)
    return go_structs("EnvVar", rows)


def _mounts_field(ctr: Mapping[str, Any]) -> str | None:
    mounts = sorted(
        ctr.get("volumeMounts") or [], key=lambda m: (str(m["name"]), str(m["mountPath"]))
    )
    if not mounts:
        return None
    return go_structs(
        "VolumeMountConfig",
        (
            [
                ("Name", go_string(m["name"])),
                ("MountPath", go_string(m["mountPath"])),
                ("SubPath", go_string(m.get("subPath") or "")),
                ("ReadOnly", go_bool(bool(m.get("readOnly")))),
            ]
            for m in mounts
        ),
    )


def _volumes_field(volumes: Sequence[Mapping[str, Any]]) -> str | None:
    if not volumes:
        return None
    rows = []
    for volume in sorted(volumes, key=lambda v: str(v["name"])):
        rows.append(
            [
                ("Name", go_string(volume["name"])),
                ("ConfigMapName", go_string((volume.get("configMap") or {}).get("name") or "")),
                ("SecretName", go_string((volume.get("secret") or {}).get("secretName") or "")),
                ("HostPath", go_string((volume.get("hostPath") or {}).get("path") or "")),
            ]
        )
    return go_structs("VolumeConfig", rows)


def _fields(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The digest's non-empty fields from a driver pod spec, rendered (name -> text)."""
    found: dict[str, str | None] = {}
    for ctr in pod_spec.get("initContainers") or []:
        if ctr.get("name") == MANAGER_CTR:
            found["DriverManagerImage"] = go_string(ctr["image"]) if ctr.get("image") else None
            found["ManagerEnv"] = _env_field(ctr)
    for ctr in pod_spec.get("containers") or []:
        name = ctr.get("name")
        image = go_string(ctr["image"]) if ctr.get("image") else None
        if name == DRIVER_CTR:
            found["DriverImage"] = image
            found["DriverCommand"] = go_strings(ctr["command"]) if ctr.get("command") else None
            found["DriverArgs"] = go_strings(ctr["args"]) if ctr.get("args") else None
            found["DriverEnv"] = _env_field(ctr)
            secrets = [
                s["secretRef"]["name"] for s in ctr.get("envFrom") or [] if s.get("secretRef")
            ]
            found["SecretEnvSource"] = go_string(secrets[-1]) if secrets else None
            found["AdditionalVolumeMounts"] = _mounts_field(ctr)
        elif name == PEERMEM_CTR:
            found["PeermemImage"] = image
            found["GPUDirectRDMAEnabled"] = go_bool(True)
        elif name == GDS_CTR:
            found["GDSImage"] = image
            found["GDSEnabled"] = go_bool(True)
            found["GDSEnv"] = _env_field(ctr)
        elif name == GDRCOPY_CTR:
            found["GDRCopyImage"] = image
            found["GDRCopyEnabled"] = go_bool(True)
            found["GDRCopyEnv"] = _env_field(ctr)
    volumes = list(pod_spec.get("volumes") or [])
    found["AdditionalVolumes"] = _volumes_field(volumes)
    host_root = next((v for v in volumes if v.get("name") == "host-root"), None)
    path = ((host_root or {}).get("hostPath") or {}).get("path")
    found["HostRoot"] = go_string(path) if path else None
    return {k: v for k, v in found.items() if v is not None}


@dataclass(frozen=True)
class InstallState:
    """The install-relevant fields of a driver pod, rendered as go-spew writes them."""

    fields: Mapping[str, str]

    def text(self) -> str:
        """What is hashed: `<Name>:<value>` for each field, in byte order of the names."""
        return "".join(f"{name}:{self.fields[name]}" for name in sorted(self.fields))

    def digest(self) -> str:
        """The decimal FNV-1a of `text()`: upstream's DRIVER_CONFIG_DIGEST value."""
        return str(fnv1a_32(self.text().encode()))


def from_pod_spec(pod_spec: Mapping[str, Any]) -> InstallState:
    """The install state of a finished driver pod spec (its own digest env is ignored)."""
    return InstallState(_fields(pod_spec))


def digest(pod_spec: Mapping[str, Any]) -> str:
    """The digest of a finished driver pod spec (upstream's DRIVER_CONFIG_DIGEST value)."""
    return from_pod_spec(pod_spec).digest()
