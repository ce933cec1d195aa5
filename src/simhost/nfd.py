"""Node Feature Discovery v0.19 on the simulated cluster: what nfd-worker, nfd-master and nfd-gc
do, run as the programs of the pods the chart deploys (`registry.k8s.io/nfd/...` image).

* nfd-worker reads its node's hardware through the pod's hostPath mounts (`/host-sys/bus/pci`,
  `/host-etc/os-release`, `/host-boot/config-*`; `/proc` is the host kernel's in any container),
  and writes a NodeFeature object named after the node (features plus the labels its sources
  produce, `nfd.node.kubernetes.io/node-name` label, owned by its DaemonSet), every
  `core.sleepInterval` (default 60 s).
* nfd-master merges every NodeFeature of a node, applies the NodeFeatureRules, filters label
  namespaces (anything under `kubernetes.io` is denied except `feature.node.kubernetes.io` and
  `profile.node.kubernetes.io`; `denyLabelNs` adds more, `extraLabelNs` re-allows) and labels the
  node, recording what it set in the `nfd.node.kubernetes.io/feature-labels` annotation (names
  in the default namespace without their prefix), so it removes only its own labels later.
  `nfd-master -prune` removes them and exits (the chart's post-delete hook).
* nfd-gc deletes NodeFeature objects of nodes that no longer exist, every `-gc-interval`.

Each talks to the API server with its pod's ServiceAccount token, so the chart's RBAC is what
allows it. Long-running ones serve `/healthz` and `/metrics` on `-port` and are probed as the
kubelet would (`kubesim.probes`). Everything decision-like is a pure function of files or objects
(`discover`, `worker_labels`, `master_patch`, `prune_patch`), tested without a cluster.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

import kubesim
from kubesim import PodContext, probes

log = logging.getLogger("gpu_operator.demo.nfd")

IMAGE = "registry.k8s.io/nfd/node-feature-discovery"
GROUP_VERSION = "nfd.k8s-sigs.io/v1alpha1"
DEFAULT_NS = "feature.node.kubernetes.io"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
FEATURE_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
NFD_ANNOTATION_PREFIX = "nfd.node.kubernetes.io/"
# NFD's defaults when nfd-worker.conf says nothing.
DEFAULT_CLASS_WHITELIST = ("03", "0b40", "12")
DEFAULT_LABEL_FIELDS = ("class", "vendor")
DEFAULT_KCONFIG_OPTS = ("NO_HZ", "NO_HZ_IDLE", "NO_HZ_FULL", "PREEMPT")
DEFAULT_SLEEP_INTERVAL = 60.0
# CPUID flags NFD does not label by default (its attributeBlacklist).
CPUID_BLACKLIST = frozenset(
    (
        "AVX10", "BMI1", "BMI2", "CLMUL", "CMOV", "CX16", "ERMS", "F16C", "HTT", "LZCNT", "MMX",
        "MMXEXT", "NX", "POPCNT", "RDRAND", "RDSEED", "RDTSCP", "SGX", "SSE", "SSE2", "SSE3",
        "SSE4", "SSE42", "SSSE3", "TDX_GUEST",
    )
)  # fmt: skip
# Linux /proc/cpuinfo flag names -> NFD's CPUID feature names.
CPUID_NAMES = {
    "adx": "ADX", "aes": "AESNI", "amx_bf16": "AMXBF16", "amx_int8": "AMXINT8",
    "amx_tile": "AMXTILE", "avx": "AVX", "avx2": "AVX2", "avx512_bf16": "AVX512BF16",
    "avx512_vnni": "AVX512VNNI", "avx512bw": "AVX512BW", "avx512cd": "AVX512CD",
    "avx512dq": "AVX512DQ", "avx512f": "AVX512F", "avx512vl": "AVX512VL", "fma": "FMA3",
    "ht": "HTT", "sha_ni": "SHA", "sse4_1": "SSE4", "sse4_2": "SSE42", "sse4a": "SSE4A",
}  # fmt: skip
CPU_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}
# The worker and master configuration of the gpu-operator chart's values
# (`node-feature-discovery.worker.config` / `.master.config`), for the in-process demo, which
# runs no NFD pods; a test keeps them equal to charts/gpu-operator/values.yaml.
CHART_WORKER_CONFIG: dict[str, Any] = {
    "sources": {
        "pci": {
            "deviceClassWhitelist": ["02", "0200", "0207", "0300", "0302"],
            "deviceLabelFields": ["vendor"],
        }
    }
}
CHART_MASTER_CONFIG: dict[str, Any] = {"extraLabelNs": ["nvidia.com"]}

Features = dict[str, dict[str, Any]]


# ----- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerConfig:
    """The parts of nfd-worker.conf the simulation honours."""

    class_whitelist: tuple[str, ...] = DEFAULT_CLASS_WHITELIST
    label_fields: tuple[str, ...] = DEFAULT_LABEL_FIELDS
    kconfig_opts: tuple[str, ...] = DEFAULT_KCONFIG_OPTS
    sleep_interval: float = DEFAULT_SLEEP_INTERVAL
    label_whitelist: str = ""
    no_publish: bool = False

    @classmethod
    def parse(cls, data: Any) -> WorkerConfig:
        data = data if isinstance(data, dict) else {}
        core = data.get("core") or {}
        sources = data.get("sources") or {}
        pci = sources.get("pci") or {}
        kernel = sources.get("kernel") or {}
        return cls(
            class_whitelist=tuple(str(c) for c in pci.get("deviceClassWhitelist") or ())
            or DEFAULT_CLASS_WHITELIST,
            label_fields=tuple(str(f) for f in pci.get("deviceLabelFields") or ())
            or DEFAULT_LABEL_FIELDS,
            kconfig_opts=tuple(str(o) for o in kernel.get("configOpts") or ())
            or DEFAULT_KCONFIG_OPTS,
            sleep_interval=duration(core.get("sleepInterval"), DEFAULT_SLEEP_INTERVAL),
            label_whitelist=str(core.get("labelWhiteList") or ""),
            no_publish=bool(core.get("noPublish")),
        )


@dataclass(frozen=True)
class MasterConfig:
    """The parts of nfd-master.conf (and its flags) the simulation honours."""

    extra_label_ns: tuple[str, ...] = ()
    deny_label_ns: tuple[str, ...] = ()
    label_whitelist: str = ""
    no_publish: bool = False

    @classmethod
    def parse(cls, data: Any, args: Sequence[str] = ()) -> MasterConfig:
        data = data if isinstance(data, dict) else {}
        extra = [str(n) for n in data.get("extraLabelNs") or ()]
        deny = [str(n) for n in data.get("denyLabelNs") or ()]
        for arg in args:
            name, _, value = arg.lstrip("-").partition("=")
            if name == "extra-label-ns":
                extra += [v for v in value.split(",") if v]
            elif name == "deny-label-ns":
                deny += [v for v in value.split(",") if v]
        return cls(
            tuple(extra),
            tuple(deny),
            str(data.get("labelWhiteList") or ""),
            bool(data.get("noPublish")),
        )


def duration(value: Any, default: float) -> float:
    """A Go duration such as `60s`, `1m30s` or `1h` in seconds (the default when unset)."""
    if value in (None, ""):
        return default
    if isinstance(value, int | float):
        return float(value)
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(value))
    if not parts or "".join(n + u for n, u in parts) != str(value):
        raise ValueError(f"invalid duration {value!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _flag_value(args: Sequence[str], name: str) -> str | None:
    for arg in args:
        key, sep, value = arg.lstrip("-").partition("=")
        if key == name:
            return value if sep else "true"
    return None


# ----- nfd-worker: hardware -> features and labels ---------------------------------------------


@dataclass(frozen=True)
class Host:
    """Where nfd-worker finds the host's facts: its mounts of /sys, /etc/os-release and /boot,
    and the kernel's /proc (the same in every container)."""

    sys: Path
    os_release: Path
    boot: Path
    proc: Path

    @classmethod
    def of_root(cls, root: Path) -> Host:
        """A node's root directory seen directly (the in-process demo and tests)."""
        return cls(root / "sys", root / "etc" / "os-release", root / "boot", root / "proc")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _hex(text: str, digits: int) -> str:
    value = text.strip().lower().removeprefix("0x")
    return value[:digits].rjust(digits, "0") if value else ""


