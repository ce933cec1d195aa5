"""The management CDI spec on every mock GPU model: devices by index, UUID and MIG, `all`,
control nodes, the driver's files and the hooks; and the device plugin's spec from the same
shared builders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_operator import nvml
from gpu_operator.agents import cdi
from gpu_operator.agents.container_toolkit import cdi_spec
from gpu_operator.agents.device_plugin import cdi as dp_cdi
from gpu_operator.agents.device_plugin import facts
from gpu_operator.nvml import machines, mock

HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
DRIVER_FILES = (
    "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
    "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
    "usr/bin/nvidia-smi",
)


def node_of(preset: str) -> facts.NodeFacts:
    lib = mock.MockMachine.from_preset(preset, seed=1).nvml()
    lib.init()
    return facts.collect(lib, driver_root=Path("/nonexistent"), sys_root=Path("/nonexistent"))


def expected_names(node: facts.NodeFacts) -> list[str]:
    names: list[str] = []
    for g in node.gpus:
        names += [str(g.index), g.uuid]
        if g.mig_enabled:
            for m in g.migs:
                names += [f"{g.index}:{m.index}", m.uuid]
    return [*names, "all"]


@pytest.mark.parametrize("preset", sorted(machines.PRESETS))
def test_every_gpu_and_mig_device_is_named_by_index_and_uuid(preset: str) -> None:
    node = node_of(preset)
    spec = cdi_spec.management_spec(node, driver_files=DRIVER_FILES, hook_path=HOOK)
    assert spec["kind"] == "management.nvidia.com/gpu"
    assert spec["cdiVersion"] == "0.5.0"
    names = [d["name"] for d in spec["devices"]]
    assert names == expected_names(node)
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    for g in node.gpus:
        node_path = f"/dev/nvidia{g.minor}"
        assert by_name[str(g.index)] == by_name[g.uuid]
        assert by_name[g.uuid][0] == {
            "path": node_path,
            "hostPath": f"/run/nvidia/driver{node_path}",
        }
        for m in g.migs if g.mig_enabled else ():
            paths = [n["path"] for n in by_name[m.uuid]]
            assert paths[0] == node_path
            assert len(paths) == 3
            assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths[1:])
    every = {n["path"] for n in by_name["all"]}
    assert every == {f"/dev/nvidia{g.minor}" for g in node.gpus} | {
        n["path"] for name, nodes in by_name.items() if name != "all" for n in nodes
    }


def test_mig_partitioned_presets_have_mig_devices_in_the_spec() -> None:
    for preset in ("dgx-a100-mig-single", "dgx-a100-mig-mixed"):
        names = [d["name"] for d in cdi_spec.management_spec(node_of(preset))["devices"]]
        assert "0:0" in names, preset
        assert any(n.startswith("MIG-") for n in names), preset


def test_common_edits_carry_control_nodes_driver_files_and_hooks() -> None:
    spec = cdi_spec.management_spec(
        node_of("t4x4"),
        driver_root="/",
        dev_root="/",
        driver_files=DRIVER_FILES,
        present_control_nodes=["/dev/nvidiactl", "/dev/nvidia-uvm"],
        hook_path=HOOK,
        driver_version="550.54.15",
    )
    edits = spec["containerEdits"]
    assert edits["env"] == [
        "NVIDIA_VISIBLE_DEVICES=void",
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",
    ]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert edits["mounts"][0] == {
        "hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    assert [h["args"] for h in edits["hooks"]] == [
        [
            "nvidia-cdi-hook",
            "create-symlinks",
            "--link",
            "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
        ],
        ["nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"],
        ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
    ]
    assert all(h["hookName"] == "createContainer" and h["path"] == HOOK for h in edits["hooks"])


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("nvidia.com", "not of the form vendor/class"),
        ("-x.com/gpu", "invalid vendor"),
        ("a.com/g pu", "invalid class"),
    ],
)
def test_a_bad_cdi_kind_is_refused_naming_the_variable(kind: str, message: str) -> None:
    with pytest.raises(cdi_spec.CdiError, match=f"CDI_KIND: .*{message}"):
        cdi_spec.check_kind(kind)


def test_generate_reads_nvml_and_the_driver_root_and_writes_yaml(tmp_path: Path) -> None:
    driver = tmp_path / "driver"
    for f in DRIVER_FILES:
        (driver / f).parent.mkdir(parents=True, exist_ok=True)
        (driver / f).write_text("")
    (driver / "dev").mkdir()
    (driver / "dev/nvidiactl").write_text("")
    machine = mock.MockMachine.from_preset("l4x8", seed=2)
    path, spec = cdi_spec.generate(
        machine.nvml,
        tmp_path / "cdi",
        kind="management.nvidia.com/gpu",
        driver_root="/run/nvidia/driver",
        driver_root_view=driver,
        dev_root="/run/nvidia/driver",
        dev_root_view=driver,
        hook_path=HOOK,
    )
    assert path == tmp_path / "cdi/management.nvidia.com-gpu.yaml"
    assert yaml.safe_load(path.read_text()) == spec
    assert len(spec["devices"]) == 8 * 2 + 1
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"}
    ]
    assert {m["hostPath"] for m in spec["containerEdits"]["mounts"]} == {
        f"/run/nvidia/driver/{f}" for f in DRIVER_FILES
    }


def test_generate_without_a_driver_says_nvml_failed(tmp_path: Path) -> None:
    def no_driver() -> nvml.Nvml:
        raise nvml.DriverNotLoaded("Driver Not Loaded")

    with pytest.raises(cdi_spec.CdiError, match="failed to initialize NVML: Driver Not Loaded"):
        cdi_spec.generate(
            no_driver,
            tmp_path,
            kind="management.nvidia.com/gpu",
            driver_root="/",
            driver_root_view=tmp_path,
            dev_root="/",
            dev_root_view=tmp_path,
            hook_path=HOOK,
        )
    assert not list(tmp_path.iterdir())


def test_the_device_plugin_spec_still_names_one_id_per_device_with_the_ldcache_hook() -> None:
    node = node_of("dgx-a100-mig-mixed")
    spec = dp_cdi.gpu_spec(node, id_strategy="index", driver_files=DRIVER_FILES)
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == [n for n in expected_names(node) if ":" in n or n.isdigit() or n == "all"]
    assert [h["args"][:3] for h in spec["containerEdits"]["hooks"]] == [
        ["nvidia-ctk", "hook", "update-ldcache"]
    ]
    assert dp_cdi.spec_file_name("gpu") == "k8s.device-plugin.nvidia.com-gpu.json"
    assert (
        cdi.spec_file_name("management.nvidia.com/gpu", ".yaml") == "management.nvidia.com-gpu.yaml"
    )
