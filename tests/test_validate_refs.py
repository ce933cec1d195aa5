"""`gpu-operator validate` refuses what the API server would, and checks the ConfigMaps a
ClusterPolicy or NVIDIADriver names (one table: validate_refs.py), given with -f or read with
--kubeconfig, with the rules of the agents that read them."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import kubesim
from gpu_operator import api
from gpu_operator.cli import app, render
from gpu_operator.controller import validate_refs
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import config_maps
from gpu_operator.operands import registry
from gpu_operator.operands.facts import ClusterFacts

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
    assert (
        "ClusterPolicy/cp: spec.migManager.config.name: ConfigMap custom in the operator's "
        "namespace has no key config.yaml (its keys: mig.yaml): the MIG manager reads key "
        "config.yaml only: rename key mig.yaml to config.yaml"
    ) in out


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
        "spec.devicePlugin.config.default: missing is not a key of ConfigMap plugin in the "
        "operator's namespace (its keys: any): the config manager has no config of that name for "
        "nodes without the nvidia.com/device-plugin.config label"
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
        "spec.migManager.config.name: ConfigMap gone not found in namespace default: create "
        "ConfigMap gone in namespace default with key config.yaml" in line
        for line in lines
    )


# ----- one table of every ConfigMap reference (issue 30, items 7, 9, 10) ----------------------

# The ConfigMaps of seed document 002, as it prints them: a device-plugin config in the guides'
# shorthand, and an exporter counters list under the key `metrics.csv`.
SEED_002 = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: device-plugin-config
  namespace: gpu-operator
data:
  config.yaml: |
    version: v1
    sharing:
      timeSlicing:
        replicas: 4
    mig:
      strategy: mixed
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: dcgm-exporter-config
  namespace: gpu-operator
data:
  metrics.csv: |
    # GPU utilization
    DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization
    # Memory usage
    DCGM_FI_DEV_FB_USED, gauge, GPU memory used
    DCGM_FI_DEV_FB_FREE, gauge, GPU memory free
"""
# Seed document 004's custom resource, exactly as the page prints it (its indentation lost).
SEED_004 = """\
# Example: GPUClusterPolicy Custom Resource
apiVersion: gpu.nvidia.com/v1
kind: GPUClusterPolicy
metadata:
name: gpu-cluster-policy
spec:
# This tells the operator to manage the driver installation
driver:
enabled: true
# Specify the desired driver version
version: "470.82.01"
# This tells the operator to manage the CUDA toolkit
cuda:
enabled: true
# Specify the desired CUDA version
version: "11.4"
# This tells the operator to manage the device plugin
devicePlugin:
enabled: true
# This tells the operator to manage the MIG manager (if applicable)
migManager:
enabled: false
"""
# Every ConfigMap field of a ClusterPolicy, each naming its own ConfigMap.
EVERY_REF: dict[str, Any] = {
    "devicePlugin": {"config": {"name": "cm-plugin", "default": "a"}},
    "dcgmExporter": {"config": {"name": "cm-metrics"}},
    "migManager": {"config": {"name": "cm-mig"}, "gpuClientsConfig": {"name": "cm-clients"}},
    "driver": {
        "repoConfig": {"configMapName": "cm-repo"},
        "certConfig": {"name": "cm-cert"},
        "kernelModuleConfig": {"name": "cm-modules"},
        "licensingConfig": {"configMapName": "cm-licence", "nlsEnabled": True},
        "virtualTopology": {"config": "cm-topology"},
    },
}
SANDBOX_REFS: dict[str, Any] = {
    "sandboxWorkloads": {"enabled": True},
    "vgpuManager": {
        "enabled": True, "repository": "nvcr.io/nvidia", "image": "vgpu-manager",
        "version": "580.95.05", "kernelModuleConfig": {"name": "cm-vgpu-modules"},
    },
    "vgpuDeviceManager": {"enabled": True, "config": {"name": "cm-vgpu-devices"}},
}  # fmt: skip


