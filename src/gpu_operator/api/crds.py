"""apiextensions.k8s.io/v1 CRDs generated from the models: structural schemas, no $ref."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpu_operator.api import clusterpolicy, computedomain, gpucluster, nvidiadriver
from gpu_operator.api.fields import TypeInfo, describe

_EXTRA_KEYS = ("format", "x-kubernetes-validations")

# Schema version marker. Every generated CRD carries SCHEMA_VERSION_ANNOTATION; the operator refuses
# to reconcile while an installed CRD is older, because the API server would prune fields it does
# not know (silently losing settings). Any schema change must bump SCHEMA_VERSION and record the new
# SCHEMA_DIGEST: tests/api/test_crds.py fails until both are updated, so a bump is never forgotten.
SCHEMA_VERSION_ANNOTATION: Final = "nvidia.com/gpu-operator-crd-version"
SCHEMA_VERSION: Final = 4
SCHEMA_DIGEST: Final = "eafaf831ae6627a7"
_AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _doc(model: type[BaseModel]) -> str | None:
    doc = inspect.getdoc(model)
    return " ".join(doc.split()) if doc else None


def _type_schema(info: TypeInfo) -> dict[str, Any]:
    if info.kind == "model":
        assert info.model is not None
        return model_schema(info.model)
    if info.kind == "list":
        assert info.item is not None
        return {"type": "array", "items": _type_schema(info.item)}
    if info.kind == "map":
        assert info.item is not None
        return {"type": "object", "additionalProperties": _type_schema(info.item)}
    if info.kind == "enum":
        return {"type": "string", "enum": list(info.enum)}
    if info.kind == "int-or-string":
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
    if info.kind == "quantity":
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": info.constraints.get("pattern")
            or r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
            r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
            "x-kubernetes-int-or-string": True,
        }
    if info.kind == "free-form":
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema: dict[str, Any] = {"type": info.kind}
    if info.kind == "integer":
        schema["format"] = "int64"
    for key in ("minimum", "maximum", "pattern"):
        if key in info.constraints:
            schema[key] = info.constraints[key]
    return schema


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model (properties inlined, never $ref)."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        info = describe(field.annotation, list(field.metadata))
        schema = _type_schema(info)
        if field.description:
            schema = {"description": field.description, **schema}
        default = field.default
        has_default = default is not PydanticUndefined and default is not None
        if has_default:
            schema["default"] = default
        elif info.optional:
            schema["nullable"] = True
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        for key in _EXTRA_KEYS:
            if key in extra:
                schema[key] = extra[key]
        if field.is_required():
            required.append(wire)
        properties[wire] = schema
    model_extra = model.model_config.get("json_schema_extra")
    crd_required = model_extra.get("crd_required") if isinstance(model_extra, dict) else None
    for extra_wire in crd_required if isinstance(crd_required, list) else []:
        if isinstance(extra_wire, str) and extra_wire not in required:
            required.append(extra_wire)
    out: dict[str, Any] = {"type": "object"}
    doc = _doc(model)
    if doc:
        out["description"] = doc
    out["properties"] = properties
    if required:
        out["required"] = required
    return out


def _root_schema(
    model: type[BaseModel],
    spec_rules: list[dict[str, str]],
    root_rules: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    root = model_schema(model)
    props = root["properties"]
    props["apiVersion"] = {"type": "string", "description": "Versioned schema of this object."}
    props["kind"] = {"type": "string", "description": "The REST resource this object represents."}
    props["metadata"] = {"type": "object"}
    if spec_rules:
        props["spec"]["x-kubernetes-validations"] = spec_rules
    required = [r for r in root.get("required", []) if r not in ("apiVersion", "kind")]
    if required:
        root["required"] = required
    else:
        root.pop("required", None)
    if root_rules:
        root["x-kubernetes-validations"] = root_rules
    return root


def _crd(
    *,
    group: str,
    version: str,
    kind: str,
    plural: str,
    model: type[BaseModel],
    short_names: list[str],
    columns: list[dict[str, str]],
    spec_rules: list[dict[str, str]],
    root_rules: list[dict[str, str]] | None = None,
    scope: str = "Cluster",
) -> dict[str, Any]:
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    if short_names:
        names["shortNames"] = short_names
    served: dict[str, Any] = {"name": version, "served": True, "storage": True}
    if columns:
        served["additionalPrinterColumns"] = columns
    served["schema"] = {"openAPIV3Schema": _root_schema(model, spec_rules, root_rules)}
    if "status" in model.model_fields:
        served["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "annotations": {SCHEMA_VERSION_ANNOTATION: str(SCHEMA_VERSION)},
        },
        "spec": {
            "group": group,
            "names": names,
            "scope": scope,
            "versions": [served],
        },
    }


def clusterpolicy_crd() -> dict[str, Any]:
    return _crd(
        group=clusterpolicy.GROUP,
        version=clusterpolicy.VERSION,
        kind=clusterpolicy.KIND,
        plural=clusterpolicy.PLURAL,
        model=clusterpolicy.ClusterPolicy,
        short_names=[],
        columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.state"},
            _AGE_COLUMN,
        ],
        spec_rules=[],
    )


def nvidiadriver_crd() -> dict[str, Any]:
    return _crd(
        group=nvidiadriver.GROUP,
        version=nvidiadriver.VERSION,
        kind=nvidiadriver.KIND,
        plural=nvidiadriver.PLURAL,
        model=nvidiadriver.NVIDIADriver,
        short_names=["nvd", "nvdriver", "nvdrivers"],
        columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.state"},
            {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
            _AGE_COLUMN,
        ],
        spec_rules=[nvidiadriver.DEFAULT_DRIVER_SELECTOR_RULE],
    )


def gpucluster_crd() -> dict[str, Any]:
    """NVIDIA's 26.x GPUCluster (the DRA stack, one per cluster named `gpu-cluster`), reconciled
    by controller/gpucluster.py; also what NVIDIA's operator watches, so it starts after a swap
    back."""
    return _crd(
        group=gpucluster.GROUP,
        version=gpucluster.VERSION,
        kind=gpucluster.KIND,
        plural=gpucluster.PLURAL,
        model=gpucluster.GPUCluster,
        short_names=["gc"],
        columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.state"},
            _AGE_COLUMN,
        ],
        spec_rules=[],
        root_rules=[gpucluster.SINGLETON_RULE],
    )


def computedomain_crd() -> dict[str, Any]:
    """NVIDIA's DRA driver's ComputeDomain (namespaced), which a GPUCluster's compute-domain
    controller reconciles."""
    return _crd(
        group=computedomain.GROUP,
        version=computedomain.VERSION,
        kind=computedomain.KIND,
        plural=computedomain.PLURAL,
        model=computedomain.ComputeDomain,
        short_names=[],
        columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.status"},
            {"name": "Nodes", "type": "integer", "jsonPath": ".spec.numNodes"},
            _AGE_COLUMN,
        ],
        spec_rules=[],
        scope="Namespaced",
    )


def computedomainclique_crd() -> dict[str, Any]:
    """The nodes of one NVLink partition taking part in a ComputeDomain (namespaced)."""
    return _crd(
        group=computedomain.GROUP,
        version=computedomain.VERSION,
        kind=computedomain.CLIQUE_KIND,
        plural=computedomain.CLIQUE_PLURAL,
        model=computedomain.ComputeDomainClique,
        short_names=[],
        columns=[],
        spec_rules=[],
        scope="Namespaced",
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """Every CRD we own, keyed by upstream's file name."""
    return {
        "nvidia.com_clusterpolicies.yaml": clusterpolicy_crd(),
        "nvidia.com_gpuclusters.yaml": gpucluster_crd(),
        "nvidia.com_nvidiadrivers.yaml": nvidiadriver_crd(),
        # NVIDIA's DRA driver's compute-domain kinds (namespaced), which a GPUCluster uses.
        "resource.nvidia.com_computedomains.yaml": computedomain_crd(),
        "resource.nvidia.com_computedomaincliques.yaml": computedomainclique_crd(),
    }


