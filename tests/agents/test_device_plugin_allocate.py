"""Allocate: device IDs in, what the container runtime must inject out, per strategy and option."""

from __future__ import annotations

import pytest

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import allocate as alloc
from gpu_operator.agents.device_plugin import devices
from gpu_operator.agents.device_plugin.allocate import AllocateOptions, DeviceSpec, Mount
from gpu_operator.agents.device_plugin.devices import Device, Resource

GPU0 = Device("GPU-aaa", "GPU-aaa", "0", 0, ("/dev/nvidia0",), 40960, "8.0", parent_uuid="GPU-aaa")
GPU1 = Device("GPU-bbb", "GPU-bbb", "1", 1, ("/dev/nvidia1",), 40960, "8.0", parent_uuid="GPU-bbb")
MIG = Device(
    "MIG-ccc",
    "MIG-ccc",
    "0:1",
    0,
    ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"),
    19968,
    "8.0",
    gpu_instance_id=2,
    compute_instance_id=0,
    parent_uuid="GPU-aaa",
)
GPUS = Resource("nvidia.com/gpu", (GPU0, GPU1))


def shared(strategy: pc.SharingStrategy, *, fail: bool) -> Resource:
    return Resource("nvidia.com/gpu", tuple(devices.replicate([GPU0, GPU1], 4)), strategy, fail)


def one(resource: Resource, ids: list[str], **options: object) -> alloc.ContainerAllocation:
    opts = AllocateOptions(**options)  # type: ignore[arg-type]
    return alloc.allocate_container(resource, ids, opts, "req-1")


def test_envvar_strategy_lists_uuids_in_nvidia_visible_devices() -> None:
    out = one(GPUS, ["GPU-bbb", "GPU-aaa"])
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-bbb,GPU-aaa"}
    assert out.mounts == []
    assert out.devices == []
    assert out.annotations == {}


def test_index_id_strategy_lists_device_indices() -> None:
    out = one(Resource("nvidia.com/gpu", (GPU0, GPU1, MIG)), ["MIG-ccc", "GPU-bbb"],
              device_id_strategy="index")  # fmt: skip
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == "0:1,1"


def test_replica_ids_are_stripped_and_deduplicated_in_request_order() -> None:
    r = shared(pc.SharingStrategy.TIME_SLICING, fail=False)
    out = one(r, ["GPU-bbb::2", "GPU-aaa::0", "GPU-bbb::3"])
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-bbb,GPU-aaa"
    out = one(r, ["GPU-bbb::2", "GPU-bbb::3"], device_id_strategy="index")
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == "1"