def _model(**spec: Any) -> api.ClusterPolicy:
    body: dict[str, Any] = {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cp"},
        "spec": {"operator": {}, "daemonsets": {}, "driver": {}, "toolkit": {},
                 "devicePlugin": {}, "dcgmExporter": {}, "dcgm": {"enabled": False},
                 "nodeStatusExporter": {}, "gfd": {}, **spec},
    }  # fmt: skip
    return api.ClusterPolicy.model_validate(body)


def _facts(keys: dict[str, tuple[str, ...]], **extra: Any) -> ClusterFacts:
    """The operator's facts (every ConfigMap of the namespace known) holding these ConfigMaps."""
    facts = render.cluster_facts(render.parse_facts({}))
    return dataclasses.replace(facts, config_map_keys=keys, config_maps_complete=True, **extra)


def _mounted(policy: api.ClusterPolicy, facts: ClusterFacts) -> set[tuple[str, str]]:
    """(state, ConfigMap) for every `cm-*` ConfigMap a rendered DaemonSet mounts."""
    found = set()
    for state in registry.render_all(policy, facts):
        assert state.error is None, state.error
        for obj in state.objects:
            if obj["kind"] != "DaemonSet":
                continue
            for volume in obj["spec"]["template"]["spec"].get("volumes") or []:
                name = (volume.get("configMap") or {}).get("name", "")
                if name.startswith("cm-"):
                    found.add((state.name, name))
    return found


@pytest.mark.parametrize("spec", [EVERY_REF, SANDBOX_REFS], ids=["operands", "sandbox"])
def test_the_table_names_exactly_the_config_maps_the_operands_mount(spec: dict[str, Any]) -> None:
    policy = _model(**spec)
    refs = validate_refs.references(policy.to_dict())
    keys = {r.name: r.keys or ((r.default_key,) if r.default_key else ("x",)) for r in refs}
    facts = _facts(keys)
    assert validate_refs.check_facts(policy, facts).problems == []
    table = {(state, ref.name) for ref in refs for state in ref.states}
    assert _mounted(policy, facts) == table


@pytest.mark.parametrize(
    ("spec", "state", "fix"),
    [
        ({"devicePlugin": {"config": {"name": "cm", "default": "any"}}}, "state-device-plugin",
         "spec.devicePlugin.config.name: ConfigMap cm not found in namespace gpu-operator: "
         "create ConfigMap cm in namespace gpu-operator with key any (a device-plugin config)"),
        ({"dcgmExporter": {"config": {"name": "cm"}}}, "state-dcgm-exporter",
         "spec.dcgmExporter.config.name: ConfigMap cm not found in namespace gpu-operator: "
         "create ConfigMap cm in namespace gpu-operator with key dcgm-metrics.csv"),
        ({"migManager": {"config": {"name": "cm"}}}, "state-mig-manager",
         "spec.migManager.config.name: ConfigMap cm not found in namespace gpu-operator: "
         "create ConfigMap cm in namespace gpu-operator with key config.yaml"),
        ({"driver": {"kernelModuleConfig": {"name": "cm"}}}, "state-driver",
         "spec.driver.kernelModuleConfig.name: ConfigMap cm not found in namespace "
         "gpu-operator: create ConfigMap cm in namespace gpu-operator with one key per file to "
         "mount"),
        ({"driver": {"licensingConfig": {"configMapName": "cm", "nlsEnabled": True}}},
         "state-driver",
         "spec.driver.licensingConfig.configMapName: ConfigMap cm not found in namespace "
         "gpu-operator: create ConfigMap cm in namespace gpu-operator with keys gridd.conf and "
         "client_configuration_token.tok"),
    ],
)  # fmt: skip
def test_a_missing_config_map_holds_its_states_back_with_the_fix(
    spec: dict[str, Any], state: str, fix: str
) -> None:
    report = validate_refs.check_facts(_model(**spec), _facts({}))
    [problem] = report.problems
    assert (problem.reason, problem.message) == ("ConfigMapNotFound", fix)
    assert report.blocked[state] == fix
    assert report.notes == []


def test_the_device_plugin_config_holds_back_every_pod_that_mounts_it() -> None:
    report = validate_refs.check_facts(
        _model(devicePlugin={"config": {"name": "time-slicing-config", "default": "any"}}),
        _facts({}),
    )
    assert set(report.blocked) == {
        "state-device-plugin", "gpu-feature-discovery", "state-mps-control-daemon"
    }  # fmt: skip
    assert len(report.problems) == 1  # one problem, one Event