def discover(host: Host, config: WorkerConfig) -> Features:
    """The raw features nfd-worker's sources find: PCI devices, OS release, kernel, CPU."""
    features: Features = {"flags": {}, "attributes": {}, "instances": {}}
    devices = []
    pci_root = host.sys / "bus" / "pci" / "devices"
    for entry in sorted(pci_root.iterdir()) if pci_root.is_dir() else ():
        attrs = {
            "class": _hex(_read(entry / "class"), 4),
            "vendor": _hex(_read(entry / "vendor"), 4),
            "device": _hex(_read(entry / "device"), 4),
            "subsystem_vendor": _hex(_read(entry / "subsystem_vendor"), 4),
            "subsystem_device": _hex(_read(entry / "subsystem_device"), 4),
        }
        if attrs["class"] and attrs["vendor"]:
            devices.append({"attributes": attrs})
    features["instances"]["pci.device"] = {"elements": devices}
    release = _os_release(_read(host.os_release))
    features["attributes"]["system.osrelease"] = {"elements": release}
    kernel = _read(host.proc / "sys" / "kernel" / "osrelease").strip()
    version = {"full": kernel} if kernel else {}
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", kernel)
    if match:
        version.update(major=match[1], minor=match[2], revision=match[3] or "0")
    features["attributes"]["kernel.version"] = {"elements": version}
    kconfig = {}
    for line in _read(host.boot / f"config-{kernel}").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.startswith("CONFIG_"):
            kconfig[name.removeprefix("CONFIG_")] = value.strip('"')
    features["attributes"]["kernel.config"] = {"elements": kconfig}
    modules: dict[str, Any] = {
        line.split()[0]: {} for line in _read(host.proc / "modules").splitlines() if line
    }
    features["flags"]["kernel.loadedmodule"] = {"elements": modules}
    cpu = _cpuinfo(_read(host.proc / "cpuinfo"))
    features["attributes"]["cpu.model"] = {
        "elements": {
            k: v
            for k, v in {
                "vendor_id": CPU_VENDORS.get(cpu.get("vendor_id", ""), cpu.get("vendor_id", "")),
                "family": cpu.get("cpu family", ""),
                "id": cpu.get("model", ""),
            }.items()
            if v
        }
    }
    flags: dict[str, Any] = {
        CPUID_NAMES[f]: {} for f in cpu.get("flags", "").split() if f in CPUID_NAMES
    }
    features["flags"]["cpu.cpuid"] = {"elements": flags}
    threads = int(cpu.get("siblings") or 0)
    cores = int(cpu.get("cpu cores") or 0)
    if cores:
        features["attributes"]["cpu.topology"] = {
            "elements": {"hardware_multithreading": str(threads > cores).lower()}
        }
    return features


