"""Checking ClusterPolicy, NVIDIADriver and GPUCluster manifests: every problem, with its path.

Errors are what the API server or the operator would reject or fail on; warnings are what they
would silently accept but probably not do what the author meant (unknown fields are pruned by
the API server, deprecated fields are ignored).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from gpu_operator.api import apiserver_limits, enablement, intstr
from gpu_operator.api import gpucluster as gc_api
from gpu_operator.api.clusterpolicy import ClusterPolicy, ClusterPolicySpec
from gpu_operator.api.core_types import EnvVar, ImageSpec, Toleration
from gpu_operator.api.fields import TypeInfo, describe, wire_names
from gpu_operator.api.gpucluster import DRADriverSpec, GPUCluster, GPUClusterSpec
from gpu_operator.api.images import PULL_POLICIES
from gpu_operator.api.keys import DRIVER_OWNER
from gpu_operator.api.nvidiadriver import NVIDIADriver, NVIDIADriverSpec


@dataclass(frozen=True)
class Problem:
    """One finding: the field path and what was expected."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@dataclass
class Checked:
    """The outcome of checking one document."""

    kind: str
    name: str
    obj: ClusterPolicy | NVIDIADriver | GPUCluster | None = None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name or '<unnamed>'}"


Model = type[ClusterPolicy] | type[NVIDIADriver] | type[GPUCluster]
KINDS: dict[str, Model] = {
    "ClusterPolicy": ClusterPolicy,
    "NVIDIADriver": NVIDIADriver,
    "GPUCluster": GPUCluster,
}


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_SIMPLE_EXPECTATIONS = {
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "string_type": "a string",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
}


def _message(error: Any) -> str:
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind in _SIMPLE_EXPECTATIONS:
        hint = ""
        if kind == "string_type" and isinstance(got, int | float | bool):
            hint = " (quote it in YAML)"
        return f"expected {_SIMPLE_EXPECTATIONS[kind]}, got {_show(got)}{hint}"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected')}, got {_show(got)}"
    if kind == "greater_than_equal":
        return f"expected a number >= {ctx.get('ge')}, got {_show(got)}"
    if kind == "less_than_equal":
        return f"expected a number <= {ctx.get('le')}, got {_show(got)}"
    if kind == "string_pattern_mismatch":
        return f"expected a string matching {ctx.get('pattern')}, got {_show(got)}"
    return str(error["msg"])


def _loc(error: Any) -> tuple[int | str, ...]:
    """An error's location without pydantic's validator-function markers."""
    return tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def _schema_errors(err: ValidationError) -> list[Problem]:
    problems = []
    for error in err.errors():
        loc = tuple(
            p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-"))
        )
        problems.append(Problem(_path(loc), _message(error)))
    return problems


# kubectl asks for strict field validation by default (--validate=strict), which makes the API
# server refuse an unknown field; any other request has it dropped with a warning.
UNKNOWN_CONSEQUENCE = (
    "kubectl rejects the object (strict field validation, its default); with kubectl "
    "--validate=false, or a client that does not ask for strict validation, the API server "
    "drops the field"
)


def _walk_unknown(raw: Any, info: TypeInfo, path: str) -> Iterator[Problem]:
    if info.kind == "model" and isinstance(raw, dict):
        assert info.model is not None
        known = wire_names(info.model)
        for key, value in raw.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in known:
                close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                yield Problem(sub, f"unknown field{hint}: {UNKNOWN_CONSEQUENCE}")
                continue
            model_field = info.model.model_fields[known[key]]
            sub_info = describe(model_field.annotation, list(model_field.metadata))
            yield from _walk_unknown(value, sub_info, sub)
    elif info.kind == "list" and isinstance(raw, list):
        assert info.item is not None
        for index, item in enumerate(raw):
            yield from _walk_unknown(item, info.item, f"{path}[{index}]")
    elif info.kind == "map" and isinstance(raw, dict):
        assert info.item is not None
        for key, value in raw.items():
            yield from _walk_unknown(value, info.item, f"{path}.{key}")