def test_a_disabled_operands_config_map_is_not_needed() -> None:
    policy = _model(dcgmExporter={"enabled": False, "config": {"name": "cm"}})
    assert validate_refs.check_facts(policy, _facts({})).problems == []


def test_a_key_the_reader_needs_is_missing() -> None:
    policy = _model(dcgmExporter={"config": {"name": "dcgm-exporter-config"}})
    report = validate_refs.check_facts(policy, _facts({"dcgm-exporter-config": ("metrics.csv",)}))
    [problem] = report.problems
    assert problem.reason == "ConfigMapKeyMissing"
    assert problem.message == (
        "spec.dcgmExporter.config.name: ConfigMap dcgm-exporter-config in namespace gpu-operator "
        "has no key dcgm-metrics.csv (its keys: metrics.csv): the DCGM exporter reads key "
        "dcgm-metrics.csv only: rename key metrics.csv to dcgm-metrics.csv"
    )
    fixed = _facts({"dcgm-exporter-config": ("dcgm-metrics.csv",)})
    assert validate_refs.check_facts(policy, fixed).problems == []


def test_offline_a_config_map_not_given_is_a_note_not_a_problem() -> None:
    policy = _model(dcgmExporter={"config": {"name": "custom-dcgm-metrics"}})
    facts = dataclasses.replace(_facts({}), config_maps_complete=False)
    report = validate_refs.check_facts(policy, facts)
    assert report.problems == []
    [note] = report.notes
    assert note.reason == "ConfigMapNotGiven"
    assert note.message.startswith(
        "spec.dcgmExporter.config.name: ConfigMap custom-dcgm-metrics was not given"
    )


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, "ConfigMap device-plugin-config is not used: spec.devicePlugin.config.default is "
             "not set and no GPU node carries the label nvidia.com/device-plugin.config, so every "
             "node gets the empty config"),
        ({"config.yaml": 2}, None),
        ({"typo": 1}, "1 GPU node(s) carry nvidia.com/device-plugin.config=typo, which names no "
                      "key of ConfigMap device-plugin-config (its keys: config.yaml)"),
    ],
)  # fmt: skip
def test_a_device_plugin_config_without_default_is_used_only_where_nodes_name_it(
    labels: dict[str, int], expected: str | None
) -> None:
    # Seed 002: the ConfigMap is named, with no default: NVIDIA's operator runs the config
    # manager with FALLBACK_STRATEGIES=empty, so an unlabelled node never gets its one key.
    policy = _model(devicePlugin={"config": {"name": "device-plugin-config"}})
    facts = _facts({"device-plugin-config": ("config.yaml",)}, plugin_config_labels=labels)
    report = validate_refs.check_facts(policy, facts)
    assert report.problems == []
    notes = [n.message for n in report.notes]
    if expected is None:
        assert notes == []
    else:
        [note] = notes
        assert expected in note
        assert "one of its keys (config.yaml)" in note
    with_default = _model(devicePlugin={"config": {"name": "device-plugin-config",
                                                   "default": "config.yaml"}})  # fmt: skip
    assert validate_refs.check_facts(with_default, facts).notes == []


def test_validate_checks_the_seed_documents_dcgm_metrics_key_offline(tmp_path: Path) -> None:
    policy = _policy(dcgmExporter={"config": {"name": "dcgm-exporter-config"}})
    code, out, _ = _run(
        "-f", _write(tmp_path, "cp.yaml", [policy]), "-f", _write(tmp_path, "seed.yaml", SEED_002)
    )
    assert code == 1
    assert (
        "ClusterPolicy/cp: spec.dcgmExporter.config.name: ConfigMap dcgm-exporter-config in "
        "namespace gpu-operator has no key dcgm-metrics.csv (its keys: metrics.csv): the DCGM "
        "exporter reads key dcgm-metrics.csv only: rename key metrics.csv to dcgm-metrics.csv"
    ) in out

    # Renamed, its lines are checked with the exporter's own rules.
    fixed = SEED_002.replace("  metrics.csv: |", "  dcgm-metrics.csv: |").replace(
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FRE"
    )
    code, out, _ = _run(
        "-f", _write(tmp_path, "cp.yaml", [policy]), "-f", _write(tmp_path, "seed.yaml", fixed)
    )
    assert code == 1
    assert (
        "ConfigMap/dcgm-exporter-config: data.dcgm-metrics.csv: line 5: unknown DCGM field " in out
    )