def test_shared_request_larger_than_one_fails_when_configured() -> None:
    r = shared(pc.SharingStrategy.TIME_SLICING, fail=True)
    with pytest.raises(alloc.AllocateError) as err:
        one(r, ["GPU-aaa::0", "GPU-bbb::0"])
    assert str(err.value) == (
        "request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1"
    )
    assert one(r, ["GPU-aaa::0"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa"
    assert one(shared(pc.SharingStrategy.TIME_SLICING, fail=False), ["GPU-aaa::0", "GPU-bbb::0"])


def test_unknown_device_is_refused_with_upstreams_message() -> None:
    with pytest.raises(alloc.AllocateError) as err:
        one(GPUS, ["GPU-aaa", "GPU-zzz"])
    assert (
        str(err.value) == "invalid allocation request for 'nvidia.com/gpu': unknown device: GPU-zzz"
    )


def test_volume_mounts_strategy_mounts_dev_null_per_device_and_points_the_env_at_the_root() -> None:
    out = one(GPUS, ["GPU-aaa", "GPU-bbb"], device_list_strategies=("volume-mounts",))
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert out.mounts == [
        Mount("/var/run/nvidia-container-devices/GPU-aaa", "/dev/null"),
        Mount("/var/run/nvidia-container-devices/GPU-bbb", "/dev/null"),
    ]


def test_cdi_annotations_name_the_devices_under_the_prefix_and_response_id() -> None:
    out = one(GPUS, ["GPU-aaa", "GPU-bbb"], device_list_strategies=("cdi-annotations",))
    assert out.annotations == {
        "cdi.k8s.io/nvidia-device-plugin_req-1": "k8s.device-plugin.nvidia.com/gpu=GPU-aaa,"
        "k8s.device-plugin.nvidia.com/gpu=GPU-bbb"
    }
    assert out.envs == {}
    assert out.cdi_devices == []


def test_custom_cdi_annotation_prefix_replaces_cdi_k8s_io() -> None:
    out = one(GPUS, ["GPU-aaa"], device_list_strategies=("cdi-annotations",),
              cdi_annotation_prefix="nvidia.cdi.k8s.io/")  # fmt: skip
    assert list(out.annotations) == ["nvidia.cdi.k8s.io/nvidia-device-plugin_req-1"]


def test_cdi_cri_returns_cdi_devices_for_the_cri() -> None:
    out = one(GPUS, ["GPU-aaa"], device_list_strategies=("cdi-cri",))
    assert out.cdi_devices == ["k8s.device-plugin.nvidia.com/gpu=GPU-aaa"]
    assert out.annotations == {}
    assert out.envs == {}


def test_cdi_with_index_ids_names_devices_by_index() -> None:
    out = one(Resource("nvidia.com/gpu", (GPU0, MIG)), ["MIG-ccc"],
              device_list_strategies=("cdi-cri",), device_id_strategy="index")  # fmt: skip
    assert out.cdi_devices == ["k8s.device-plugin.nvidia.com/gpu=0:1"]


def test_cdi_plus_envvar_gives_both_and_the_env() -> None:
    out = one(GPUS, ["GPU-aaa"], device_list_strategies=("envvar", "cdi-annotations", "cdi-cri"))
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa"}
    assert len(out.annotations) == 1
    assert len(out.cdi_devices) == 1


def test_pass_device_specs_gives_present_control_nodes_and_device_nodes_under_the_dev_root() -> (
    None
):
    out = one(
        Resource("nvidia.com/gpu", (GPU0, MIG)),
        ["GPU-aaa", "MIG-ccc"],
        pass_device_specs=True,
        dev_root="/run/nvidia/driver",
        present_control_nodes=frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm"}),
    )
    assert out.devices == [
        DeviceSpec("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        DeviceSpec("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        DeviceSpec("/dev/nvidia0", "/run/nvidia/driver/dev/nvidia0", "rw"),
        DeviceSpec(
            "/dev/nvidia-caps/nvidia-cap21", "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap21"
        ),
        DeviceSpec(
            "/dev/nvidia-caps/nvidia-cap22", "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap22"
        ),
    ]


def test_device_specs_with_the_root_dev_root_keep_plain_paths() -> None:
    out = one(GPUS, ["GPU-bbb"], pass_device_specs=True)
    assert out.devices == [DeviceSpec("/dev/nvidia1", "/dev/nvidia1", "rw")]


def test_gds_mofed_and_gdrcopy_switch_their_env_vars_on() -> None:
    out = one(GPUS, ["GPU-aaa"], gds=True, mofed=True, gdrcopy=True)
    assert out.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaa",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
        "NVIDIA_GDRCOPY": "enabled",
    }


def test_cdi_names_extra_classes_only_when_their_spec_has_devices() -> None:
    opts = {"device_list_strategies": ("cdi-cri",), "gds": True, "mofed": True}
    assert one(GPUS, ["GPU-aaa"], **opts).cdi_devices == [
        "k8s.device-plugin.nvidia.com/gpu=GPU-aaa"
    ]
    out = one(GPUS, ["GPU-aaa"], cdi_extra_classes=frozenset({"gds"}), **opts)
    assert out.cdi_devices == [
        "k8s.device-plugin.nvidia.com/gpu=GPU-aaa",
        "k8s.device-plugin.nvidia.com/gds=all",
    ]
    assert out.envs == {}  # all strategies are CDI: no env, even for GDS


def test_imex_channels_go_to_the_env_mounts_and_cdi_names() -> None:
    out = one(GPUS, ["GPU-aaa"], imex_channels=("0",))
    assert out.envs["NVIDIA_IMEX_CHANNELS"] == "0"
    out = one(GPUS, ["GPU-aaa"], imex_channels=("0",), device_list_strategies=("volume-mounts",))
    assert Mount("/var/run/nvidia-container-devices/imex/0", "/dev/null") in out.mounts
    out = one(GPUS, ["GPU-aaa"], imex_channels=("0",), device_list_strategies=("cdi-cri",))
    assert out.cdi_devices[-1] == "k8s.device-plugin.nvidia.com/imex-channel=0"


def test_mps_adds_the_pipe_directory_env_and_pipe_and_shm_mounts() -> None:
    r = shared(pc.SharingStrategy.MPS, fail=True)
    out = one(r, ["GPU-aaa::1"], mps_root="/run/nvidia/mps")
    assert out.envs == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaa",
    }
    assert out.mounts == [
        Mount("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        Mount("/dev/shm", "/run/nvidia/mps/shm"),
    ]


def test_options_from_config_resolve_dev_root_strategies_and_mps() -> None:
    cfg = pc.parse(
        {
            "flags": {
                "nvidiaDriverRoot": "/run/nvidia/driver",
                "mpsRoot": "/run/nvidia/mps",
                "plugin": {"deviceListStrategy": ["envvar", "cdi-cri"], "passDeviceSpecs": True},
            },
            "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
        }
    )
    opts = AllocateOptions.from_config(cfg, shared(pc.SharingStrategy.MPS, fail=True))
    assert opts.device_list_strategies == ("envvar", "cdi-cri")
    assert opts.dev_root == "/run/nvidia/driver"
    assert opts.mps_root == "/run/nvidia/mps"
    assert opts.pass_device_specs
    assert opts.cdi_enabled
    assert not opts.only_cdi
    assert AllocateOptions.from_config(cfg, GPUS).mps_root is None


def test_allocate_answers_every_container_request_with_its_own_cdi_response_id() -> None:
    ids = iter(["first", "second"])
    out = alloc.allocate(GPUS, [["GPU-aaa"], ["GPU-bbb"]],
                         AllocateOptions(device_list_strategies=("cdi-annotations",)),
                         new_id=lambda: next(ids))  # fmt: skip
    assert [list(o.annotations) for o in out] == [
        ["cdi.k8s.io/nvidia-device-plugin_first"],
        ["cdi.k8s.io/nvidia-device-plugin_second"],
    ]