def unknown_fields(doc: dict[str, Any], model: type[BaseModel]) -> list[Problem]:
    """Fields the model does not know, each with a "did you mean" suggestion when one is close."""
    return list(_walk_unknown(doc, TypeInfo("model", model=model), ""))


# --- semantic checks shared by both kinds -------------------------------------------------

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"invalid label key prefix {prefix!r}: expected a DNS subdomain"
    if not _LABEL_NAME.match(name):
        return (
            f"invalid label key {key!r}: expected at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _check_labels(labels: dict[str, str] | None, path: str, *, values: bool) -> Iterator[Problem]:
    for key, value in (labels or {}).items():
        problem = _label_key_problem(key)
        if problem:
            yield Problem(f"{path}.{key}", problem)
        if values and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            yield Problem(
                f"{path}.{key}",
                f"invalid label value {value!r}: expected at most 63 letters, digits, '-', '_' "
                "or '.', starting and ending with a letter or digit",
            )


def _check_env(env: list[EnvVar] | None, path: str) -> tuple[list[Problem], list[Problem]]:
    errors, warnings, seen = [], [], set()
    for index, var in enumerate(env or []):
        if not var.name:
            errors.append(Problem(f"{path}[{index}].name", "expected a non-empty name"))
        elif var.name in seen:
            warnings.append(
                Problem(f"{path}[{index}].name", f"{var.name} is set twice; the last one wins")
            )
        seen.add(var.name)
    return errors, warnings


def _check_tolerations(tolerations: list[Toleration] | None, path: str) -> Iterator[Problem]:
    for index, tol in enumerate(tolerations or []):
        where = f"{path}[{index}]"
        if tol.operator == "Exists" and tol.value:
            yield Problem(f"{where}.value", 'must be empty when operator is "Exists"')
        if not tol.key and tol.operator != "Exists":
            yield Problem(f"{where}.operator", 'must be "Exists" when key is empty')


def _image_reference_complete(image: str) -> bool:
    return "@" in image or ":" in image.rsplit("/", 1)[-1]


def _check_image(spec: ImageSpec | DRADriverSpec | None, path: str) -> list[Problem]:
    if spec is None:
        return []
    repo, image, version = spec.repository, spec.image, spec.version
    if not (repo or image or version):
        return []
    if not repo and not version:
        if image and not _image_reference_complete(image):
            return [
                Problem(
                    f"{path}.image",
                    f'expected a full image reference like "{image}:<tag>" or '
                    f'"{image}@sha256:<digest>" when repository and version are not set, '
                    f"got {_show(image)}",
                )
            ]
        return []
    return [
        Problem(
            f"{path}.{name}",
            f"required when {path}.{other} is set (or give only {path}.image as a full reference)",
        )
        for name, other in (
            ("repository", "version" if version else "image"),
            ("image", "repository" if repo else "version"),
            ("version", "repository" if repo else "image"),
        )
        if not getattr(spec, name)
    ]


def _check_pull_policy(spec: Any, path: str) -> Iterator[Problem]:
    value = getattr(spec, "imagePullPolicy", None)
    if value and value not in PULL_POLICIES:
        yield Problem(
            f"{path}.imagePullPolicy",
            f"expected Always, Never or IfNotPresent, got {_show(value)}; "
            "the operator will use IfNotPresent",
        )


def _check_absolute(value: str | None, path: str) -> Iterator[Problem]:
    if value is not None and not value.startswith("/"):
        yield Problem(path, f"expected an absolute path, got {_show(value)}")


def _check_max_unavailable(value: Any, path: str, *, digit_string: bool) -> Iterator[Problem]:
    if value is None:
        return
    try:
        intstr.check(value, allow_digit_string=digit_string)
    except intstr.IntOrPercentError as err:
        yield Problem(path, str(err))


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DURATION_UNITS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_PART = re.compile(r"([0-9]+)(ms|y|w|d|h|m|s)")
# Constructs Go's RE2 (which the exporter compiles the allowlist with) does not support.
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\\[1-9]")


def _seconds(duration: str) -> float | None:
    """A Prometheus duration (already pattern-checked) in seconds; None when unset."""
    if not duration:
        return None
    total = 0.0
    for number, unit in _DURATION_PART.findall(duration):
        total += int(number) / 1000 if unit == "ms" else int(number) * _DURATION_UNITS[unit]
    return total


def _check_scrape_timeout(monitor: Any, path: str) -> Iterator[Problem]:
    """Prometheus refuses a scrape config whose timeout is longer than its interval."""
    if monitor is None or not monitor.scrapeTimeout or not monitor.interval:
        return
    timeout, interval = _seconds(monitor.scrapeTimeout), _seconds(monitor.interval)
    if timeout is not None and interval is not None and timeout > interval:
        yield Problem(
            f"{path}.scrapeTimeout",
            f"{monitor.scrapeTimeout} is longer than {path}.interval ({monitor.interval}); "
            "Prometheus rejects such a scrape config",
        )


def _check_object_name(value: str | None, path: str, kind: str) -> Iterator[Problem]:
    if value and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
        yield Problem(
            path,
            f"expected the name of a {kind} (lower-case letters, digits, '-' and '.'), "
            f"got {_show(value)}",
        )


def _check_pod_label_allowlist(spec: ClusterPolicySpec) -> tuple[list[Problem], list[Problem]]:
    exporter = spec.dcgmExporter
    errors: list[Problem] = []
    path = "spec.dcgmExporter.podLabelAllowlistRegex"
    for index, pattern in enumerate(exporter.podLabelAllowlistRegex or ()):
        try:
            re.compile(pattern)
        except re.error as err:
            errors.append(Problem(f"{path}[{index}]", f"not a regular expression: {err}"))
            continue
        if _NOT_RE2.search(pattern):
            errors.append(
                Problem(
                    f"{path}[{index}]",
                    "lookarounds and backreferences are not supported by the exporter's "
                    f"regular expressions (Go RE2), got {_show(pattern)}",
                )
            )
    labels_on = bool(exporter.enablePodLabels) or any(
        e.name == "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS" and (e.value or "").lower() == "true"
        for e in exporter.env or ()
    )
    warnings = []
    if exporter.podLabelAllowlistRegex and not labels_on:
        warnings.append(
            Problem(path, "has no effect without spec.dcgmExporter.enablePodLabels: true")
        )
    return errors, warnings


NRI_DEVICE_NAMESPACES_ENV = "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES"


def _check_nri_device_namespaces(spec: ClusterPolicySpec) -> tuple[list[Problem], list[Problem]]:
    """The toolkit's NRI plugin lets pods of the listed namespaces (besides the operator's own)
    request management CDI devices; names match exactly (comma-separated, no wildcards)."""
    errors: list[Problem] = []
    warnings: list[Problem] = []
    for index, var in enumerate(spec.toolkit.env or ()):
        if var.name != NRI_DEVICE_NAMESPACES_ENV:
            continue
        path = f"spec.toolkit.env[{index}].value"
        for name in (part.strip() for part in (var.value or "").split(",")):
            if not name:
                continue
            if "*" in name:
                errors.append(
                    Problem(
                        path, f"{name!r}: namespaces are matched exactly; wildcards do not work"
                    )
                )
            elif not _DNS_LABEL.match(name):
                errors.append(Problem(path, f"{name!r} is not a namespace name"))
        if not enablement.nri_plugin_enabled(spec):
            warnings.append(
                Problem(path, "has no effect: the NRI plugin is off (spec.cdi.nriPluginEnabled)")
            )
    return errors, warnings


def _check_gds_needs_open_modules(
    gds: Any, kernel_module_type: str, path: str
) -> Iterator[Problem]:
    """GDS 2.17.5 and later only work with the open kernel modules."""
    if not (gds and gds.enabled) or kernel_module_type == "open":
        return
    version = gds.version or ""
    numbers = re.findall(r"\d+", version.removeprefix("v"))
    newer = version.startswith("sha256:") or (
        len(numbers) >= 3 and tuple(int(n) for n in numbers[:3]) >= (2, 17, 5)
    )
    if newer:
        yield Problem(
            path,
            f'GPUDirect Storage {version} needs kernelModuleType "open", '
            f"got {_show(kernel_module_type)}",
        )


# --- ClusterPolicy ------------------------------------------------------------------------

_DEPRECATED_CP = {
    ("operator", "defaultRuntime"): "deprecated and ignored: the runtime is detected per node",
    ("operator", "initContainer"): "deprecated and ignored",
    ("psp", "enabled"): "pod security policies are gone since Kubernetes 1.25; use spec.psa",
    ("driver", "useOpenKernelModules"): 'deprecated: use spec.driver.kernelModuleType: "open"',
    ("cdi", "default"): "deprecated and ignored",
    ("dcgm", "hostPort"): "deprecated and ignored",
    ("kataManager", "enabled"): "deprecated: the Kata manager is never deployed",
    ("kataManager", "config"): "deprecated and ignored: the Kata manager is never deployed",
}

_IMAGE_SECTIONS = (
    "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd",
    "migManager", "validator", "gds", "gdrcopy", "vfioManager", "vgpuManager",
    "vgpuDeviceManager", "sandboxDevicePlugin", "kataSandboxDevicePlugin", "kataManager",
    "ccManager",
)  # fmt: skip

_RELABEL_ACTIONS = {
    "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
    "uppercase", "keepequal", "dropequal",
}  # fmt: skip


def _cp_semantics(spec: ClusterPolicySpec, raw_spec: dict[str, Any]) -> Checked:
    out = Checked("ClusterPolicy", "")
    errors, warnings = out.errors, out.warnings
    cdi = enablement.cdi(spec)
    if cdi.nriPluginEnabled:
        if not enablement.is_enabled(spec, "cdi"):
            errors.append(
                Problem("spec.cdi.nriPluginEnabled", "the NRI plugin needs spec.cdi.enabled: true")
            )
        if not enablement.is_enabled(spec, "toolkit"):
            errors.append(
                Problem(
                    "spec.cdi.nriPluginEnabled",
                    "the NRI plugin needs the container toolkit (spec.toolkit.enabled: true)",
                )
            )
    for section in _IMAGE_SECTIONS:
        value = getattr(spec, section)
        image_problems = _check_image(value, f"spec.{section}")
        enabled = section == "validator" or enablement.is_enabled(spec, section)
        (errors if enabled else warnings).extend(image_problems)
        warnings.extend(_check_pull_policy(value, f"spec.{section}"))
        env_errors, env_warnings = _check_env(getattr(value, "env", None), f"spec.{section}.env")
        errors.extend(env_errors)
        warnings.extend(env_warnings)
    sub_images = (
        ("driver", "manager"),
        ("vfioManager", "driverManager"),
        ("vgpuManager", "driverManager"),
        ("operator", "initContainer"),
    )
    for section, sub in sub_images:
        parent = getattr(spec, section)
        child = getattr(parent, sub, None) if parent is not None else None
        errors.extend(_check_image(child, f"spec.{section}.{sub}"))
    if spec.validator:
        for component in ("plugin", "toolkit", "driver", "cuda", "vfioPCI", "vgpuManager",
                          "vgpuDevices"):  # fmt: skip
            comp = getattr(spec.validator, component)
            env_errors, env_warnings = _check_env(
                comp.env if comp else None, f"spec.validator.{component}.env"
            )
            errors.extend(env_errors)
            warnings.extend(env_warnings)
    if spec.driver.upgradePolicy:
        errors.extend(
            _check_max_unavailable(
                spec.driver.upgradePolicy.maxUnavailable,
                "spec.driver.upgradePolicy.maxUnavailable",
                digit_string=False,
            )
        )
    if spec.daemonsets.rollingUpdate:
        errors.extend(
            _check_max_unavailable(
                spec.daemonsets.rollingUpdate.maxUnavailable,
                "spec.daemonsets.rollingUpdate.maxUnavailable",
                digit_string=True,
            )
        )
    errors.extend(_check_tolerations(spec.daemonsets.tolerations, "spec.daemonsets.tolerations"))
    errors.extend(_check_labels(spec.daemonsets.labels, "spec.daemonsets.labels", values=True))
    errors.extend(
        _check_labels(spec.daemonsets.annotations, "spec.daemonsets.annotations", values=False)
    )
    errors.extend(_check_labels(spec.operator.labels, "spec.operator.labels", values=True))
    paths = enablement.host_paths(spec)
    for name in ("rootFS", "driverInstallDir", "kubeletRootDir"):
        errors.extend(_check_absolute(getattr(paths, name), f"spec.hostPaths.{name}"))
    errors.extend(_check_absolute(spec.toolkit.installDir, "spec.toolkit.installDir"))
    if spec.devicePlugin.mps:
        errors.extend(_check_absolute(spec.devicePlugin.mps.root, "spec.devicePlugin.mps.root"))
    if spec.dcgmExporter.hpcJobMapping:
        errors.extend(
            _check_absolute(
                spec.dcgmExporter.hpcJobMapping.directory,
                "spec.dcgmExporter.hpcJobMapping.directory",
            )
        )
    monitor = spec.dcgmExporter.serviceMonitor
    errors.extend(_check_scrape_timeout(monitor, "spec.dcgmExporter.serviceMonitor"))
    if spec.operator.metrics:
        errors.extend(
            _check_scrape_timeout(
                spec.operator.metrics.serviceMonitor, "spec.operator.metrics.serviceMonitor"
            )
        )
    for found_errors, found_warnings in (
        _check_pod_label_allowlist(spec),
        _check_nri_device_namespaces(spec),
    ):
        errors.extend(found_errors)
        warnings.extend(found_warnings)
    errors.extend(_check_object_name(spec.driver.secretEnv, "spec.driver.secretEnv", "Secret"))
    kernel_modules = spec.vgpuManager.kernelModuleConfig if spec.vgpuManager else None
    errors.extend(
        _check_object_name(
            kernel_modules.name if kernel_modules else None,
            "spec.vgpuManager.kernelModuleConfig.name",
            "ConfigMap",
        )
    )
    for index, rule in enumerate((monitor.relabelings if monitor else None) or []):
        if rule.action and rule.action.lower() not in _RELABEL_ACTIONS:
            errors.append(
                Problem(
                    f"spec.dcgmExporter.serviceMonitor.relabelings[{index}].action",
                    f"expected one of {', '.join(sorted(_RELABEL_ACTIONS))}, "
                    f"got {_show(rule.action)}",
                )
            )
    precompiled = bool(spec.driver.usePrecompiled)
    for sidecar in ("gds", "gdrcopy"):
        if precompiled and enablement.is_enabled(spec, sidecar):
            errors.append(
                Problem(
                    f"spec.{sidecar}.enabled",
                    "not supported together with precompiled drivers (spec.driver.usePrecompiled)",
                )
            )
    errors.extend(
        _check_gds_needs_open_modules(spec.gds, spec.driver.kernelModuleType, "spec.gds.version")
    )
    if spec.driver.licensingConfig and spec.driver.licensingConfig.configMapName:
        warnings.append(
            Problem(
                "spec.driver.licensingConfig.configMapName",
                "deprecated: put the licensing files in a Secret and use secretName",
            )
        )
    for (section, name), why in _DEPRECATED_CP.items():
        raw_section = raw_spec.get(section)
        if isinstance(raw_section, dict) and name in raw_section:
            warnings.append(Problem(f"spec.{section}.{name}", why))
    return out


# --- NVIDIADriver -------------------------------------------------------------------------


def _nvd_semantics(spec: NVIDIADriverSpec) -> Checked:
    out = Checked("NVIDIADriver", "")
    errors, warnings = out.errors, out.warnings
    if spec.default and spec.nodeSelector:
        errors.append(
            Problem("spec.nodeSelector", "a default NVIDIADriver must not have a nodeSelector")
        )
    if DRIVER_OWNER in (spec.nodeSelector or {}):
        errors.append(
            Problem(
                f"spec.nodeSelector.{DRIVER_OWNER}",
                "the driver owner label is managed by the operator and cannot be selected on",
            )
        )
    if not spec.version and not _image_reference_complete(spec.image):
        errors.append(
            Problem(
                "spec.version",
                "required: set the driver version, or give spec.image as a full reference",
            )
        )
    elif spec.version and not spec.repository and "/" not in spec.image:
        errors.append(Problem("spec.repository", "required when spec.image is a bare name"))
    for sidecar in ("gds", "gdrcopy"):
        value = getattr(spec, sidecar)
        if value is None:
            continue
        if spec.usePrecompiled and value.enabled:
            errors.append(
                Problem(
                    f"spec.{sidecar}.enabled",
                    "not supported together with precompiled drivers (spec.usePrecompiled)",
                )
            )
        if value.enabled:
            errors.extend(_check_image(value, f"spec.{sidecar}"))
        env_errors, env_warnings = _check_env(value.env, f"spec.{sidecar}.env")
        errors.extend(env_errors)
        warnings.extend(env_warnings)
    errors.extend(
        _check_gds_needs_open_modules(spec.gds, spec.kernelModuleType, "spec.gds.version")
    )
    errors.extend(_check_image(spec.manager, "spec.manager"))
    warnings.extend(_check_pull_policy(spec, "spec"))
    env_errors, env_warnings = _check_env(spec.env, "spec.env")
    errors.extend(env_errors)
    warnings.extend(env_warnings)
    if spec.upgradePolicy:
        errors.extend(
            _check_max_unavailable(
                spec.upgradePolicy.maxUnavailable,
                "spec.upgradePolicy.maxUnavailable",
                digit_string=False,
            )
        )
    errors.extend(_check_tolerations(spec.tolerations, "spec.tolerations"))
    errors.extend(_check_object_name(spec.secretEnv, "spec.secretEnv", "Secret"))
    errors.extend(_check_labels(spec.labels, "spec.labels", values=True))
    errors.extend(_check_labels(spec.nodeSelector, "spec.nodeSelector", values=True))
    if spec.useOpenKernelModules is not None:
        warnings.append(
            Problem("spec.useOpenKernelModules", 'deprecated: use kernelModuleType: "open"')
        )
    return out


# --- GPUCluster ---------------------------------------------------------------------------


def _gc_semantics(obj: GPUCluster, name: str) -> Checked:
    out = Checked("GPUCluster", name)
    errors, warnings = out.errors, out.warnings
    if name and name != gc_api.NAME:
        errors.append(
            Problem(
                "metadata.name",
                f"GPUCluster is a singleton: its name must be {gc_api.NAME!r}, got {_show(name)} "
                "(the API server refuses any other)",
            )
        )
    spec = obj.spec
    if spec is None:
        errors.append(Problem("spec.draDriver", "required field is missing"))
        return out
    dra = spec.draDriver
    errors.extend(_check_image(dra, "spec.draDriver"))
    warnings.extend(_check_pull_policy(dra, "spec.draDriver"))
    for index, secret in enumerate(dra.imagePullSecrets or []):
        errors.extend(
            _check_object_name(secret, f"spec.draDriver.imagePullSecrets[{index}]", "Secret")
        )
    for gate in sorted(dra.featureGates or {}):
        if gate not in gc_api.KNOWN_FEATURE_GATES:
            close = difflib.get_close_matches(gate, sorted(gc_api.KNOWN_FEATURE_GATES), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(
                Problem(
                    f"spec.draDriver.featureGates.{gate}",
                    f"not a feature gate of NVIDIA's DRA driver as the operator knows it{hint}; "
                    "the driver refuses to start on a gate it does not know",
                )
            )
    cds = dra.computeDomains
    cds_on = cds is None or cds.enabled
    plugins = (
        ("gpus", dra.gpus.kubeletPlugin if dra.gpus else None, gc_api.GPUS_HEALTHCHECK_PORT),
        (
            "computeDomains",
            cds.kubeletPlugin if cds else None,
            gc_api.COMPUTE_DOMAINS_HEALTHCHECK_PORT,
        ),
    )
    taken = {
        gc_api.GPUS_HTTP_PORT: "the gpus container's HTTP endpoint",
        gc_api.COMPUTE_DOMAINS_HTTP_PORT: "the compute-domains container's HTTP endpoint",
    }
    for section, plugin, default in plugins:
        path = f"spec.draDriver.{section}.kubeletPlugin"
        if plugin is not None:
            env_errors, env_warnings = _check_env(plugin.env, f"{path}.env")
            errors.extend(env_errors)
            warnings.extend(env_warnings)
        if section == "computeDomains" and not cds_on:
            continue
        health = plugin.healthcheck if plugin else None
        if health is not None and not health.enabled:
            continue
        port = health.port if health is not None and health.port is not None else default
        if port in taken:
            errors.append(
                Problem(
                    f"{path}.healthcheck.port",
                    f"port {port} is already {taken[port]} in the same kubelet-plugin pod; "
                    "choose another port",
                )
            )
        taken[port] = f"the {section} container's health service"
    if cds is not None and cds.controller is not None:
        env_errors, env_warnings = _check_env(
            cds.controller.env, "spec.draDriver.computeDomains.controller.env"
        )
        errors.extend(env_errors)
        warnings.extend(env_warnings)
    if spec.hostPaths is not None:
        for field_name in ("driverInstallDir", "kubeletRootDir"):
            value = getattr(spec.hostPaths, field_name)
            if value and not value.startswith("/"):
                errors.append(
                    Problem(
                        f"spec.hostPaths.{field_name}",
                        f"expected an absolute path, got {_show(value)}",
                    )
                )
    if spec.daemonsets is not None:
        errors.extend(
            _check_tolerations(spec.daemonsets.tolerations, "spec.daemonsets.tolerations")
        )
        errors.extend(_check_labels(spec.daemonsets.labels, "spec.daemonsets.labels", values=True))
    return out


# --- entry point --------------------------------------------------------------------------


def _drop(doc: Any, loc: tuple[int | str, ...]) -> bool:
    """Delete the value at `loc`; False when the path cannot be followed."""
    for part in loc[:-1]:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and isinstance(part, int) and part < len(doc):
            doc = doc[part]
        else:
            return False
    last = loc[-1]
    if isinstance(doc, dict) and last in doc:
        del doc[last]
        return True
    return False


def _without_bad_fields(
    doc: dict[str, Any], err: ValidationError, model: Model
) -> ClusterPolicy | NVIDIADriver | GPUCluster | None:
    """The document with its invalid fields removed, so the semantic checks can still run."""
    repaired = copy.deepcopy(doc)
    for _ in range(5):
        progressed = False
        for error in err.errors():
            loc = _loc(error)
            if error["type"] == "missing" and loc:
                parent: Any = repaired
                for part in loc[:-1]:
                    parent = parent.get(part, {}) if isinstance(parent, dict) else {}
                if isinstance(parent, dict):
                    parent[loc[-1]] = {}
                    progressed = True
            elif loc:
                progressed |= _drop(repaired, loc)
        if not progressed:
            return None
        try:
            return model.model_validate(repaired)
        except ValidationError as again:
            err = again
    return None


def kind_suggestion(doc: Any) -> str | None:
    """What to write instead of a document that is of no GPU operator kind but looks meant as one
    (a kind spelled like ours, or an nvidia.com API group), e.g. the `GPUClusterPolicy`
    `gpu.nvidia.com/v1` of widely copied guides; None for other documents."""
    if not isinstance(doc, dict):
        return None
    kind = str(doc.get("kind") or "")
    api_version = str(doc.get("apiVersion") or "")
    if kind in KINDS:
        return None
    wanted = difflib.get_close_matches(kind, list(KINDS), n=1, cutoff=0.6)
    wanted = wanted or [known for known in KINDS if kind and known.lower() in kind.lower()]
    shown = f"{api_version or '<no apiVersion>'} {kind or '<no kind>'}"
    if not wanted:
        if not api_version.rpartition("/")[0].endswith("nvidia.com"):
            return None
        return (
            f"{shown} is not a kind of the GPU operator, whose kinds are ClusterPolicy "
            f"({KINDS['ClusterPolicy'].model_fields['apiVersion'].default}), NVIDIADriver "
            f"({KINDS['NVIDIADriver'].model_fields['apiVersion'].default}) and GPUCluster "
            f"({KINDS['GPUCluster'].model_fields['apiVersion'].default})"
        )
    model = KINDS[wanted[0]]
    suggestion = (
        f'{shown} is not a kind of the GPU operator (kubectl answers "no matches for '
        f'kind"): did you mean {wanted[0]} ({model.model_fields["apiVersion"].default})?'
    )
    spec_model: type[BaseModel] = (
        ClusterPolicySpec
        if model is ClusterPolicy
        else GPUClusterSpec
        if model is GPUCluster
        else NVIDIADriverSpec
    )
    spec_fields = wire_names(spec_model)
    stray = [str(key) for key in doc if key in spec_fields]
    if stray:
        suggestion += (
            f" {', '.join(stray)} at the top level of the document "
            f"{'is a spec field' if len(stray) == 1 else 'are spec fields'}: indent "
            f"{'it' if len(stray) == 1 else 'them'} under spec"
        )
    return suggestion


def check_document(doc: dict[str, Any]) -> Checked:
    """Check one manifest document; non-GPU kinds are reported as skipped (a warning)."""
    kind = str(doc.get("kind") or "")
    raw_metadata = doc.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    model = KINDS.get(kind)
    if model is None:
        return Checked(kind or "<no kind>", name, skipped=True)
    checked = Checked(kind, name)
    if not isinstance(doc.get("metadata"), dict):
        checked.errors.append(Problem("metadata", "expected an object with a name"))
    elif not name:
        checked.errors.append(Problem("metadata.name", "required field is missing"))
    elif metadata.get("namespace"):
        checked.warnings.append(
            Problem("metadata.namespace", f"{kind} is cluster-scoped; the namespace is ignored")
        )
    checked.warnings.extend(unknown_fields(doc, model))
    checked.errors.extend(Problem(path, message) for path, message in apiserver_limits.check(doc))
    try:
        obj = model.model_validate(doc)
        checked.obj = obj
    except ValidationError as err:
        checked.errors.extend(_schema_errors(err))
        repaired = _without_bad_fields(doc, err, model)
        if repaired is None:
            return checked
        obj = repaired
    if isinstance(obj, ClusterPolicy):
        raw_spec = doc.get("spec")
        semantic = _cp_semantics(obj.spec, raw_spec if isinstance(raw_spec, dict) else {})
    elif isinstance(obj, GPUCluster):
        semantic = _gc_semantics(obj, name)
    else:
        semantic = _nvd_semantics(obj.spec)
    # A field already reported by the schema check was removed before the semantic pass.
    reported = {problem.path for problem in checked.errors}
    checked.errors.extend(p for p in semantic.errors if p.path not in reported)
    checked.warnings.extend(semantic.warnings)
    return checked