def test_validate_says_the_seed_documents_plugin_config_is_unused_without_a_default(
    tmp_path: Path,
) -> None:
    policy = _policy(devicePlugin={"config": {"name": "device-plugin-config"}})
    seed = _write(tmp_path, "seed.yaml", SEED_002)
    code, out, err = _run("-f", _write(tmp_path, "cp.yaml", [policy]), "-f", seed)
    assert (code, out) == (0, ""), out
    assert (
        "ClusterPolicy/cp: warning: spec.devicePlugin.config.default is not set: ConfigMap "
        "device-plugin-config is used only on nodes labelled nvidia.com/device-plugin.config=<key>;"
        " every other node gets the empty config, the device plugin's built-in defaults, even when"
        " the ConfigMap has a single key (the operator runs the config manager with "
        "FALLBACK_STRATEGIES=empty): set spec.devicePlugin.config.default to one of its keys "
        "(config.yaml), or label the nodes"
    ) in " ".join(err.split())
    policy["spec"]["devicePlugin"]["config"]["default"] = "config.yaml"
    code, _, err = _run("-f", _write(tmp_path, "cp.yaml", [policy]), "-f", seed)
    assert code == 0
    assert "config.default is not set" not in err


@pytest.mark.parametrize(
    "text",
    [SEED_004, textwrap.dedent("""\
        apiVersion: gpu.nvidia.com/v1
        kind: GPUClusterPolicy
        metadata:
          name: gpu-cluster-policy
        spec:
          driver: {enabled: true, version: "470.82.01"}
          devicePlugin: {enabled: true}
        """)],
    ids=["as-printed", "indented"],
)  # fmt: skip
def test_validate_suggests_cluster_policy_for_the_seed_documents_gpu_cluster_policy(
    tmp_path: Path, text: str
) -> None:
    code, out, err = _run("-f", _write(tmp_path, "gcp.yaml", text))
    assert code == 1, err
    [line] = out.splitlines()
    assert (
        'gpu.nvidia.com/v1 GPUClusterPolicy is not a kind of the GPU operator (kubectl answers "no'
        ' matches for kind"): did you mean ClusterPolicy (nvidia.com/v1)?'
    ) in line
    assert "skipped" not in err
    stray = "driver, devicePlugin, migManager at the top level of the document are spec fields"
    assert (stray in line) == (text == SEED_004)


def test_validate_says_kubectl_rejects_an_unknown_field_and_the_api_server_drops_it(
    tmp_path: Path,
) -> None:
    policy = _policy()
    policy["spec"]["devicePlugn"] = {}
    code, out, err = _run("-f", _write(tmp_path, "cp.yaml", [policy]))
    assert (code, out) == (0, "")
    assert (
        'ClusterPolicy/cp: warning: spec.devicePlugn: unknown field (did you mean "devicePlugin"?):'
        " kubectl rejects the object (strict field validation, its default); with kubectl "
        "--validate=false, or a client that does not ask for strict validation, the API server "
        "drops the field"
    ) in " ".join(err.split())


def test_an_nvidiadriver_licensing_config_map_is_checked(tmp_path: Path) -> None:
    driver = {
        "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "d"},
        "spec": {"driverType": "vgpu", "licensingConfig": {"name": "licence"}},
    }  # fmt: skip
    cm = _config_map("licence", {"gridd.conf": "ServerAddress=nls\n"})
    code, out, _ = _run("-f", _write(tmp_path, "all.yaml", [driver, cm]))
    assert code == 1
    # Unset nlsEnabled means enabled on an NVIDIADriver: the token is mounted too.
    assert (
        "NVIDIADriver/d: spec.licensingConfig.name: ConfigMap licence in the operator's namespace "
        "has no key client_configuration_token.tok (its keys: gridd.conf)"
    ) in out
