"""`gpu-operator validate` refuses what the API server would, and checks the MIG and
device-plugin ConfigMaps a ClusterPolicy names, given with -f or read with --kubeconfig."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import kubesim
from gpu_operator.cli import app
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import config_maps

runner = CliRunner()
HEAD = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\n"
GOOD_MIG = """version: v1
mig-configs:
  halves:
    - {devices: all, mig-enabled: true, mig-devices: {"3g.40gb": 2}}
"""


def _write(tmp_path: Path, name: str, docs: list[dict[str, Any]] | str) -> str:
    path = tmp_path / name
    path.write_text(docs if isinstance(docs, str) else yaml.safe_dump_all(docs))
    return str(path)


def _policy(**spec: Any) -> dict[str, Any]:
    """The example default policy, named cp, with `spec` sections merged in."""
    text = (Path(__file__).parents[1] / "examples" / "clusterpolicy-default.yaml").read_text()
    policy = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "ClusterPolicy")
    policy["metadata"] = {"name": "cp"}
    for section, value in spec.items():
        policy["spec"].setdefault(section, {}).update(value)
    return policy


def _config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["validate", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        (
            "spec: {operator: {runtimeClass: NVIDIA_custom}}\n",
            "spec.operator.runtimeClass",
            'Invalid value: "NVIDIA_custom": RuntimeClass name: a lowercase RFC 1123 subdomain',
        ),
        (
            "spec: {devicePlugin: {config: {name: Plugin_Config}}}\n",
            "spec.devicePlugin.config.name",
            'Invalid value: "Plugin_Config": ConfigMap name: a lowercase RFC 1123 subdomain',
        ),
        (
            f"spec: {{daemonsets: {{priorityClassName: {'p' * 300}}}}}\n",
            "spec.daemonsets.priorityClassName",
            "PriorityClass name: must be no more than 253 characters",
        ),
        (
            "spec: {driver: {readinessProbe: {periodSeconds: 18446744073709551616}}}\n",
            "spec.driver.readinessProbe.periodSeconds",
            "Invalid value: 18446744073709551616: must be at most 2147483647",
        ),
        (
            'spec: {toolkit: {env: [{name: "A\\0B", value: "1"}]}}\n',
            "spec.toolkit.env[0].name",
            "must consist only of printable ASCII characters other than '='",
        ),
    ],
)
def test_values_the_api_server_refuses_are_not_valid(
    tmp_path: Path, spec: str, path: str, message: str
) -> None:
    code, out, err = _run("-f", _write(tmp_path, "cp.yaml", HEAD + spec))
    assert code == 1
    assert any(
        f"ClusterPolicy/cp: {path}: " in line and message in line for line in out.splitlines()
    )
    assert "valid" not in err.split("warning")[-1]


def test_a_300_kb_annotation_is_too_long(tmp_path: Path) -> None:
    policy = _policy()
    policy["metadata"]["annotations"] = {"note": "x" * 300_000}
    code, out, _ = _run("-f", _write(tmp_path, "cp.yaml", [policy]))
    assert code == 1
    assert "ClusterPolicy/cp: metadata.annotations: Too long: must have at most 262144 bytes" in out


def test_a_referenced_mig_config_with_an_unknown_profile_fails_the_policy(tmp_path: Path) -> None:
    bad = GOOD_MIG.replace("3g.40gb", "3g.41gb")
    policy = _write(tmp_path, "cp.yaml", [_policy(migManager={"config": {"name": "custom"}})])
    cm = _write(tmp_path, "cm.yaml", [_config_map("custom", {"config.yaml": bad})])
    code, out, _ = _run("-f", policy, "-f", cm)
    assert code == 1
    assert (
        f"{policy}: ClusterPolicy/cp: ConfigMap/custom: data.config.yaml: "
        "mig-configs.halves[0].mig-devices.3g.41gb: unknown MIG profile '3g.41gb'"
    ) in out
    assert out.count("3g.41gb'") == 1  # checked once, as the policy's config


def test_a_referenced_mig_config_must_use_the_config_yaml_key(tmp_path: Path) -> None:
    docs = [
        _policy(migManager={"config": {"name": "custom"}}),
        _config_map("custom", {"mig.yaml": GOOD_MIG}),
    ]
    code, out, _ = _run("-f", _write(tmp_path, "all.yaml", docs))
    assert code == 1
    assert "ConfigMap/custom: data.config.yaml: required: the MIG manager reads" in out


def test_a_referenced_good_mig_config_keeps_the_policy_valid(tmp_path: Path) -> None:
    docs = [
        _policy(migManager={"config": {"name": "custom"}}),
        _config_map("custom", {"config.yaml": GOOD_MIG}),
    ]
    code, out, err = _run("-f", _write(tmp_path, "all.yaml", docs))
    assert (code, out) == (0, ""), out
    assert "ClusterPolicy/cp: valid" in err


def test_a_malformed_device_plugin_config_fails_the_policy(tmp_path: Path) -> None:
    docs = [
        _policy(devicePlugin={"config": {"name": "plugin", "default": "any"}}),
        _config_map(
            "plugin",
            {
                "any": "version: v1\nflags: {migStrategy: single}\n",
                "sliced": "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu,"
                " replicas: zero}]}}\n",
            },
        ),
    ]
    code, out, _ = _run("-f", _write(tmp_path, "all.yaml", docs))
    assert code == 1
    (line,) = out.splitlines()
    assert "ConfigMap/plugin: data.sliced: " in line
    assert "replicas" in line


def test_the_device_plugin_default_must_be_a_key(tmp_path: Path) -> None:
    docs = [
        _policy(devicePlugin={"config": {"name": "plugin", "default": "missing"}}),
        _config_map("plugin", {"any": "version: v1\n"}),
    ]
    code, out, _ = _run("-f", _write(tmp_path, "all.yaml", docs))
    assert code == 1
    assert (
        "spec.devicePlugin.config.default: 'missing' is not a key of ConfigMap/plugin (keys: any)"
    ) in out


def test_a_referenced_config_map_not_given_is_not_checked_without_a_cluster(
    tmp_path: Path,
) -> None:
    policy = _write(tmp_path, "cp.yaml", [_policy(devicePlugin={"config": {"name": "plugin"}})])
    code, out, _ = _run("-f", policy)
    assert (code, out) == (0, "")


def test_kubeconfig_needs_a_namespace(tmp_path: Path) -> None:
    policy = _write(tmp_path, "cp.yaml", [_policy()])
    code, _, err = _run("-f", policy, "--kubeconfig", str(tmp_path / "kc"))
    assert code == 2
    assert "--kubeconfig needs --namespace" in err


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster() as cluster:
        yield cluster


async def test_kubeconfig_reads_the_named_config_maps_from_the_cluster(
    sim: kubesim.Cluster, tmp_path: Path
) -> None:
    api = kube_client.connect(str(sim.kubeconfig_path))
    try:
        body = _config_map("plugin", {"any": "version: v7\n"})
        body["metadata"]["namespace"] = "default"
        await api.create(config_maps.CONFIG_MAP(body))
    finally:
        await api.close()
    policy = _policy(
        devicePlugin={"config": {"name": "plugin"}}, migManager={"config": {"name": "gone"}}
    )
    path = _write(tmp_path, "cp.yaml", [policy])
    # A real process: the command runs its own event loop.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_operator", "validate", "-f", path,
        "--kubeconfig", str(sim.kubeconfig_path), "-n", "default",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err.decode()
    lines = out.decode().splitlines()
    assert any(
        "ClusterPolicy/cp: ConfigMap/plugin: data.any: version: unknown version 'v7'" in line
        for line in lines
    )
    assert any(
        "spec.migManager.config.name: ConfigMap 'gone' not found in namespace default" in line
        for line in lines
    )
