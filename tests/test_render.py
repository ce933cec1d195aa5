"""`gpu-operator render`: every example renders to objects valid for Kubernetes 1.35, with default
facts and a multi-pool facts file; invalid policies and bad input get validate's messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator.api import manifests, validation
from gpu_operator.cli import app, render

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# Custom resources kubernetes-validate has no schema for (prometheus-operator).
UNKNOWN_TO_VALIDATOR = {("monitoring.coreos.com/v1", "ServiceMonitor")}
# Kinds without a namespace among the rendered objects (a GPUCluster's DRA objects included).
CLUSTER_SCOPED = {"RuntimeClass", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
MULTI_POOL = """\
namespace: nvidia-gpu
serviceMonitorCRD: true
pools:
  - name: a100
    nodes: 4
    gpu: A100-SXM4-40GB
  - name: t4-rhel
    nodes: 2
    os: rhel
    osVersion: "9.4"
    kernel: 5.14.0-427.el9.x86_64
    runtime: crio
    gpu: T4
  - name: vms
    nodes: 1
    gpu: L40S
    workload: vm-passthrough
  - name: cpu
    nodes: 3
    gpu: null
"""


CONFIG_MAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {data}\n"
# Seed document 002's counters ConfigMap, under the key the exporter reads.
METRICS = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: custom-dcgm-metrics
  namespace: gpu-operator
data:
  dcgm-metrics.csv: |
    # GPU utilization
    DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization
    # Memory usage
    DCGM_FI_DEV_FB_USED, gauge, GPU memory used
    DCGM_FI_DEV_FB_FREE, gauge, GPU memory free
"""


def _policy(path: Path, **spec: Any) -> Path:
    """A minimal valid ClusterPolicy file with `spec` sections replaced."""
    body: dict[str, Any] = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "operator": {}, "daemonsets": {}, "driver": {}, "toolkit": {}, "devicePlugin": {},
            "dcgmExporter": {}, "dcgm": {"enabled": False}, "nodeStatusExporter": {}, "gfd": {},
            **spec,
        },
    }  # fmt: skip
    path.write_text(yaml.safe_dump(body))
    return path


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["render", *args])


def _objects(output: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(output) if d is not None]


def _validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in UNKNOWN_TO_VALIDATOR:
            continue
        kubernetes_validate.validate(obj, "1.35.0", strict=True)


@pytest.fixture
def multi_pool(tmp_path: Path) -> Path:
    path = tmp_path / "facts.yaml"
    path.write_text(MULTI_POOL)
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_objects_with_default_facts(example: Path) -> None:
    result = _invoke("-f", str(example))
    assert result.exit_code == 0, result.output
    objects = _objects(result.stdout)
    kinds = {o["kind"] for o in objects}
    assert "DaemonSet" in kinds
    assert all(o["metadata"]["labels"]["nvidia.com/gpu-operator.state"] for o in objects)
    namespaced = [o for o in objects if o["kind"] not in CLUSTER_SCOPED]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"gpu-operator"}
    _validate(objects)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_objects_with_a_multi_pool_facts_file(
    example: Path, multi_pool: Path
) -> None:
    result = _invoke("-f", str(example), "--facts", str(multi_pool))
    assert result.exit_code == 0, result.output
    objects = _objects(result.stdout)
    assert {o["metadata"].get("namespace") for o in objects} >= {"nvidia-gpu"}
    _validate(objects)
    assert "# pool cpu (3 node(s)): nothing (no GPU)" in result.stdout


def test_render_uses_the_registry_exactly(multi_pool: Path) -> None:
    from gpu_operator.operands import registry

    path = ROOT / "examples" / "clusterpolicy-default.yaml"
    policy = validation.check_document(manifests.read(str(path))[0]).obj
    assert policy is not None
    facts_file = render.load_facts(multi_pool)
    facts = render.cluster_facts(facts_file)
    expected = [o for s in registry.render_all(policy, facts) for o in s.objects]  # type: ignore[arg-type]
    assert _objects(_invoke("-f", str(path), "--facts", str(multi_pool)).stdout) == expected
    assert facts.gpu_node_count == 7
    assert (facts.os_id, facts.os_version_id) == ("ubuntu", "22.04")
    assert facts.kernels == ("5.14.0-427.el9.x86_64", "6.8.0-52-generic")
    assert facts.runtime == "containerd"
    assert facts.has_servicemonitor_crd


