"""NFD on the simulated cluster, as pure functions: host files -> features -> labels -> patches."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_operator.api import keys
from gpu_operator.nvml import mock
from gpudemo import fleet
from simhost import hardware, nfd

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
NFD = "feature.node.kubernetes.io/"
CHART_WORKER = nfd.WorkerConfig.parse(nfd.CHART_WORKER_CONFIG)
CHART_MASTER = nfd.MasterConfig.parse(nfd.CHART_MASTER_CONFIG)


def node_root(tmp_path: Path, machine: str | None, **pool: object) -> Path:
    spec = fleet.Pool.model_validate({"name": "p", "machine": machine, **pool})
    gpus = mock.MockMachine.from_preset(machine, seed=1) if machine else None
    root = tmp_path / (machine or "cpu")
    hardware.write(root, spec, gpus)
    return root


def labels_of(root: Path, config: nfd.WorkerConfig = CHART_WORKER) -> dict[str, str]:
    return nfd.worker_labels(nfd.discover(nfd.Host.of_root(root), config), config)


def test_sysfs_uses_the_standard_pci_layout(tmp_path: Path) -> None:
    root = node_root(tmp_path, "dgx-a100")
    link = root / "sys" / "bus" / "pci" / "devices" / "0000:07:00.0"
    assert link.is_symlink()
    assert str(link.readlink()) == "../../../devices/pci0000:07/0000:07:00.0"
    assert (link / "vendor").read_text() == "0x10de\n"
    assert (link / "class").read_text() == "0x030200\n"
    assert (link / "device").read_text() == "0x20b0\n"  # A100-SXM4-40GB


def test_worker_labels_a_gpu_node_as_the_charts_nfd_would(tmp_path: Path) -> None:
    labels = labels_of(node_root(tmp_path, "dgx-a100"))
    assert labels[keys.NFD_GPU_LABELS[0]] == "true"  # pci-10de.present: deviceLabelFields [vendor]
    assert labels[NFD + "pci-8086.present"] == "true"  # on-board NIC, class 02 whitelisted
    assert labels[NFD + "pci-1a03.present"] == "true"  # BMC VGA, class 0300 whitelisted
    assert NFD + "pci-0302_10de.present" not in labels
    assert labels[keys.NFD_OS_ID] == "ubuntu"
    assert labels[keys.NFD_OS_VERSION_ID] == "22.04"
    assert labels[keys.NFD_OS_VERSION_MAJOR] == "22"
    assert labels[keys.NFD_KERNEL_FULL] == "6.8.0-52-generic"
    assert labels[NFD + "kernel-version.major"] == "6"
    assert labels[NFD + "cpu-model.vendor_id"] == "AMD"  # DGX A100: AMD EPYC 7742
    assert labels[NFD + "cpu-cpuid.AVX2"] == "true"
    assert NFD + "cpu-cpuid.SSE42" not in labels  # NFD's default attribute blacklist
    assert labels[NFD + "cpu-hardware_multithreading"] == "true"
    assert labels[NFD + "kernel-config.NO_HZ"] == "true"


def test_cpu_node_gets_no_nvidia_pci_label(tmp_path: Path) -> None:
    labels = labels_of(node_root(tmp_path, None, os="rhel", osVersion="9.4"))
    assert not any(k in labels for k in keys.NFD_GPU_LABELS)
    assert labels[keys.NFD_OS_ID] == "rhel"
    assert labels[NFD + "system-os_release.VERSION_ID.minor"] == "4"
    assert labels[NFD + "cpu-model.vendor_id"] == "Intel"


def test_nfd_defaults_label_class_and_vendor_of_display_devices_only(tmp_path: Path) -> None:
    labels = labels_of(node_root(tmp_path, "t4x4"), nfd.WorkerConfig())
    assert labels[NFD + "pci-0302_10de.present"] == "true"
    assert labels[NFD + "pci-0300_1a03.present"] == "true"
    assert not any(k.startswith(NFD + "pci-0200") for k in labels)  # NICs: not whitelisted


def test_worker_config_is_read_from_nfd_worker_conf() -> None:
    config = nfd.WorkerConfig.parse(
        {"core": {"sleepInterval": "1m30s"}, "sources": {"pci": {"deviceLabelFields": ["device"]}}}
    )
    assert config.sleep_interval == 90
    assert config.label_fields == ("device",)
    assert config.class_whitelist == nfd.DEFAULT_CLASS_WHITELIST


@pytest.mark.parametrize("text", ["1x", "s", "60 s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        nfd.duration(text, 0)


def test_master_publishes_only_allowed_namespaces_and_records_its_labels() -> None:
    spec = {
        "labels": {
            NFD + "pci-10de.present": "true",
            "short-name": "x",
            "nvidia.com/gpu.product": "A100",
            "node-role.kubernetes.io/gpu": "",
            "kubernetes.io/hostname": "evil",
            "example.com/team": "ml",
        }
    }
    desired = nfd.desired_labels([spec], [], CHART_MASTER)
    assert desired == {
        NFD + "pci-10de.present": "true",
        NFD + "short-name": "x",
        "nvidia.com/gpu.product": "A100",
        "example.com/team": "ml",
    }
    patch = nfd.master_patch({}, {}, desired)
    assert patch["metadata"]["labels"] == desired
    recorded = patch["metadata"]["annotations"][nfd.FEATURE_LABELS_ANNOTATION]
    assert recorded == "example.com/team,nvidia.com/gpu.product,pci-10de.present,short-name"
    denied = nfd.MasterConfig(deny_label_ns=("example.com",))
    assert "example.com/team" not in nfd.desired_labels([spec], [], denied)


def test_master_removes_only_labels_it_set_itself() -> None:
    labels = {NFD + "old": "true", NFD + "kept": "true", "team": "ml", NFD + "by-hand": "x"}
    annotations = {nfd.FEATURE_LABELS_ANNOTATION: "old,kept"}
    patch = nfd.master_patch(labels, annotations, {NFD + "kept": "true"})
    assert patch == {
        "metadata": {
            "labels": {NFD + "old": None},
            "annotations": {nfd.FEATURE_LABELS_ANNOTATION: "kept"},
        }
    }
    again = {NFD + "kept": "true", "team": "ml", NFD + "by-hand": "x"}
    assert (
        nfd.master_patch(again, {nfd.FEATURE_LABELS_ANNOTATION: "kept"}, {NFD + "kept": "true"})
        == {}
    )


def test_prune_removes_nfds_labels_and_annotations_and_nothing_else() -> None:
    labels = {NFD + "pci-10de.present": "true", "nvidia.com/gpu.present": "true"}
    annotations = {nfd.FEATURE_LABELS_ANNOTATION: "pci-10de.present", "other/x": "1"}
    assert nfd.prune_patch(labels, annotations) == {
        "metadata": {
            "labels": {NFD + "pci-10de.present": None},
            "annotations": {nfd.FEATURE_LABELS_ANNOTATION: None},
        }
    }
    assert nfd.prune_patch({"a": "b"}, {}) == {}


@pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup")
def test_the_charts_kernel_module_rules_label_gds_capable_nodes(tmp_path: Path) -> None:
    rendered = subprocess.run(
        [str(HELM), "template", "x", str(ROOT / "charts" / "gpu-operator"), "--set",
         "nfd.nodefeaturerules=true", "--show-only", "templates/nodefeaturerules.yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rules = yaml.safe_load(rendered.stdout)["spec"]["rules"]
    root = node_root(tmp_path, "dgx-h100")
    features = nfd.discover(nfd.Host.of_root(root), CHART_WORKER)
    assert nfd.rule_labels(rules, features) == {}
    (root / "proc" / "modules").write_text("nvidia_fs 16384 0 - Live 0x0\n")
    features = nfd.discover(nfd.Host.of_root(root), CHART_WORKER)
    assert nfd.rule_labels(rules, features) == {"nvidia.com/gds.capable": "true"}


def test_rule_operators_compare_attributes_and_instances(tmp_path: Path) -> None:
    features = nfd.discover(nfd.Host.of_root(node_root(tmp_path, "l4x8")), CHART_WORKER)

    def matches(feature: str, expressions: dict[str, object]) -> bool:
        term = {"feature": feature, "matchExpressions": expressions}
        rule = {"name": "r", "labels": {"hit": "1"}, "matchFeatures": [term]}
        return nfd.rule_labels([rule], features) == {"hit": "1"}

    assert matches("kernel.version", {"major": {"op": "Gt", "value": ["5"]}})
    assert not matches("kernel.version", {"major": {"op": "Lt", "value": ["5"]}})
    assert matches("system.osrelease", {"ID": {"op": "In", "value": ["ubuntu", "rhel"]}})
    assert matches("pci.device", {"vendor": {"op": "In", "value": ["10de"]},
                                  "class": {"op": "InRegexp", "value": ["^03"]}})  # fmt: skip
    assert not matches("pci.device", {"vendor": {"op": "In", "value": ["15b3"]}})
    assert matches("cpu.cpuid", {"AVX512F": {"op": "Exists"}})
    assert matches("cpu.cpuid", {"AMXBF16": {"op": "DoesNotExist"}})


def test_in_process_nfd_configuration_is_the_charts() -> None:
    values = yaml.safe_load((ROOT / "charts" / "gpu-operator" / "values.yaml").read_text())
    section = values["node-feature-discovery"]
    assert section["worker"]["config"] == nfd.CHART_WORKER_CONFIG
    assert section["master"]["config"] == nfd.CHART_MASTER_CONFIG


def test_label_directly_labels_nodes_without_nfd_pods(tmp_path: Path) -> None:
    roots = {"gpu": node_root(tmp_path, "t4x4"), "cpu": node_root(tmp_path, None)}
    nodes: dict[str, dict[str, dict[str, str]]] = {
        n: {"labels": {}, "annotations": {}} for n in roots
    }

    def patch(name: str, body: dict[str, object]) -> None:
        meta = body["metadata"]
        assert isinstance(meta, dict)
        for field in ("labels", "annotations"):
            for key, value in (meta.get(field) or {}).items():
                if value is None:
                    nodes[name][field].pop(key, None)
                else:
                    nodes[name][field][key] = value

    nfd.label_directly(roots, patch, lambda n: (nodes[n]["labels"], nodes[n]["annotations"]))
    assert nodes["gpu"]["labels"][keys.NFD_GPU_LABELS[0]] == "true"
    assert keys.NFD_GPU_LABELS[0] not in nodes["cpu"]["labels"]
    assert nfd.FEATURE_LABELS_ANNOTATION in nodes["cpu"]["annotations"]
