"""What the Kubernetes API server refuses in the objects the operator writes from a policy.

The CRDs accept any string or integer in these fields, so a bad value passes `kubectl apply` of the
ClusterPolicy and only fails later, when the operator creates a DaemonSet or the user a ConfigMap.
The checks work on the raw document (before the model decodes it), so they run even when the
schema check failed elsewhere, and the messages are the API server's own wording
(k8s.io/apimachinery validation: IsDNS1123Subdomain, IsEnvVarName, ValidateAnnotations).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# The longest DNS-1123 subdomain (RuntimeClass, PriorityClass, ConfigMap and Secret names).
DNS1123_SUBDOMAIN_MAX = 253
_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS1123_SUBDOMAIN = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")
# ObjectMeta: the keys and values of all annotations together (TotalAnnotationSizeLimitB).
ANNOTATIONS_MAX_BYTES = 256 * 1024
INT32_MAX = 2**31 - 1

_PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
_PROBE_FIELDS = (
    "initialDelaySeconds",
    "timeoutSeconds",
    "periodSeconds",
    "successThreshold",
    "failureThreshold",
)

# Fields naming a ConfigMap or Secret the operator mounts into operand pods.
_CP_OBJECT_NAMES: tuple[tuple[str, ...], ...] = (
    ("devicePlugin", "config", "name"),
    ("migManager", "config", "name"),
    ("migManager", "gpuClientsConfig", "name"),
    ("dcgmExporter", "config", "name"),
    ("vgpuDeviceManager", "config", "name"),
    ("driver", "repoConfig", "configMapName"),
    ("driver", "certConfig", "name"),
    ("driver", "licensingConfig", "configMapName"),
    ("driver", "licensingConfig", "secretName"),
    ("driver", "virtualTopology", "config"),
    ("driver", "kernelModuleConfig", "name"),
)
_NVD_OBJECT_NAMES: tuple[tuple[str, ...], ...] = (
    ("repoConfig", "name"),
    ("certConfig", "name"),
    ("licensingConfig", "name"),
    ("licensingConfig", "secretName"),
    ("virtualTopologyConfig", "name"),
    ("kernelModuleConfig", "name"),
)


def _show(value: Any) -> str:
    if not isinstance(value, str):
        return str(value)
    text = value
    shown = text if len(text) <= 60 else text[:57] + "..."
    return '"' + shown.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'


def dns1123_subdomain(value: str) -> list[str]:
    """The API server's complaints about `value` as an object name; empty when it is fine."""
    problems = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        problems.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        problems.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character (e.g. "
            f"'example.com', regex used for validation is '{_DNS1123_SUBDOMAIN_FMT}')"
        )
    return problems


def env_var_name(value: str) -> str | None:
    """Kubernetes 1.34+ accepts any printable ASCII but '=' in an env name (relaxed rule)."""
    if value and all(" " <= ch <= "~" and ch != "=" for ch in value):
        return None
    return (
        "a valid environment variable name must consist only of printable ASCII characters "
        "other than '='"
    )


def _object_kind(path: tuple[str, ...]) -> str:
    return "Secret name" if path[-1] == "secretName" else "ConfigMap name"


def _get(doc: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return doc


def _invalid(path: str, value: Any, message: str) -> tuple[str, str]:
    return path, f"Invalid value: {_show(value)}: {message}"


def _name_problems(doc: Any, path: tuple[str, ...], what: str) -> Iterator[tuple[str, str]]:
    value = _get(doc, path)
    if isinstance(value, str) and value:
        for message in dns1123_subdomain(value):
            yield _invalid(".".join(path), value, f"{what}: {message}")


def _annotation_size(doc: Any, path: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    value = _get(doc, path)
    if not isinstance(value, dict):
        return
    total = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in value.items())
    if total > ANNOTATIONS_MAX_BYTES:
        yield (
            ".".join(path),
            f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes (got {total})",
        )


def _probes(doc: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    for probe in _PROBES:
        for name in _PROBE_FIELDS:
            path = (*prefix, probe, name)
            value = _get(doc, path)
            if isinstance(value, int) and not isinstance(value, bool) and value > INT32_MAX:
                yield _invalid(
                    ".".join(path),
                    value,
                    f"must be at most {INT32_MAX} (a 32-bit integer in the pod's probe; the "
                    "API server rejects the DaemonSet)",
                )


def _env_names(node: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    # Every `env` list below spec becomes container env of some operand pod.
    if depth > 12:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}"
            if key == "env" and isinstance(value, list):
                for index, var in enumerate(value):
                    name = var.get("name") if isinstance(var, dict) else None
                    if isinstance(name, str) and name:
                        message = env_var_name(name)
                        if message:
                            yield _invalid(f"{sub}[{index}].name", name, message)
            else:
                yield from _env_names(value, sub, depth + 1)


def check(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(field path, message) for every value of a ClusterPolicy or NVIDIADriver document that
    the API server would refuse, in the object itself or in what the operator writes from it."""
    kind = doc.get("kind")
    spec = doc.get("spec")
    found = list(_annotation_size(doc, ("metadata", "annotations")))
    if not isinstance(spec, dict):
        return found
    found += _env_names(spec, "spec")
    found += _probes(doc, ("spec", "driver") if kind == "ClusterPolicy" else ("spec",))
    if kind == "ClusterPolicy":
        found += _name_problems(doc, ("spec", "operator", "runtimeClass"), "RuntimeClass name")
        found += _name_problems(
            doc, ("spec", "daemonsets", "priorityClassName"), "PriorityClass name"
        )
        for path in _CP_OBJECT_NAMES:
            found += _name_problems(doc, ("spec", *path), _object_kind(path))
        found += _annotation_size(doc, ("spec", "daemonsets", "annotations"))
        found += _annotation_size(doc, ("spec", "operator", "annotations"))
    else:
        found += _name_problems(doc, ("spec", "priorityClassName"), "PriorityClass name")
        for path in _NVD_OBJECT_NAMES:
            found += _name_problems(doc, ("spec", *path), _object_kind(path))
        found += _annotation_size(doc, ("spec", "annotations"))
    return found