def test_servicemonitor_appears_with_its_crd(multi_pool: Path) -> None:
    path = ROOT / "examples" / "clusterpolicy-default.yaml"
    with_crd = _objects(_invoke("-f", str(path), "--facts", str(multi_pool)).stdout)
    without = _objects(_invoke("-f", str(path)).stdout)
    assert any(o["kind"] == "ServiceMonitor" for o in with_crd)
    assert not any(o["kind"] == "ServiceMonitor" for o in without)


def test_pools_get_their_operands(multi_pool: Path) -> None:
    path = ROOT / "examples" / "kubevirt-passthrough.yaml"
    policy = validation.check_document(manifests.read(str(path))[0]).obj
    out = render.render(policy, render.load_facts(multi_pool))  # type: ignore[arg-type]
    operands = {p.pool: p.operands for p in out.pools}
    assert "mig-manager" in operands["a100"]
    assert "vfio-manager" in operands["vms"]
    assert "driver" not in operands["vms"]
    assert "mig-manager" not in operands["t4-rhel"]
    assert operands["cpu"] == ()


def test_json_output_is_a_list_of_the_same_objects() -> None:
    path = str(ROOT / "examples" / "mig-mixed.yaml")
    as_json = _invoke("-f", path, "-o", "json")
    assert as_json.exit_code == 0
    listed = json.loads(as_json.stdout)
    assert listed["kind"] == "List"
    assert listed["items"] == _objects(_invoke("-f", path).stdout)


def test_disabled_states_are_commented_and_failed_ones_reported(tmp_path: Path) -> None:
    # A licensing ConfigMap given without the key the driver mounts: the controller holds the
    # driver back, so render fails that state.
    policy = _policy(tmp_path / "cp.yaml", driver={"licensingConfig": {"configMapName": "lic"}})
    licence = tmp_path / "lic.yaml"
    licence.write_text(CONFIG_MAP.format(name="lic", data="{nls.conf: x}"))
    result = _invoke("-f", str(policy), "-f", str(licence))
    assert result.exit_code == 1  # the driver state cannot be rendered: the policy would fail
    assert "# state-dcgm: disabled" in result.stdout
    assert "# state-driver: failed: " in result.stdout
    assert "state-driver: failed:" in result.stderr
    assert "ConfigMap lic in namespace gpu-operator has no key gridd.conf" in result.stderr
    assert not any(o["kind"] == "DaemonSet" and o["metadata"]["name"] ==
                   "nvidia-driver-daemonset" for o in _objects(result.stdout))  # fmt: skip


def test_no_gpu_nodes_means_no_daemonsets(tmp_path: Path) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("pools:\n  - name: cpu\n    nodes: 2\n    gpu: null\n")
    result = _invoke("-f", str(ROOT / "examples" / "clusterpolicy-default.yaml"), "--facts",
                     str(facts))  # fmt: skip
    assert result.exit_code == 0
    assert not any(o["kind"] == "DaemonSet" for o in _objects(result.stdout))
    assert "state-driver: skipped: " in result.stderr
    assert "skipped: DaemonSet gpu-feature-discovery: no GPU nodes" in result.stderr


