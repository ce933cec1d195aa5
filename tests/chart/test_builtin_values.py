"""The chart's builtin-agent switch (`agents.builtin`, `<section>.builtin`; ours) and the
runtime-config guard value (`toolkit.runtimeConfigGuard`): resolved into upstream's image fields of
the ClusterPolicy, never into new API fields, and known to the NOTES."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpu_operator.cli import app

from .conftest import CHART, Rendered, needs_helm
from .test_values_keys import ignored, notes

OURS = {"repository": "ghcr.io/gpu-operator-py", "image": "gpu-operator", "version": "0.1.0"}
# values path -> the ClusterPolicy path of the same section.
SECTIONS = {
    "validator": ("validator",),
    "driver.manager": ("driver", "manager"),
    "toolkit": ("toolkit",),
    "devicePlugin": ("devicePlugin",),
    "dcgmExporter": ("dcgmExporter",),
    "gfd": ("gfd",),
    "migManager": ("migManager",),
    "nodeStatusExporter": ("nodeStatusExporter",),
    "vgpuManager.driverManager": ("vgpuManager", "driverManager"),
    "vgpuDeviceManager": ("vgpuDeviceManager",),
    "vfioManager": ("vfioManager",),
    "vfioManager.driverManager": ("vfioManager", "driverManager"),
    "sandboxDevicePlugin": ("sandboxDevicePlugin",),
}
NOT_OURS = ("driver", "dcgm", "gds", "gdrcopy", "kataSandboxDevicePlugin", "ccManager")


def spec(rendered: Rendered) -> dict[str, Any]:
    found: dict[str, Any] = rendered.one("ClusterPolicy")["spec"]
    return found


def at(tree: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        tree = tree[key]
    return tree


def image(section: dict[str, Any]) -> dict[str, Any]:
    return {k: section.get(k) for k in ("repository", "image", "version")}


def operator_env(rendered: Rendered) -> dict[str, str]:
    deployment = rendered.one("Deployment", "gpu-operator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def has_builtin_key(value: Any) -> bool:
    if isinstance(value, dict):
        return "builtin" in value or any(has_builtin_key(v) for v in value.values())
    if isinstance(value, list):
        return any(has_builtin_key(v) for v in value)
    return False


@needs_helm
def test_agents_builtin_points_every_section_with_an_agent_at_our_image(render: Any) -> None:
    default, builtin = spec(render()), spec(render(sets=["agents.builtin=true"]))
    for path in SECTIONS.values():
        assert image(at(builtin, path)) == OURS, path
        assert image(at(default, path))["repository"].startswith("nvcr.io/"), path
    for name in NOT_OURS:
        if name in default:
            assert image(default[name]) == image(builtin[name]), name
    assert not has_builtin_key(builtin)
    env = operator_env(render(sets=["agents.builtin=true"]))
    assert env["VALIDATOR_IMAGE"] == env["DRIVER_MANAGER_IMAGE"] == env["OPERATOR_IMAGE"]
    assert env["OPERATOR_IMAGE"] == "ghcr.io/gpu-operator-py/gpu-operator:0.1.0"


@needs_helm
def test_a_sections_own_switch_wins_and_a_users_image_is_kept(render: Any) -> None:
    one = spec(render(sets=["devicePlugin.builtin=true"]))
    assert image(one["devicePlugin"]) == OURS
    assert image(one["gfd"])["repository"] == "nvcr.io/nvidia"  # only the plugin
    mixed = spec(
        render(
            sets=[
                "agents.builtin=true",
                "gfd.builtin=false",
                "migManager.repository=registry.local/nvidia",
                "vfioManager.builtin=false",
                "sandboxWorkloads.enabled=true",
            ]
        )
    )
    assert image(mixed["gfd"])["image"] == "k8s-device-plugin"
    assert image(mixed["migManager"]) == {
        "repository": "registry.local/nvidia",
        "image": "k8s-mig-manager",
        "version": "v0.15.0",
    }
    # A nested manager follows its section's switch when it has none of its own.
    assert image(mixed["vfioManager"])["image"] == "k8s-driver-manager"
    assert image(mixed["vfioManager"]["driverManager"])["image"] == "k8s-driver-manager"
    assert image(mixed["driver"]["manager"]) == OURS  # driver has no agent: agents.builtin


@needs_helm
def test_a_mirror_of_our_operator_image_is_what_builtin_sections_name(render: Any) -> None:
    sets = [
        "agents.builtin=true",
        "operator.repository=registry.local/mirror",
        "operator.version=9",
    ]
    assert image(spec(render(sets=sets))["gfd"]) == {
        "repository": "registry.local/mirror",
        "image": "gpu-operator",
        "version": "9",
    }


@needs_helm
def test_the_builtin_keys_are_known_to_the_notes(tmp_path: Path, packaged_chart: Path) -> None:
    sets = ",".join(
        [
            "agents.builtin=true",
            *(f"{path}.builtin=false" for path in (*SECTIONS, "draDriver")),
            "toolkit.runtimeConfigGuard=false",
            "dcgm.builtin=true",  # dcgm has no agent of ours: not a key of this chart
        ]
    )
    assert ignored(notes(tmp_path, packaged_chart, "--set", sets)) == ["dcgm.builtin"]


def test_the_charts_list_of_nvidias_defaults_is_values_yamls() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = helpers.split('define "gpu-operator.builtinDefaults"', 1)[1].split("{{- end -}}")[0]
    listed = dict(
        line.split(": ", 1) for line in block.splitlines()[1:] if ": " in line and "{{" not in line
    )
    assert set(listed) == set(SECTIONS) | {"draDriver"}
    for path, ref in listed.items():
        section = at(values, tuple(path.split(".")))
        assert f"{section['repository']}/{section['image']}" == ref, path
        assert "builtin" in section, path
        assert section["builtin"] is None, path


@needs_helm
def test_the_guard_value_reaches_the_operator_and_a_bad_one_fails(render: Any) -> None:
    assert operator_env(render())["RUNTIME_CONFIG_GUARD"] == "true"  # auto, nothing running
    off = render(sets=["toolkit.runtimeConfigGuard=false"])
    assert operator_env(off)["RUNTIME_CONFIG_GUARD"] == "false"
    assert "runtimeConfigGuard" not in spec(off)["toolkit"]
    bad = render(sets=["toolkit.runtimeConfigGuard=sometimes"])
    assert bad.returncode != 0
    assert "toolkit.runtimeConfigGuard=sometimes: expected true, false or auto" in bad.stderr


GPU_CLUSTER = ["gpuCluster.deployCR=true", "clusterPolicy.deployCR=false", "driver.enabled=false"]
DEVICE_CLASS_API = ("--api-versions", "resource.k8s.io/v1/DeviceClass")


def dra_driver(rendered: Rendered) -> dict[str, Any]:
    assert rendered.returncode == 0, rendered.stderr
    found: dict[str, Any] = rendered.one("GPUCluster", "gpu-cluster")["spec"]["draDriver"]
    return found


@needs_helm
def test_agents_builtin_runs_our_dra_kubelet_plugin_and_compute_domain_agents(
    render: Any,
) -> None:
    """agents.builtin points the GPUCluster's draDriver at our image, which the operator runs as
    our dra-kubelet-plugin and compute-domain agents; its own switch wins; a user's image stays."""
    from gpu_operator import api
    from gpu_operator.api.gpucluster import GPUCluster
    from gpu_operator.operands import dra_driver as dra
    from gpu_operator.operands.facts import ClusterFacts

    default = dra_driver(render([], GPU_CLUSTER, *DEVICE_CLASS_API))
    assert image(default) == {
        "repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu", "version": "v0.5.0",
    }  # fmt: skip
    on = render([], [*GPU_CLUSTER, "agents.builtin=true"], *DEVICE_CLASS_API)
    assert image(dra_driver(on)) == OURS
    assert not has_builtin_key(on.one("GPUCluster", "gpu-cluster"))
    assert image(dra_driver(render([], [*GPU_CLUSTER, "draDriver.builtin=true"],
                                   *DEVICE_CLASS_API))) == OURS  # fmt: skip
    off = render([], [*GPU_CLUSTER, "agents.builtin=true", "draDriver.builtin=false"],
                 *DEVICE_CLASS_API)  # fmt: skip
    assert image(dra_driver(off)) == image(default)
    mirror = "draDriver.repository=registry.local/nvidia"
    mine = render([], [*GPU_CLUSTER, "agents.builtin=true", mirror], *DEVICE_CLASS_API)
    assert dra_driver(mine)["repository"] == "registry.local/nvidia"
    assert dra_driver(mine)["image"] == "dra-driver-nvidia-gpu"

    # The operator (OPERATOR_IMAGE from the chart) renders that GPUCluster with our commands.
    env = operator_env(on)
    checked = api.check_document(on.one("GPUCluster", "gpu-cluster"))
    assert isinstance(checked.obj, GPUCluster), checked.errors
    facts = ClusterFacts(namespace="gpu-operator", operator_env=env)
    objs = {o["metadata"]["name"]: o for o in dra.render(checked.obj, facts).objects()}
    plugin = objs[dra.PLUGIN_DAEMONSET]["spec"]["template"]["spec"]
    commands = {c["name"]: c.get("command") for c in plugin["containers"]}
    assert commands["gpus"] == list(dra.BUILTIN_COMMAND), commands
    assert commands["compute-domains"] == list(dra.BUILTIN_CD_PLUGIN_COMMAND), commands
    controller = objs[dra.CONTROLLER]["spec"]["template"]["spec"]["containers"][0]
    assert controller["command"] == list(dra.BUILTIN_CD_CONTROLLER_COMMAND)
    assert all(c["image"] == env["OPERATOR_IMAGE"] for c in plugin["containers"])
    # NVIDIA's image keeps NVIDIA's entry points.
    checked = api.check_document(render([], GPU_CLUSTER, *DEVICE_CLASS_API)
                                 .one("GPUCluster", "gpu-cluster"))  # fmt: skip
    assert isinstance(checked.obj, GPUCluster)
    objs = {o["metadata"]["name"]: o for o in dra.render(checked.obj, facts).objects()}
    gpus = objs[dra.PLUGIN_DAEMONSET]["spec"]["template"]["spec"]["containers"][0]
    assert dra.GPU_PLUGIN_ENTRY in " ".join([*gpus.get("command", []), *gpus.get("args", [])])


@needs_helm
def test_images_values_lists_our_image_for_the_builtin_operands(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("agents:\n  builtin: true\ndcgmExporter:\n  enabled: true\n")
    result = CliRunner().invoke(app, ["images", "--values", str(values)])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [
        "ghcr.io/gpu-operator-py/gpu-operator:0.1.0",
        "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
        "registry.k8s.io/nfd/node-feature-discovery:v0.19.0",
    ]