def _os_release(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip().strip('"')
    out: dict[str, str] = {k: values[k] for k in ("ID", "VERSION_ID") if k in values}
    if "VERSION_ID" in out:
        major, _, minor = out["VERSION_ID"].partition(".")
        out["VERSION_ID.major"] = major
        if minor:
            out["VERSION_ID.minor"] = minor.split(".")[0]
    return out


def _cpuinfo(text: str) -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def worker_labels(features: Features, config: WorkerConfig) -> dict[str, str]:
    """The labels nfd-worker's label sources derive from the features (full names)."""
    labels: dict[str, str] = {}
    for device in features["instances"].get("pci.device", {}).get("elements", []):
        attrs = device["attributes"]
        if not any(attrs["class"].startswith(c) for c in config.class_whitelist):
            continue
        name = "_".join(attrs.get(f, "") for f in config.label_fields)
        labels[f"pci-{name}.present"] = "true"
    for key, value in features["attributes"].get("system.osrelease", {})["elements"].items():
        labels[f"system-os_release.{key}"] = value
    for key, value in features["attributes"].get("kernel.version", {})["elements"].items():
        labels[f"kernel-version.{key}"] = value
    kconfig = features["attributes"].get("kernel.config", {})["elements"]
    for option in config.kconfig_opts:
        if kconfig.get(option) in ("y", "m"):
            labels[f"kernel-config.{option}"] = "true"
    for key, value in features["attributes"].get("cpu.model", {})["elements"].items():
        labels[f"cpu-model.{key}"] = value
    for flag in features["flags"].get("cpu.cpuid", {})["elements"]:
        if flag not in CPUID_BLACKLIST:
            labels[f"cpu-cpuid.{flag}"] = "true"
    topology = features["attributes"].get("cpu.topology", {}).get("elements", {})
    if topology.get("hardware_multithreading") == "true":
        labels["cpu-hardware_multithreading"] = "true"
    if config.label_whitelist:
        allowed = re.compile(config.label_whitelist)
        labels = {k: v for k, v in labels.items() if allowed.search(k)}
    return {f"{DEFAULT_NS}/{k}": v for k, v in labels.items()}


def node_feature(
    node: str, namespace: str, features: Features, labels: Mapping[str, str],
    owners: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:  # fmt: skip
    """The NodeFeature object nfd-worker writes for its node."""
    meta: dict[str, Any] = {"name": node, "namespace": namespace, "labels": {NODE_NAME_LABEL: node}}
    if owners:
        meta["ownerReferences"] = [dict(o) for o in owners]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "NodeFeature",
        "metadata": meta,
        "spec": {"features": features, "labels": dict(labels)},
    }


# ----- nfd-master: NodeFeatures + rules -> node labels -----------------------------------------


def merge_features(specs: Iterable[Mapping[str, Any]]) -> tuple[Features, dict[str, str]]:
    """One node's features and labels from all its NodeFeature objects (later ones win)."""
    merged: Features = {"flags": {}, "attributes": {}, "instances": {}}
    labels: dict[str, str] = {}
    for spec in specs:
        features = spec.get("features") or {}
        for kind in merged:
            for name, value in (features.get(kind) or {}).items():
                merged[kind][name] = value
        labels.update({str(k): str(v) for k, v in (spec.get("labels") or {}).items()})
    return merged, labels


def rule_labels(rules: Iterable[Mapping[str, Any]], features: Features) -> dict[str, str]:
    """The labels of every NodeFeatureRule rule whose matchFeatures (and matchAny) match."""
    labels: dict[str, str] = {}
    for rule in rules:
        terms = rule.get("matchFeatures") or []
        alternatives = rule.get("matchAny") or []
        if terms and not all(_term_matches(t, features) for t in terms):
            continue
        if alternatives and not any(
            all(_term_matches(t, features) for t in alt.get("matchFeatures") or [])
            for alt in alternatives
        ):
            continue
        if not terms and not alternatives:
            continue
        labels.update({str(k): str(v) for k, v in (rule.get("labels") or {}).items()})
    return labels


def _term_matches(term: Mapping[str, Any], features: Features) -> bool:
    name = str(term.get("feature", ""))
    expressions = term.get("matchExpressions") or {}
    if name in features["flags"]:
        present = features["flags"][name].get("elements") or {}
        return all(_flag_matches(key, expr, key in present) for key, expr in expressions.items())
    if name in features["attributes"]:
        values = features["attributes"][name].get("elements") or {}
        return all(_value_matches(values.get(k), expr) for k, expr in expressions.items())
    if name in features["instances"]:
        return any(
            all(_value_matches(inst["attributes"].get(k), e) for k, e in expressions.items())
            for inst in features["instances"][name].get("elements") or []
        )
    return False


def _flag_matches(_key: str, expr: Mapping[str, Any], present: bool) -> bool:
    op = str((expr or {}).get("op", "Exists"))
    return present if op != "DoesNotExist" else not present


def _value_matches(value: str | None, expr: Mapping[str, Any]) -> bool:
    op = str((expr or {}).get("op", "Exists"))
    wanted = [str(v) for v in (expr or {}).get("value") or []]
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if value is None:
        return False
    if op == "In":
        return value in wanted
    if op == "NotIn":
        return value not in wanted
    if op == "InRegexp":
        return any(re.search(w, value) for w in wanted)
    if op == "IsTrue":
        return value == "true"
    if op == "IsFalse":
        return value == "false"
    try:
        number = int(value)
        bounds = [int(w) for w in wanted]
    except ValueError:
        return False
    if op == "Gt":
        return number > bounds[0]
    if op == "Lt":
        return number < bounds[0]
    if op == "GtLt":
        return bounds[0] < number < bounds[1]
    return False


def label_allowed(key: str, config: MasterConfig) -> bool:
    """nfd-master's label namespace policy."""
    namespace = key.split("/", 1)[0] if "/" in key else DEFAULT_NS
    if namespace in config.extra_label_ns:
        return True
    if namespace in (DEFAULT_NS, "profile.node.kubernetes.io") or namespace.endswith(
        "." + DEFAULT_NS
    ):
        return True
    if namespace == "kubernetes.io" or namespace.endswith(".kubernetes.io"):
        return False
    return not any(namespace == d or namespace.endswith("." + d) for d in config.deny_label_ns)


def desired_labels(
    specs: Iterable[Mapping[str, Any]], rules: Iterable[Mapping[str, Any]], config: MasterConfig
) -> dict[str, str]:
    """Every label nfd-master puts on a node, from its NodeFeatures and the rules."""
    features, labels = merge_features(specs)
    labels.update(rule_labels(rules, features))
    out: dict[str, str] = {}
    whitelist = re.compile(config.label_whitelist) if config.label_whitelist else None
    for key, value in labels.items():
        full = key if "/" in key else f"{DEFAULT_NS}/{key}"
        if not label_allowed(full, config):
            continue
        if whitelist is not None and not whitelist.search(full.split("/", 1)[1]):
            continue
        out[full] = value
    return {} if config.no_publish else out


def _short(key: str) -> str:
    return key.removeprefix(DEFAULT_NS + "/")


def owned_labels(annotations: Mapping[str, str]) -> set[str]:
    """The labels nfd-master set on a node earlier (full names)."""
    raw = annotations.get(FEATURE_LABELS_ANNOTATION) or ""
    return {k if "/" in k else f"{DEFAULT_NS}/{k}" for k in raw.split(",") if k}


def master_patch(
    labels: Mapping[str, str], annotations: Mapping[str, str], desired: Mapping[str, str]
) -> dict[str, Any]:
    """The merge patch that makes a node carry exactly nfd-master's `desired` labels ({} when
    it already does); labels it never set are left alone."""
    owned = owned_labels(annotations)
    changes: dict[str, str | None] = {k: None for k in owned - set(desired) if k in labels}
    changes.update({k: v for k, v in desired.items() if labels.get(k) != v})
    record = ",".join(sorted(_short(k) for k in desired)) or None
    metadata: dict[str, Any] = {}
    if changes:
        metadata["labels"] = changes
    if annotations.get(FEATURE_LABELS_ANNOTATION) != record:
        metadata["annotations"] = {FEATURE_LABELS_ANNOTATION: record}
    return {"metadata": metadata} if metadata else {}


def prune_patch(labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """What `nfd-master -prune` removes from a node: its labels and its annotations."""
    remove_labels = {k: None for k in owned_labels(annotations) if k in labels}
    remove_annotations = {k: None for k in annotations if k.startswith(NFD_ANNOTATION_PREFIX)}
    metadata: dict[str, Any] = {}
    if remove_labels:
        metadata["labels"] = remove_labels
    if remove_annotations:
        metadata["annotations"] = remove_annotations
    return {"metadata": metadata} if metadata else {}


def chart_crds(chart: Path) -> list[dict[str, Any]]:
    """NFD's CRDs as the chart's NFD sub-chart ships them ([] when the chart has none)."""
    path = chart / "charts" / "node-feature-discovery" / "crds" / "nfd-api-crds.yaml"
    if not path.is_file():
        return []
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def label_directly(
    nodes: Mapping[str, Path],
    patch_node: Callable[[str, dict[str, Any]], object],
    node_meta: Callable[[str], tuple[dict[str, str], dict[str, str]]],
    write_feature: Callable[[dict[str, Any]], object] | None = None,
    namespace: str = "",
) -> None:
    """The in-process demo's NFD: worker and master logic with the chart's configuration, for
    nodes whose root directories are given, without NFD pods. With `write_feature`, each node's
    NodeFeature is written first (in `namespace`), as nfd-worker does before nfd-master labels."""
    worker, master = (
        WorkerConfig.parse(CHART_WORKER_CONFIG),
        MasterConfig.parse(CHART_MASTER_CONFIG),
    )
    for name, root in nodes.items():
        features = discover(Host.of_root(root), worker)
        published = worker_labels(features, worker)
        spec = {"features": features, "labels": published}
        if write_feature is not None:
            write_feature(node_feature(name, namespace, features, published))
        labels, annotations = node_meta(name)
        patch = master_patch(labels, annotations, desired_labels([spec], [], master))
        if patch:
            patch_node(name, patch)


# ----- the API, as a Go program's client-go would use it ---------------------------------------


class ApiError(Exception):
    """A refused request: the HTTP status and the Status message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Api:
    """A small REST client for the pod's kubeconfig (server, CA, bearer token)."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = str(cluster["server"]).rstrip("/")
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self.ssl: ssl.SSLContext | bool = False
        if cluster.get("certificate-authority-data"):
            context = ssl.create_default_context(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            )
            self.ssl = context
        self.session = aiohttp.ClientSession(headers=self.headers)

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method, self.server + path, data=data, headers=headers, params=params, ssl=self.ssl
        ) as response:
            text = await response.text()
            if response.status >= 400:
                try:
                    message = json.loads(text).get("message", text)
                except ValueError:
                    message = text
                raise ApiError(response.status, message)
            return json.loads(text) if text else None

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Watch events after `resource_version` until the server ends the stream."""
        params = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "1"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(
            self.server + path, params=params, ssl=self.ssl, timeout=timeout
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.text())
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)


def _nfd_path(resource: str, namespace: str | None = None, name: str | None = None) -> str:
    path = f"/apis/{GROUP_VERSION}"
    if namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{resource}"
    return path + (f"/{name}" if name else "")


MERGE = "application/merge-patch+json"


# ----- the programs ------------------------------------------------------------------------------


@dataclass
class Programs:
    """The NFD image's programs as kubesim pod runners (register with `register`)."""

    kubeconfig_for: Callable[[PodContext], Path]
    probe_time_scale: float = 1.0
    # Shortens the worker's re-discovery and gc intervals (tests); None keeps the configured ones.
    interval_override: float | None = None

    def register(self, sim: kubesim.Cluster, image: str = IMAGE) -> None:
        """Run the NFD image's containers (any tag) on `sim`, readiness from their probes."""
        sim.register_pod_runner(self.run, image=image, reports_readiness=True)

    async def run(self, ctx: PodContext) -> int:
        """One container of the NFD image: dispatch on its command, as the image's binaries."""
        argv = [*(ctx.container.get("command") or []), *(ctx.container.get("args") or [])]
        program = Path(argv[0]).name if argv else ""
        args = argv[1:]
        try:
            if program == "nfd-master" and _flag_value(args, "prune") is not None:
                return await self.prune(ctx)
            if program == "nfd-master":
                return await self._serving(ctx, args, self.master)
            if program == "nfd-worker":
                return await self._serving(ctx, args, self.worker)
            if program == "nfd-gc":
                return await self._serving(ctx, args, self.gc)
        except ApiError as err:
            ctx.log(f"E {program}: {err}", "stderr")
            return 1
        ctx.log(f'exec: "{program}": executable file not found in $PATH', "stderr")
        return 127

    async def _serving(
        self,
        ctx: PodContext,
        args: Sequence[str],
        body: Callable[[PodContext, Sequence[str], Api], Any],
    ) -> int:
        """Serve /healthz and /metrics on -port, probe them as the kubelet would, run `body`."""
        port = int(_flag_value(args, "port") or 8080)
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text="# nfd (simulated)\n")

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/metrics", metrics)
        await ctx.serve_port(port, app)
        api = Api(self.kubeconfig_for(ctx))
        prober = asyncio.create_task(probes.Prober(ctx, time_scale=self.probe_time_scale).run())
        work = asyncio.create_task(body(ctx, args, api))
        try:
            done, _ = await asyncio.wait([prober, work], return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                return int(work.result() or 0)
            return 137 if prober.result() is probes.Verdict.KILL else 0
        finally:
            for task in (prober, work):
                task.cancel()
            await asyncio.gather(prober, work, return_exceptions=True)
            await api.close()

    # ----- nfd-worker --------------------------------------------------------------------------

    def _config(self, ctx: PodContext, name: str) -> Any:
        try:
            text = ctx.path(f"/etc/kubernetes/node-feature-discovery/{name}").read_text()
        except OSError:
            return {}
        return yaml.safe_load(text) or {}

    async def worker(self, ctx: PodContext, args: Sequence[str], api: Api) -> int:
        config = WorkerConfig.parse(self._config(ctx, "nfd-worker.conf"))
        node = ctx.env.get("NODE_NAME") or ctx.node_name
        pod = await api.request("GET", f"/api/v1/namespaces/{ctx.namespace}/pods/{ctx.name}")
        owners = [
            {k: ref[k] for k in ("apiVersion", "kind", "name", "uid")}
            for ref in pod["metadata"].get("ownerReferences") or []
            if ref.get("controller")
        ] or [{"apiVersion": "v1", "kind": "Pod", "name": ctx.name, "uid": pod["metadata"]["uid"]}]
        host = Host(
            ctx.path("/host-sys"),
            ctx.path("/host-etc/os-release"),
            ctx.path("/host-boot"),
            ctx.host_path("/proc"),
        )
        interval = self.interval_override or config.sleep_interval
        while True:
            features = discover(host, config)
            labels = {} if config.no_publish else worker_labels(features, config)
            await self._write(api, node_feature(node, ctx.namespace, features, labels, owners))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stopping.wait(), interval)
            if ctx.stopping.is_set():
                return 0

    async def _write(self, api: Api, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        path = _nfd_path("nodefeatures", meta["namespace"], meta["name"])
        try:
            current = await api.request("GET", path)
        except ApiError as err:
            if err.status != 404:
                raise
            await api.request("POST", _nfd_path("nodefeatures", meta["namespace"]), obj)
            return
        if current.get("spec") != obj["spec"]:
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            await api.request("PUT", path, obj)

    # ----- nfd-master --------------------------------------------------------------------------

    async def master(self, ctx: PodContext, args: Sequence[str], api: Api) -> int:
        config = MasterConfig.parse(self._config(ctx, "nfd-master.conf"), args)
        dirty = asyncio.Event()
        dirty.set()
        watchers = [
            asyncio.create_task(self._watch_forever(api, _nfd_path(r), dirty))
            for r in ("nodefeatures", "nodefeaturerules")
        ]
        try:
            while not ctx.stopping.is_set():
                await dirty.wait()
                dirty.clear()
                await asyncio.sleep(0.05)  # let a burst of worker writes land as one pass
                try:
                    await self._label_all(api, config)
                except ApiError as err:
                    ctx.log(f"E nfd-master: {err}", "stderr")
                    dirty.set()
                    await asyncio.sleep(1.0)
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        return 0

    async def _watch_forever(self, api: Api, path: str, dirty: asyncio.Event) -> None:
        while True:
            try:
                listed = await api.request("GET", path)
                dirty.set()
                async for _event in api.watch(path, listed["metadata"]["resourceVersion"]):
                    dirty.set()
            except (ApiError, aiohttp.ClientError, ValueError) as err:
                log.debug("nfd watch of %s ended: %s", path, err)
            await asyncio.sleep(0.5)

    async def _label_all(self, api: Api, config: MasterConfig) -> None:
        features = (await api.request("GET", _nfd_path("nodefeatures")))["items"]
        try:
            rule_objects = (await api.request("GET", _nfd_path("nodefeaturerules")))["items"]
        except ApiError:
            rule_objects = []
        rules = [r for obj in rule_objects for r in (obj.get("spec") or {}).get("rules") or []]
        by_node: dict[str, list[dict[str, Any]]] = {}
        for obj in features:
            node = (obj["metadata"].get("labels") or {}).get(NODE_NAME_LABEL)
            if node:
                by_node.setdefault(node, []).append(obj.get("spec") or {})
        for node in (await api.request("GET", "/api/v1/nodes"))["items"]:
            meta = node["metadata"]
            specs = by_node.get(meta["name"])
            if specs is None:
                continue  # no worker reported yet: leave the node as it is
            desired = desired_labels(specs, rules, config)
            patch = master_patch(meta.get("labels") or {}, meta.get("annotations") or {}, desired)
            if patch:
                await api.request("PATCH", f"/api/v1/nodes/{meta['name']}", patch,
                                  content_type=MERGE)  # fmt: skip

    async def prune(self, ctx: PodContext) -> int:
        """`nfd-master -prune`: remove nfd-master's labels and annotations from every node."""
        api = Api(self.kubeconfig_for(ctx))
        ctx.set_ready(True)
        try:
            for node in (await api.request("GET", "/api/v1/nodes"))["items"]:
                meta = node["metadata"]
                patch = prune_patch(meta.get("labels") or {}, meta.get("annotations") or {})
                if patch:
                    await api.request("PATCH", f"/api/v1/nodes/{meta['name']}", patch,
                                      content_type=MERGE)  # fmt: skip
                    ctx.log(f"I pruned node {meta['name']}")
        finally:
            await api.close()
        return 0

    # ----- nfd-gc ------------------------------------------------------------------------------

    async def gc(self, ctx: PodContext, args: Sequence[str], api: Api) -> int:
        interval = self.interval_override or duration(_flag_value(args, "gc-interval"), 3600.0)
        while not ctx.stopping.is_set():
            nodes = {n["metadata"]["name"] for n in
                     (await api.request("GET", "/api/v1/nodes"))["items"]}  # fmt: skip
            for obj in (await api.request("GET", _nfd_path("nodefeatures")))["items"]:
                meta = obj["metadata"]
                if (meta.get("labels") or {}).get(NODE_NAME_LABEL) not in nodes:
                    with contextlib.suppress(ApiError):
                        await api.request(
                            "DELETE", _nfd_path("nodefeatures", meta["namespace"], meta["name"])
                        )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stopping.wait(), interval)
        return 0