def test_invalid_policy_exits_1_with_validates_messages(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path / "cp.yaml", mig={"strategy": "sometimes"}, driver={"kernelModuleType": "fast"}
    )
    rendered = _invoke("-f", str(policy))
    validated = CliRunner().invoke(app, ["validate", "-f", str(policy)])
    assert rendered.exit_code == 1
    assert validated.exit_code == 1
    problems = [line for line in validated.stdout.splitlines() if line]
    assert problems
    for line in problems:
        assert line in rendered.stderr
    assert rendered.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-f", "/nonexistent.yaml"], "no such file"),
        (["-f", "{facts}"], "no ClusterPolicy or GPUCluster found"),
        (
            ["-f", "{policy}", "--facts", "/nonexistent-facts.yaml"],
            "nonexistent-facts.yaml: no such file",
        ),
        (["-f", "{policy}", "--facts", "{badfacts}"], "pools.0.runtime"),
    ],
)
def test_unreadable_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("pools: []\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - name: a\n    runtime: rkt\n")
    paths = {"facts": str(facts), "badfacts": str(bad),
             "policy": str(ROOT / "examples" / "mig-mixed.yaml")}  # fmt: skip
    result = _invoke(*[a.format(**paths) for a in args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_facts_file_errors_name_the_field() -> None:
    with pytest.raises(render.FactsError, match=r"pools\.0\.gpu: unknown GPU model 'Z100'"):
        render.parse_facts({"pools": [{"name": "a", "gpu": "Z100"}]})
    with pytest.raises(render.FactsError, match="colour: Extra inputs"):
        render.parse_facts({"colour": "red"})


def test_default_facts_are_one_ubuntu_containerd_pool() -> None:
    facts = render.cluster_facts(render.parse_facts(None))
    assert facts.gpu_node_count == 1
    assert (facts.os_id, facts.os_version_id, facts.runtime) == ("ubuntu", "22.04", "containerd")
    assert facts.namespace == "gpu-operator"


def test_configmaps_in_the_input_feed_the_facts(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "cp.yaml", driver={"repoConfig": {"configMapName": "repos"}})
    policy.write_text(
        policy.read_text()
        + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: repos}\ndata: {a.list: x}\n"
    )
    result = _invoke("-f", str(policy))
    assert result.exit_code == 0, result.output
    driver = next(o for o in _objects(result.stdout) if o["kind"] == "DaemonSet"
                  and o["metadata"]["name"] == "nvidia-driver-daemonset")  # fmt: skip
    mounts = driver["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert any("a.list" in str(m.get("subPath", "")) + str(m["mountPath"]) for m in mounts)


def _daemonset(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == name)


def test_a_config_map_not_given_is_a_warning_and_every_object_renders(tmp_path: Path) -> None:
    # Issue 30 item 17: offline there is no cluster to find the ConfigMap in; a GitOps user keeps
    # it in another file. The ConfigMap is said to be unchecked, and everything renders.
    policy = _policy(tmp_path / "cp.yaml", dcgmExporter={"config": {"name": "custom-dcgm-metrics"}})
    result = _invoke("-f", str(policy))
    assert result.exit_code == 0, result.output
    assert (
        "warning: spec.dcgmExporter.config.name: ConfigMap custom-dcgm-metrics was not given "
        "(pass it with -f to check it); the operator waits until ConfigMap custom-dcgm-metrics "
        "exists in namespace gpu-operator with key dcgm-metrics.csv"
    ) in " ".join(result.stderr.split())
    exporter = _daemonset(_objects(result.stdout), "nvidia-dcgm-exporter")
    volumes = exporter["spec"]["template"]["spec"]["volumes"]
    assert {"name": "custom-dcgm-metrics", "items": [{"key": "dcgm-metrics.csv",
            "path": "dcgm-metrics.csv"}]} in [v.get("configMap") for v in volumes]  # fmt: skip


def test_config_maps_given_in_other_files_or_on_stdin_are_checked(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "cp.yaml", dcgmExporter={"config": {"name": "custom-dcgm-metrics"}})
    metrics = tmp_path / "metrics.yaml"
    metrics.write_text(METRICS)
    given = _invoke("-f", str(policy), "-f", str(metrics))
    assert given.exit_code == 0, given.output
    assert "warning" not in given.output
    alone = _invoke("-f", str(policy)).stdout
    assert _objects(given.stdout) == _objects(alone)
    # The output kept in Git says what was not checked, too.
    assert (
        "# warning: spec.dcgmExporter.config.name: ConfigMap custom-dcgm-metrics was not" in alone
    )

    # The seed's own key, `metrics.csv`, on stdin: the exporter would never start.
    seed = METRICS.replace("dcgm-metrics.csv: |", "metrics.csv: |")
    result = CliRunner().invoke(app, ["render", "-f", str(policy), "-f", "-"], input=seed)
    assert result.exit_code == 1
    assert (
        "state-dcgm-exporter: failed: state-dcgm-exporter: spec.dcgmExporter.config.name: "
        "ConfigMap custom-dcgm-metrics in namespace gpu-operator has no key dcgm-metrics.csv "
        "(its keys: metrics.csv): the DCGM exporter reads key dcgm-metrics.csv only: rename key "
        "metrics.csv to dcgm-metrics.csv"
    ) in " ".join(result.stderr.split())
    assert "nvidia-dcgm-exporter" not in {o["metadata"]["name"] for o in _objects(result.stdout)}

    # A bad counter line in a given ConfigMap: reported with its line, as the operator does.
    typo = METRICS.replace("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FRE")
    result = CliRunner().invoke(app, ["render", "-f", str(policy), "-f", "-"], input=typo)
    assert result.exit_code == 1
    assert "line 5: unknown DCGM field 'DCGM_FI_DEV_FB_FRE'" in result.stderr


def test_a_config_map_in_another_namespace_is_left_out_and_said(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "cp.yaml", dcgmExporter={"config": {"name": "custom-dcgm-metrics"}})
    result = CliRunner().invoke(
        app, ["render", "-f", str(policy), "-f", "-", "--namespace", "gpu-ops"], input=METRICS
    )
    assert result.exit_code == 0, result.output
    stderr = " ".join(result.stderr.split())
    assert (
        "warning: ConfigMap custom-dcgm-metrics is in namespace gpu-operator, not in the "
        "operator's namespace gpu-ops: the operator does not read it (left out)"
    ) in stderr
    assert "ConfigMap custom-dcgm-metrics was not given" in stderr


def test_a_driver_config_map_not_given_renders_without_its_file_mounts(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "cp.yaml", driver={"repoConfig": {"configMapName": "repos"}})
    result = _invoke("-f", str(policy))
    assert result.exit_code == 0, result.output
    assert (
        "spec.driver.repoConfig.configMapName: ConfigMap repos was not given (pass it with -f to "
        "check it); its file mounts are left out of the rendered DaemonSet"
    ) in " ".join(result.stderr.split())
    driver = _daemonset(_objects(result.stdout), "nvidia-driver-daemonset")
    volumes = driver["spec"]["template"]["spec"]["volumes"]
    assert {"name": "repo-config", "configMap": {"name": "repos"}} in volumes


def test_no_cluster_policy_but_a_gpu_cluster_policy_gets_the_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "gcp.yaml"
    path.write_text("apiVersion: gpu.nvidia.com/v1\nkind: GPUClusterPolicy\nmetadata: {name: g}\n")
    result = _invoke("-f", str(path))
    assert result.exit_code == 2
    assert "no ClusterPolicy or GPUCluster found in the input" in result.stderr
    assert "did you mean ClusterPolicy (nvidia.com/v1)?" in result.stderr


def test_a_gpu_cluster_renders_what_its_reconciler_applies(multi_pool: Path) -> None:
    from gpu_operator.operands import dra_driver

    path = ROOT / "examples" / "gpucluster-dra.yaml"
    result = _invoke("-f", str(path), "--facts", str(multi_pool))
    assert result.exit_code == 0, result.output
    cluster = validation.check_document(manifests.read(str(path))[0]).obj
    facts = render.cluster_facts(render.load_facts(multi_pool))
    expected = dra_driver.render(cluster, facts).objects()  # type: ignore[arg-type]
    assert _objects(result.stdout) == expected
    deploy = "dra-driver, dra-validator, dcgm-dra, dcgm-exporter-dra"
    assert f"# pool a100 (4 node(s)): {deploy}" in result.stdout
    assert "# pool cpu (3 node(s)): nothing (no GPU)" in result.stdout


def test_a_gpu_cluster_daemonsets_render_without_gpu_nodes(tmp_path: Path) -> None:
    """The GPUCluster reconciler applies its DaemonSets before a GPU node exists."""
    facts = tmp_path / "facts.yaml"
    facts.write_text("pools: [{name: cpu, nodes: 2, gpu: null}]\n")
    result = _invoke("-f", str(ROOT / "examples" / "gpucluster-dra.yaml"), "--facts", str(facts))
    assert result.exit_code == 0, result.output
    assert "DaemonSet" in {o["kind"] for o in _objects(result.stdout)}


def test_a_gpu_cluster_on_too_old_kubernetes_renders_nothing_and_fails(tmp_path: Path) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("kubernetesVersion: 1.33.4\n")
    result = _invoke("-f", str(ROOT / "examples" / "gpucluster-dra.yaml"), "--facts", str(facts))
    assert result.exit_code == 1
    assert "GPUCluster: failed: Kubernetes 1.33.4 is older than 1.34.2" in result.stderr
    assert _objects(result.stdout) == []


def test_a_cluster_policy_and_a_gpu_cluster_together_are_refused(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(
        (ROOT / "examples" / "clusterpolicy-default.yaml").read_text()
        + "\n---\n"
        + (ROOT / "examples" / "gpucluster-dra.yaml").read_text()
    )
    result = _invoke("-f", str(both))
    assert result.exit_code == 2
    assert (
        "the input has both ClusterPolicy cluster-policy and GPUCluster gpu-cluster, and a "
        "cluster runs one or the other" in result.stderr
    )
    assert result.stdout == ""
