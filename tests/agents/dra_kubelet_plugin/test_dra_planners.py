"""The DRA kubelet plugin's pure planners: published devices and slices, GpuConfig and feature
gates, claim preparation, the checkpoint format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agents.dra_kubelet_plugin import checkpoint, gpuconfig, inventory, prepare, slices
from gpu_operator.nvml import mock


def inv(preset: str) -> inventory.Inventory:
    machine = mock.MockMachine.from_preset(preset)
    lib = machine.nvml()
    lib.init()
    return inventory.collect(lib, driver_root=Path("/nonexistent"), sys_root=Path("/nonexistent"))


def test_full_gpus_are_named_by_minor_with_nvidias_attributes() -> None:
    i = inv("dgx-a100")
    devices = slices.devices(i)
    assert [d["name"] for d in devices] == [f"gpu-{g.minor}" for g in i.gpus]
    attrs = devices[0]["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["architecture"] == {"string": "Ampere"}
    assert attrs["cudaComputeCapability"] == {"version": "8.0.0"}
    assert set(attrs) >= {"uuid", "productName", "brand", "driverVersion", "cudaDriverVersion"}
    assert devices[0]["capacity"]["memory"] == {"value": "40Gi"}


def test_mig_enabled_gpus_publish_their_mig_devices_only() -> None:
    i = inv("dgx-a100-mig-mixed")
    names = [d["name"] for d in slices.devices(i)]
    assert not any(n.startswith("gpu-0") and "-mig-" not in n for n in names)
    assert len(names) == 32
    mig = next(d for d in slices.devices(i) if "-mig-1g5gb-" in d["name"])
    assert mig["attributes"]["profile"] == {"string": "1g.5gb"}
    assert mig["capacity"]["memory"] == {"value": "4864Mi"}
    assert {
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
    } <= set(mig["capacity"])


def test_unhealthy_devices_are_left_out_by_name_or_uuid() -> None:
    i = inv("t4x4")
    assert [d["name"] for d in slices.devices(i, {"gpu-1", i.gpus[2].uuid})] == ["gpu-0", "gpu-3"]


def test_the_generation_goes_up_only_on_change() -> None:
    i = inv("t4x4")
    devices = slices.devices(i)
    gen, wanted = slices.plan("n1", [], devices, 0)
    assert gen == 1
    assert wanted[0]["spec"]["pool"] == {
        "name": "n1",
        "generation": 1,
        "resourceSliceCount": 1,
    }
    same, _ = slices.plan("n1", wanted, devices, gen)
    assert same == 1
    changed, again = slices.plan("n1", wanted, devices[:3], gen)
    assert changed == 2
    assert len(again[0]["spec"]["devices"]) == 3


def test_many_devices_are_split_into_slices_of_128() -> None:
    devices = [{"name": f"d{i}"} for i in range(300)]
    _, wanted = slices.plan("n1", [], devices, 0)
    assert [len(s["spec"]["devices"]) for s in wanted] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in wanted} == {3}


def test_feature_gates_parse_and_refuse_unknown_names() -> None:
    assert gpuconfig.parse_gates("TimeSlicingSettings=true")["TimeSlicingSettings"] is True
    with pytest.raises(gpuconfig.ConfigError, match="unrecognized feature gate 'Nope'"):
        gpuconfig.parse_gates("Nope=true")
    with pytest.raises(gpuconfig.ConfigError, match="expected MPSSupport=true"):
        gpuconfig.parse_gates("MPSSupport=yes")


def gpu_config(strategy: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": strategy, **extra},
    }


def test_gpu_config_sharing_behind_its_gates() -> None:
    off = gpuconfig.parse_gates("")
    on = gpuconfig.parse_gates("TimeSlicingSettings=true")
    with pytest.raises(gpuconfig.ConfigError, match="'TimeSlicingSettings' feature gate"):
        gpuconfig.parse(gpu_config("TimeSlicing"), off, mig=False)
    got = gpuconfig.parse(
        gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Short"}), on, mig=False
    )
    assert (got.strategy, got.interval) == ("TimeSlicing", "Short")
    with pytest.raises(gpuconfig.ConfigError, match="unknown time-slice interval: Fast"):
        gpuconfig.parse(
            gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Fast"}), on, mig=False
        )
    with pytest.raises(gpuconfig.ConfigError, match="'MPSSupport' feature gate"):
        gpuconfig.parse(gpu_config("MPS"), on, mig=False)
    with pytest.raises(gpuconfig.ConfigError, match="use a MigDeviceConfig"):
        gpuconfig.parse(gpu_config("TimeSlicing"), on, mig=True)
    with pytest.raises(gpuconfig.ConfigError, match="unsupported opaque config"):
        gpuconfig.parse({"apiVersion": "v1", "kind": "X"}, on, mig=False)


def claim(device: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": "n1",
                            "device": device,
                        }
                    ],
                    "config": config or [],
                }
            }
        },
    }


def test_prepare_makes_exactly_the_claims_gpu_visible() -> None:
    i = inv("t4x4")
    plan = prepare.plan(claim("gpu-2"), slices.allocatable(i), i, gpuconfig.parse_gates(""))
    (dev,) = plan.devices
    assert dev.cdi_ids == ("k8s.gpu.nvidia.com/claim=u-1-gpu-2",)
    assert plan.spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert plan.spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={i.gpus[2].uuid}"]
    (entry,) = plan.spec["devices"]
    assert [n["path"] for n in entry["containerEdits"]["deviceNodes"]] == [
        f"/dev/nvidia{i.gpus[2].minor}"
    ]
    assert plan.sharing == ()


def test_prepare_refuses_foreign_devices_and_gated_sharing() -> None:
    i = inv("t4x4")
    with pytest.raises(prepare.PrepareError, match="device gpu-9 is not a device of this node"):
        prepare.plan(claim("gpu-9"), slices.allocatable(i), i, gpuconfig.parse_gates(""))
    config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": gpu_config("TimeSlicing")},
        }
    ]
    with pytest.raises(prepare.PrepareError, match="request gpu: 'TimeSlicing'"):
        prepare.plan(claim("gpu-0", config), slices.allocatable(i), i, gpuconfig.parse_gates(""))
    on = gpuconfig.parse_gates("TimeSlicingSettings=true")
    plan = prepare.plan(claim("gpu-0", config), slices.allocatable(i), i, on)
    assert [(a.uuid, a.sharing.interval) for a in plan.sharing] == [(i.gpus[0].uuid, "Default")]


def test_checkpoint_round_trip_checksum_and_reboot(tmp_path: Path) -> None:
    cp = checkpoint.Checkpoint(
        boot_id="b1",
        claims={
            "u-1": checkpoint.Claim(
                checkpoint.PREPARE_COMPLETED,
                "c",
                "ns",
                (checkpoint.Device("gpu", "n1", "gpu-0", "GPU-x", ("k=u-1-gpu-0",)),),
            )
        },
    )
    assert checkpoint.decode(checkpoint.encode(cp)) == cp
    path = tmp_path / checkpoint.FILE_NAME
    checkpoint.save(path, cp)
    assert checkpoint.load(path, "b1") == cp
    assert checkpoint.load(path, "b2").claims == {}  # the node rebooted
    path.write_text(path.read_text().replace("gpu-0", "gpu-1"))
    with pytest.raises(checkpoint.CorruptCheckpoint, match="checksum"):
        checkpoint.load(path, "b1")


def mps_config(**mps: Any) -> list[dict[str, Any]]:
    parameters = gpu_config("MPS", mpsConfig=mps) if mps else gpu_config("MPS")
    return [
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}
    ]


def test_an_mps_claim_gets_its_daemon_and_the_pipe_and_shm_in_its_cdi_spec() -> None:
    i = inv("t4x4")
    uuid = i.gpus[1].uuid
    with pytest.raises(prepare.PrepareError, match="'MPSSupport' feature gate"):
        prepare.plan(
            claim("gpu-1", mps_config()), slices.allocatable(i), i, gpuconfig.parse_gates("")
        )
    on = gpuconfig.parse_gates("MPSSupport=true")
    config = mps_config(
        defaultActiveThreadPercentage=25,
        defaultPinnedDeviceMemoryLimit="4Gi",
        defaultPerDevicePinnedMemoryLimit={"0": "1Gi"},
    )
    plan = prepare.plan(
        claim("gpu-1", config),
        slices.allocatable(i),
        i,
        on,
        mps_root="/kl/plugins/gpu.nvidia.com/mps",
    )
    assert plan.mps == prepare.MpsAction(
        "mps-control-daemon-u-1",
        (uuid,),
        (
            f"set_default_device_pinned_mem_limit {uuid} 1024M",
            "set_default_active_thread_percentage 25",
        ),
    )
    edits = plan.spec["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts["/tmp/nvidia-mps"] == "/kl/plugins/gpu.nvidia.com/mps/u-1/pipe"
    assert mounts["/dev/shm"] == "/kl/plugins/gpu.nvidia.com/mps/u-1/shm"
    # Without a config the daemon runs with the driver's defaults.
    bare = prepare.plan(claim("gpu-1", mps_config()), slices.allocatable(i), i, on)
    assert bare.mps is not None
    assert bare.mps.commands == ()


def test_mps_parameters_are_checked() -> None:
    on = gpuconfig.parse_gates("MPSSupport=true")
    for mps, message in (
        ({"defaultActiveThreadPercentage": 101}, "0 to 100"),
        ({"defaultPinnedDeviceMemoryLimit": "lots"}, "not a memory quantity"),
        ({"defaultPinnedDeviceMemoryLimit": "10Ki"}, "too low"),
        ({"pinned": "1Gi"}, "unknown field"),
    ):
        with pytest.raises(gpuconfig.ConfigError, match=message):
            gpuconfig.parse(gpu_config("MPS", mpsConfig=mps), on, mig=False)
    with pytest.raises(gpuconfig.ConfigError, match="no such device in the claim"):
        gpuconfig.mps_commands({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}, ["GPU-a"])
    assert gpuconfig.mps_commands({"defaultPinnedDeviceMemoryLimit": "2G"}, ["GPU-a", "GPU-b"]) == [
        "set_default_device_pinned_mem_limit GPU-a 1907M",
        "set_default_device_pinned_mem_limit GPU-b 1907M",
    ]


def test_the_checkpoint_keeps_a_claims_mps_daemon() -> None:
    c = checkpoint.Claim(
        checkpoint.PREPARE_COMPLETED, "c", "ns", mps_uuids=("GPU-a",), mps_commands=("x 1",)
    )
    cp = checkpoint.Checkpoint(boot_id="b", claims={"u": c})
    assert checkpoint.decode(checkpoint.encode(cp)) == cp
