"""What the API server refuses in names, env, probes and annotations, in its own words."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import apiserver_limits

SUBDOMAIN = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"


def _cp(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"kind": "ClusterPolicy", "metadata": {"name": "cp", **meta}, "spec": spec}


def _paths(doc: dict[str, Any]) -> dict[str, str]:
    return dict(apiserver_limits.check(doc))


@pytest.mark.parametrize("name", ["nvidia", "nvidia-custom", "a.b-c", "a" * 253])
def test_valid_subdomains_pass(name: str) -> None:
    assert apiserver_limits.dns1123_subdomain(name) == []


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Nvidia", SUBDOMAIN),
        ("nvidia_custom", SUBDOMAIN),
        ("-x", SUBDOMAIN),
        ("a" * 254, "must be no more than 253 characters"),
    ],
)
def test_invalid_subdomains_get_the_api_server_message(name: str, message: str) -> None:
    assert any(message in problem for problem in apiserver_limits.dns1123_subdomain(name))


def test_invalid_runtime_class_is_reported() -> None:
    found = _paths(_cp({"operator": {"runtimeClass": "NVIDIA"}}))
    assert found["spec.operator.runtimeClass"].startswith('Invalid value: "NVIDIA": RuntimeClass')


def test_long_priority_class_is_reported() -> None:
    found = _paths(_cp({"daemonsets": {"priorityClassName": "p" * 300}}))
    assert "must be no more than 253 characters" in found["spec.daemonsets.priorityClassName"]


@pytest.mark.parametrize(
    "path",
    [
        ("devicePlugin", "config", "name"),
        ("migManager", "config", "name"),
        ("dcgmExporter", "config", "name"),
        ("driver", "licensingConfig", "secretName"),
    ],
)
def test_invalid_configmap_or_secret_names_are_reported(path: tuple[str, ...]) -> None:
    spec: dict[str, Any] = {}
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = "Bad_Name"
    found = _paths(_cp(spec))
    kind = "Secret" if path[-1] == "secretName" else "ConfigMap"
    assert f"{kind} name: {SUBDOMAIN}" in found["spec." + ".".join(path)]


def test_probe_beyond_int32_is_reported_without_quotes() -> None:
    found = _paths(_cp({"driver": {"startupProbe": {"periodSeconds": 2**64}}}))
    assert found["spec.driver.startupProbe.periodSeconds"].startswith(
        f"Invalid value: {2**64}: must be at most 2147483647"
    )
    assert _paths(_cp({"driver": {"startupProbe": {"periodSeconds": 2**31 - 1}}})) == {}


@pytest.mark.parametrize("name", ["A\0B", "A=B", "tab\there", "ünïcode"])
def test_env_names_outside_printable_ascii_are_reported(name: str) -> None:
    found = _paths(_cp({"validator": {"plugin": {"env": [{"name": name, "value": "1"}]}}}))
    assert (
        "must consist only of printable ASCII characters other than '='"
        in (found["spec.validator.plugin.env[0].name"])
    )


def test_relaxed_env_names_pass() -> None:
    # Since Kubernetes 1.34 names like these are accepted (RelaxedEnvironmentVariableValidation).
    assert _paths(_cp({"toolkit": {"env": [{"name": "1-a.b:c", "value": "1"}]}})) == {}


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (_cp({}, annotations={"a": "x" * 300_000}), "metadata.annotations"),
        (_cp({"daemonsets": {"annotations": {"a": "x" * 300_000}}}), "spec.daemonsets.annotations"),
    ],
)
def test_annotations_over_256_kib_are_too_long(doc: dict[str, Any], path: str) -> None:
    assert _paths(doc)[path] == "Too long: must have at most 262144 bytes (got 300001)"


def test_annotations_at_the_limit_pass() -> None:
    assert _paths(_cp({}, annotations={"a": "x" * (262_144 - 1)})) == {}


def test_nvidiadriver_fields_are_checked() -> None:
    doc = {
        "kind": "NVIDIADriver",
        "metadata": {"name": "d"},
        "spec": {
            "priorityClassName": "P",
            "repoConfig": {"name": "R"},
            "livenessProbe": {"timeoutSeconds": 2**40},
        },
    }
    assert set(_paths(doc)) == {
        "spec.priorityClassName",
        "spec.repoConfig.name",
        "spec.livenessProbe.timeoutSeconds",
    }