def schema_digest(crds: Mapping[str, Mapping[str, Any]]) -> str:
    """A short hash of the CRD specs (annotations excluded): it changes whenever the schema does."""
    specs = {name: crd["spec"] for name, crd in sorted(crds.items())}
    canonical = json.dumps(specs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class InstalledSchema:
    """How an installed CRD's schema version compares with the one this operator generates."""

    name: str
    installed: int | None
    expected: int
    problem: str | None = None

    @property
    def older(self) -> bool:
        """True when reconciling could lose fields: no marker, an unreadable one, or a lower one."""
        return self.installed is None or self.installed < self.expected

    @property
    def message(self) -> str:
        if not self.older:
            return f"CRD {self.name} has schema version {self.installed} (ours: {self.expected})"
        found = self.problem or f"schema version {self.installed}"
        if self.installed is None and self.problem and self.problem.startswith("no "):
            found += " (NVIDIA's operator installs its CRDs without one)"
        return (
            f"CRD {self.name} has {found}, older than the operator's {self.expected}: "
            "fields it does not know would be pruned; replace the CRDs with ours: "
            "`gpu-operator crds --apply` (or `gpu-operator adopt --dry-run --apply-crds`, which "
            "also shows what adopting the operands does; the Helm chart does this before each "
            "upgrade; docs/swap-in.md)"
        )


def installed_schema(crd: Mapping[str, Any]) -> InstalledSchema:
    """Read the schema version marker of an installed CRD object (as returned by the API)."""
    metadata = crd.get("metadata") or {}
    name = str(metadata.get("name") or "<unnamed>")
    raw = (metadata.get("annotations") or {}).get(SCHEMA_VERSION_ANNOTATION)
    if raw is None:
        return InstalledSchema(name, None, SCHEMA_VERSION, f"no {SCHEMA_VERSION_ANNOTATION} marker")
    try:
        version = int(str(raw).strip())
    except ValueError:
        problem = f"an unreadable {SCHEMA_VERSION_ANNOTATION} marker {raw!r}"
        return InstalledSchema(name, None, SCHEMA_VERSION, problem)
    return InstalledSchema(name, version, SCHEMA_VERSION)


def is_older(crd: Mapping[str, Any]) -> bool:
    """Whether an installed CRD's schema is older than the one this operator generates."""
    return installed_schema(crd).older
