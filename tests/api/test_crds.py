"""The generated CRDs: committed copies in sync, structural, valid for Kubernetes 1.35, and
able to hold any model instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpu_operator.api import ClusterPolicy, NVIDIADriver, crds, structural
from gpu_operator.api.fields import TypeInfo, describe
from gpu_operator.api.gpucluster import GPUCluster

ROOT = Path(__file__).resolve().parents[2]
GENERATED = crds.all_crds()


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("filename", sorted(GENERATED))
def test_committed_crds_match_the_generator(filename: str) -> None:
    committed = yaml.safe_load((ROOT / "deploy" / "crds" / filename).read_text())
    assert committed == GENERATED[filename], (
        f"deploy/crds/{filename} is stale: run `gpu-operator crds --out deploy/crds`"
    )


@pytest.mark.parametrize("filename", sorted(GENERATED))
def test_crd_is_valid_for_kubernetes_1_35(filename: str) -> None:
    kubernetes_validate.validate(GENERATED[filename], "1.35.0", strict=True)


@pytest.mark.parametrize("filename", sorted(GENERATED))
def test_schema_is_structural(filename: str) -> None:
    assert structural.check(schema_of(GENERATED[filename])) == []


def test_structural_checker_catches_violations() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"description": "no type"},
            "b": {"$ref": "#/x", "type": "string"},
            "c": {"type": "integer", "x-kubernetes-int-or-string": True},
            "d": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
            "e": {"type": "string", "default": 3},
            "f": {"type": "array"},
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
        },
        "required": ["zz"],
    }
    found = "\n".join(structural.check(bad))
    for expected in ("properties.a: type must be set", "$ref is not allowed",
                     "must not set a type", "mutually exclusive", "is not of type string",
                     "needs exactly one items schema", "only name and generateName",
                     "required property zz"):  # fmt: skip
        assert expected in found


def test_names_scope_columns_and_subresources() -> None:
    cp = GENERATED["nvidia.com_clusterpolicies.yaml"]
    nvd = GENERATED["nvidia.com_nvidiadrivers.yaml"]
    assert cp["metadata"]["name"] == "clusterpolicies.nvidia.com"
    assert nvd["metadata"]["name"] == "nvidiadrivers.nvidia.com"
    for crd in (cp, nvd):
        assert crd["spec"]["scope"] == "Cluster"
        assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert [c["name"] for c in cp["spec"]["versions"][0]["additionalPrinterColumns"]] == [
        "Status",
        "Age",
    ]
    assert [c["name"] for c in nvd["spec"]["versions"][0]["additionalPrinterColumns"]] == [
        "Status",
        "Default",
        "Age",
    ]
    assert nvd["spec"]["names"]["shortNames"] == ["nvd", "nvdriver", "nvdrivers"]
    assert cp["spec"]["versions"][0]["name"] == "v1"
    assert nvd["spec"]["versions"][0]["name"] == "v1alpha1"


def test_clusterpolicy_schema_details() -> None:
    spec = schema_of(GENERATED["nvidia.com_clusterpolicies.yaml"])["properties"]["spec"]
    assert spec["required"] == ["operator", "daemonsets", "driver", "toolkit", "devicePlugin",
                                "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd"]  # fmt: skip
    max_unavailable = spec["properties"]["driver"]["properties"]["upgradePolicy"]["properties"][
        "maxUnavailable"
    ]
    assert max_unavailable["x-kubernetes-int-or-string"] is True
    assert max_unavailable["default"] == "25%"
    assert "type" not in max_unavailable
    kata_config = spec["properties"]["kataManager"]["properties"]["config"]
    assert kata_config["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["properties"]["mig"]["nullable"] is True
    status = schema_of(GENERATED["nvidia.com_clusterpolicies.yaml"])["properties"]["status"]
    assert status["properties"]["state"]["enum"] == ["ignored", "ready", "notReady"]


def test_nvidiadriver_schema_details() -> None:
    spec = schema_of(GENERATED["nvidia.com_nvidiadrivers.yaml"])["properties"]["spec"]
    assert spec["required"] == ["default", "driverType", "image"]
    assert spec["properties"]["image"]["default"] == "nvcr.io/nvidia/driver"
    assert spec["properties"]["driverType"]["x-kubernetes-validations"][0]["rule"] == (
        "self == oldSelf"
    )
    assert "nodeSelector" in spec["x-kubernetes-validations"][0]["rule"]


# --- property test: any model instance serialises to an object its own schema accepts ---


def strategy(info: TypeInfo, depth: int = 0) -> st.SearchStrategy[Any]:
    if info.kind == "model":
        assert info.model is not None
        return model_strategy(info.model, depth + 1)
    if info.kind == "list":
        assert info.item is not None
        return st.lists(strategy(info.item, depth), max_size=2 if depth < 4 else 0)
    if info.kind == "map":
        assert info.item is not None
        keys = st.from_regex(r"^[a-z]{1,8}$", fullmatch=True)
        return st.dictionaries(keys, strategy(info.item, depth), max_size=2)
    if info.kind == "enum":
        return st.sampled_from(info.enum)
    if info.kind == "boolean":
        return st.booleans()
    if info.kind == "integer":
        return st.integers(
            min_value=info.constraints.get("minimum", -(2**31)),
            max_value=info.constraints.get("maximum", 2**31),
        )
    if info.kind == "string":
        pattern = info.constraints.get("pattern")
        if pattern:
            return st.from_regex(pattern, fullmatch=True)
        return st.text(max_size=8)
    if info.kind == "int-or-string":
        return st.one_of(st.integers(min_value=0, max_value=100), st.text(max_size=5))
    if info.kind == "quantity":
        return st.sampled_from(["1", "500m", "2Gi", 4, "1.5"])
    return st.just({"free": {"form": [1, "x"]}})


def model_strategy(model: type[BaseModel], depth: int) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for name, field in model.model_fields.items():
        if name in ("apiVersion", "kind"):
            continue
        if name == "metadata":
            required[name] = st.just({"name": "example"})
            continue
        info = describe(field.annotation, list(field.metadata))
        target = required if field.is_required() else optional
        target[field.alias or name] = strategy(info, depth)
    if depth > 5:
        optional = {}
    return st.fixed_dictionaries(required, optional=optional)


@pytest.mark.parametrize(
    ("model", "filename"),
    [(ClusterPolicy, "nvidia.com_clusterpolicies.yaml"),
     (NVIDIADriver, "nvidia.com_nvidiadrivers.yaml"),
     (GPUCluster, "nvidia.com_gpuclusters.yaml")],
)  # fmt: skip
def test_any_instance_validates_against_its_own_schema(
    model: type[ClusterPolicy] | type[NVIDIADriver] | type[GPUCluster], filename: str
) -> None:
    validator = jsonschema.Draft7Validator(schema_of(GENERATED[filename]))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(model_strategy(model, 0))
    def check(raw: dict[str, Any]) -> None:
        instance = model.model_validate(raw)
        errors = [e.message for e in validator.iter_errors(instance.to_dict())]
        assert errors == []

    check()


# --- schema version marker ---


@pytest.mark.parametrize("filename", sorted(GENERATED))
def test_every_crd_carries_the_schema_version_marker(filename: str) -> None:
    annotations = GENERATED[filename]["metadata"]["annotations"]
    assert annotations[crds.SCHEMA_VERSION_ANNOTATION] == str(crds.SCHEMA_VERSION)


def test_schema_changes_come_with_a_version_bump() -> None:
    assert crds.schema_digest(GENERATED) == crds.SCHEMA_DIGEST, (
        "the CRD schema changed: bump SCHEMA_VERSION and set SCHEMA_DIGEST to "
        f"{crds.schema_digest(GENERATED)!r} in src/gpu_operator/api/crds.py"
    )


def test_schema_digest_ignores_annotations_but_not_the_schema() -> None:
    relabelled = {k: {**v, "metadata": {"name": "x"}} for k, v in GENERATED.items()}
    assert crds.schema_digest(relabelled) == crds.schema_digest(GENERATED)
    changed = yaml.safe_load(yaml.safe_dump(GENERATED))
    schema_of(changed["nvidia.com_clusterpolicies.yaml"])["properties"]["spec"]["properties"][
        "extra"
    ] = {"type": "string"}
    assert crds.schema_digest(changed) != crds.schema_digest(GENERATED)


def installed(annotation: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "clusterpolicies.nvidia.com"}
    if annotation is not None:
        meta["annotations"] = {crds.SCHEMA_VERSION_ANNOTATION: annotation}
    return {"kind": "CustomResourceDefinition", "metadata": meta, "spec": {}}


@pytest.mark.parametrize(
    ("annotation", "older", "installed_version"),
    [
        (None, True, None),  # upstream's CRDs or ours before markers
        ("0", True, 0),
        (str(crds.SCHEMA_VERSION), False, crds.SCHEMA_VERSION),
        (str(crds.SCHEMA_VERSION + 1), False, crds.SCHEMA_VERSION + 1),  # a newer operator's
        ("v2", True, None),
    ],
)
def test_installed_schema_compares_markers(
    annotation: str | None, older: bool, installed_version: int | None
) -> None:
    found = crds.installed_schema(installed(annotation))
    assert found.older is older
    assert crds.is_older(installed(annotation)) is older
    assert found.installed == installed_version
    assert found.expected == crds.SCHEMA_VERSION
    if older:
        assert "gpu-operator crds --apply" in found.message
        assert "clusterpolicies.nvidia.com" in found.message


def test_unreadable_and_missing_markers_are_explained() -> None:
    assert (
        "no nvidia.com/gpu-operator-crd-version marker"
        in crds.installed_schema(installed(None)).message
    )
    assert "unreadable" in crds.installed_schema(installed("v2")).message
    assert crds.installed_schema({"metadata": {}}).name == "<unnamed>"


def test_the_generated_crds_are_not_older_than_themselves() -> None:
    assert not any(crds.is_older(crd) for crd in GENERATED.values())


def test_the_gpucluster_crd_is_nvidias_singleton_shape() -> None:
    crd = GENERATED["nvidia.com_gpuclusters.yaml"]
    assert crd["metadata"]["name"] == "gpuclusters.nvidia.com"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == ["gc"]
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    root = version["schema"]["openAPIV3Schema"]
    assert root["x-kubernetes-validations"] == [
        {"rule": "self.metadata.name == 'gpu-cluster'",
         "message": "GPUCluster is a singleton, metadata.name must be 'gpu-cluster'"}
    ]  # fmt: skip
    spec = root["properties"]["spec"]
    assert spec["required"] == ["draDriver"]
    dra = spec["properties"]["draDriver"]["properties"]
    assert dra["computeDomains"]["properties"]["enabled"]["default"] is True
    port = dra["gpus"]["properties"]["kubeletPlugin"]["properties"]["healthcheck"]["properties"]
    assert (port["port"]["minimum"], port["port"]["maximum"]) == (1, 65535)
    host = spec["properties"]["hostPaths"]["properties"]
    assert host["kubeletRootDir"]["default"] == "/var/lib/kubelet"
    # The sections ClusterPolicy shares carry no server-side default NVIDIA's lack (an `enabled`
    # default would switch DCGM on for NVIDIA's operator after a swap back).
    assert "default" not in spec["properties"]["dcgm"]["properties"]["enabled"]
    assert "default" not in spec["properties"]["dcgmExporter"]["properties"]["enabled"]
