"""`gpu-operator images`: the images to mirror for a policy or the chart's values, taken from the
same objects `render` and `helm template` produce, deduplicated and sorted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_operator.api import manifests
from gpu_operator.cli import app, image_list, render

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VALUES = ROOT / "charts" / "gpu-operator" / "values.yaml"
runner = CliRunner()

TWO_KERNELS = """\
pools:
  - name: old
    nodes: 2
    kernel: 5.15.0-1068-aws
  - name: new
    nodes: 1
    kernel: 6.8.0-1021-aws
  - name: cpu
    nodes: 3
    gpu: null
"""
PRECOMPILED = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
spec:
  operator: {}
  daemonsets: {}
  toolkit: {}
  devicePlugin: {}
  dcgmExporter: {}
  dcgm: {enabled: false}
  nodeStatusExporter: {}
  gfd: {}
  driver:
    usePrecompiled: true
    repository: nvcr.io/nvidia
    image: driver
    version: "570"
"""


def _images(*args: str) -> list[str]:
    result = runner.invoke(app, ["images", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_lists_sorted_unique_images_rendered_objects_use(example: Path) -> None:
    lines = _images("-f", str(example))
    assert lines == sorted(set(lines))
    assert image_list.OPERATOR_IMAGE in lines
    # Every image of every rendered object is listed: nothing is pulled that a mirror lacks.
    docs = manifests.read(str(example))
    policy = next(d for d in docs if d.get("kind") in ("ClusterPolicy", "GPUCluster"))
    if policy["kind"] == "GPUCluster":
        cluster = image_list._checked_cluster(policy, example.name)
        rendered = render.render_cluster(cluster, render.parse_facts({}))
    else:
        checked = image_list._checked_policy(policy, example.name)
        keys = render.config_map_keys(docs)
        rendered = render.render(checked, render.parse_facts({}), None, keys)
    assert rendered.objects
    for obj in rendered.objects:
        for image, _ in image_list.object_images(obj):
            assert image in lines, f"{image} of {obj['metadata']['name']} missing"


def test_default_policy_lists_each_enabled_operand_and_not_disabled_ones() -> None:
    lines = _images("-f", str(ROOT / "examples" / "clusterpolicy-default.yaml"))
    assert "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04" in lines
    assert any(i.startswith("nvcr.io/nvidia/k8s-device-plugin:") for i in lines)
    assert any(i.startswith("nvcr.io/nvidia/k8s/container-toolkit:") for i in lines)
    # The driver manager runs as the driver pod's init container.
    assert any(i.startswith("nvcr.io/nvidia/cloud-native/k8s-driver-manager:") for i in lines)
    # Sandbox operands are off by default: their images are not pulled.
    assert not any("kubevirt-gpu-device-plugin" in i for i in lines)


def test_precompiled_driver_gets_one_tag_per_kernel_of_the_facts(tmp_path: Path) -> None:
    (tmp_path / "facts.yaml").write_text(TWO_KERNELS)
    (tmp_path / "policy.yaml").write_text(PRECOMPILED)
    lines = _images("-f", str(tmp_path / "policy.yaml"), "--facts", str(tmp_path / "facts.yaml"))
    drivers = [i for i in lines if i.startswith("nvcr.io/nvidia/driver:")]
    assert drivers == [
        "nvcr.io/nvidia/driver:570-5.15.0-1068-aws-ubuntu22.04",
        "nvcr.io/nvidia/driver:570-6.8.0-1021-aws-ubuntu22.04",
    ]


def test_nvidiadriver_objects_give_each_pool_its_owners_driver_image(tmp_path: Path) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("pools:\n  - {name: a, gpu: A100-SXM4-80GB}\n  - {name: t, gpu: T4}\n")
    example = str(ROOT / "examples" / "nvidiadriver-per-pool.yaml")
    drivers = [i for i in _images("-f", example, "--facts", str(facts)) if "/driver:" in i]
    assert drivers == [
        "nvcr.io/nvidia/driver:570.195.03-ubuntu22.04",
        "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
    ]
    # Without an A100-80GB pool, the a100-pool driver owns no node and pulls nothing.
    facts.write_text("pools:\n  - {name: t, gpu: T4}\n")
    drivers = [i for i in _images("-f", example, "--facts", str(facts)) if "/driver:" in i]
    assert drivers == ["nvcr.io/nvidia/driver:570.195.03-ubuntu22.04"]


def test_chart_default_values_list_operator_nfd_and_operands() -> None:
    lines = _images("--values", str(VALUES))
    assert lines == sorted(set(lines))
    assert any(i.startswith("ghcr.io/gpu-operator-py/gpu-operator:") for i in lines)
    assert any(i.startswith("registry.k8s.io/nfd/node-feature-discovery:") for i in lines)
    assert any(i.startswith("nvcr.io/nvidia/driver:") for i in lines)
    assert "nvcr.io/nvidia/gpu-operator:v26.7.0" in lines


def test_chart_values_that_disable_the_driver_drop_its_images(tmp_path: Path) -> None:
    values = tmp_path / "off.yaml"
    values.write_text("driver:\n  enabled: false\nnfd:\n  enabled: false\n")
    lines = _images("--values", str(VALUES), "--values", str(values))
    assert not any(i.startswith("nvcr.io/nvidia/driver:") for i in lines)
    assert not any("k8s-driver-manager" in i for i in lines)
    assert not any("node-feature-discovery" in i for i in lines)


def test_json_output_names_what_pulls_each_image() -> None:
    result = runner.invoke(
        app, ["images", "-f", str(ROOT / "examples" / "clusterpolicy-default.yaml"), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    by_image = {entry["image"]: entry["usedBy"] for entry in data["images"]}
    # The operator image also runs the runtime-config guard next to NVIDIA's toolkit.
    assert by_image[image_list.OPERATOR_IMAGE] == [
        "operator",
        "state-container-toolkit: DaemonSet nvidia-container-toolkit-daemonset "
        "(runtime-config-guard)",
        "state-container-toolkit: DaemonSet nvidia-container-toolkit-daemonset "
        "(runtime-config-save)",
    ]
    driver = by_image["nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"]
    assert any(u.startswith("state-driver: DaemonSet") for u in driver)


def test_needs_exactly_one_source() -> None:
    result = runner.invoke(app, ["images"])
    assert result.exit_code == 2
    assert "either -f POLICY or --values" in result.output


def test_invalid_policy_is_refused_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(PRECOMPILED.replace("usePrecompiled: true", "usePrecompiled: maybe"))
    result = runner.invoke(app, ["images", "-f", str(bad)])
    assert result.exit_code == 1
    assert "usePrecompiled" in result.output


def test_missing_values_file_is_named(tmp_path: Path) -> None:
    result = runner.invoke(app, ["images", "--values", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml" in result.output


METRICS_POLICY = PRECOMPILED.replace(
    "dcgmExporter: {}", "dcgmExporter: {config: {name: custom-dcgm-metrics}}"
).replace("usePrecompiled: true", "usePrecompiled: false")
METRICS_CM = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: custom-dcgm-metrics}
data:
  dcgm-metrics.csv: |
    DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization
"""


def test_a_config_map_not_given_is_a_warning_and_every_image_is_listed(tmp_path: Path) -> None:
    policy = tmp_path / "cp.yaml"
    policy.write_text(METRICS_POLICY)
    alone = runner.invoke(app, ["images", "-f", str(policy)])
    assert alone.exit_code == 0, alone.output
    assert (
        "warning: spec.dcgmExporter.config.name: ConfigMap custom-dcgm-metrics was not given"
        in (alone.stderr)
    )
    assert any("dcgm-exporter" in image for image in alone.stdout.splitlines())

    # Given in a second file (or on stdin): checked, nothing to say, the same images.
    config_map = tmp_path / "cm.yaml"
    config_map.write_text(METRICS_CM)
    both = runner.invoke(app, ["images", "-f", str(policy), "-f", str(config_map)])
    assert both.exit_code == 0, both.output
    assert "warning" not in both.stderr
    assert both.stdout == alone.stdout
    piped = runner.invoke(app, ["images", "-f", str(policy), "-f", "-"], input=METRICS_CM)
    assert (piped.exit_code, piped.stdout) == (0, alone.stdout)


def test_chart_values_with_a_gpu_cluster_list_the_dra_stack(tmp_path: Path) -> None:
    values = tmp_path / "dra.yaml"
    values.write_text(
        "clusterPolicy: {deployCR: false}\ngpuCluster: {deployCR: true}\ndriver: {enabled: false}\n"
    )
    lines = _images("--values", str(VALUES), "--values", str(values))
    assert "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0" in lines
    assert any(i.startswith("ghcr.io/gpu-operator-py/gpu-operator:") for i in lines)
    # No ClusterPolicy: none of the device plugin stack is pulled.
    assert not any(i.startswith("nvcr.io/nvidia/k8s-device-plugin:") for i in lines)


def test_a_cluster_policy_and_a_gpu_cluster_together_are_refused(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(
        (ROOT / "examples" / "clusterpolicy-default.yaml").read_text()
        + "\n---\n"
        + (ROOT / "examples" / "gpucluster-dra.yaml").read_text()
    )
    result = runner.invoke(app, ["images", "-f", str(both)])
    assert result.exit_code == 1
    assert "both ClusterPolicy cluster-policy and GPUCluster gpu-cluster" in result.stderr
    assert result.stdout == ""
