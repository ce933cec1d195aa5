"""The validator's pure parts: markers, driver info, flags, modules, GPU resources, settings."""

from __future__ import annotations

import pytest

from gpu_operator.agents.validator import command, components


def test_driver_ready_of_a_host_driver_points_everything_at_the_host() -> None:
    info = components.driver_info(
        is_host_driver=True, host_root="/", install_dir="", dev_in_driver_root=False
    )
    assert components.driver_ready_text(info) == (
        "IS_HOST_DRIVER=true\n"
        "NVIDIA_DRIVER_ROOT=/\n"
        "DRIVER_ROOT_CTR_PATH=/host\n"
        "NVIDIA_DEV_ROOT=/\n"
        "DEV_ROOT_CTR_PATH=/host\n"
    )


def test_driver_ready_of_a_driver_container_uses_its_install_dir() -> None:
    info = components.driver_info(
        is_host_driver=False,
        host_root="/",
        install_dir="/run/nvidia/driver",
        dev_in_driver_root=False,
    )
    assert components.driver_ready_text(info).splitlines() == [
        "IS_HOST_DRIVER=false",
        "NVIDIA_DRIVER_ROOT=/run/nvidia/driver",
        "DRIVER_ROOT_CTR_PATH=/driver-root",
        "NVIDIA_DEV_ROOT=/",
        "DEV_ROOT_CTR_PATH=/host",
    ]


def test_a_driver_root_with_its_own_dev_is_the_dev_root() -> None:
    info = components.driver_info(
        is_host_driver=False, host_root="/", install_dir="/opt/driver", dev_in_driver_root=True
    )
    assert (info.dev_root, info.dev_root_ctr_path) == ("/opt/driver", "/driver-root")


@pytest.mark.parametrize(
    ("text", "features"),
    [
        ("GDS_ENABLED=true\nGDRCOPY_ENABLED=false\n", ["nvidia-fs"]),
        ("GPU_DIRECT_RDMA_ENABLED: true\nGDRCOPY_ENABLED: 'true'\n", ["gdrcopy", "nvidia-peermem"]),
        ("# comment\nexport GDS_ENABLED=TRUE\n", ["nvidia-fs"]),
        ("", []),
        ("UNKNOWN_ENABLED=true\n", []),
    ],
)
def test_driver_features_come_from_the_driver_containers_flags(
    text: str, features: list[str]
) -> None:
    assert components.driver_features(text) == features


def test_loaded_modules_reads_proc_modules() -> None:
    text = (
        "nvidia_uvm 1540096 0 - Live 0x0000000000000000 (POE)\n"
        "nvidia 56799232 2 nvidia_uvm, Live 0x0000000000000000 (POE)\n\n"
    )
    assert components.loaded_modules(text) == {"nvidia_uvm", "nvidia"}


def test_gpu_count_adds_full_gpus_shared_replicas_and_mig_devices() -> None:
    capacity = {"cpu": "64", "nvidia.com/gpu": "2", "nvidia.com/gpu.shared": "8",
                "nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpux": "bad"}  # fmt: skip
    assert components.gpu_count(capacity) == 17
    assert components.gpu_count({"cpu": "8", "nvidia.com/gpu": "0"}) == 0


def test_the_workload_resource_prefers_an_available_mig_resource() -> None:
    assert components.workload_resource({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "2"}) == (
        "nvidia.com/mig-1g.5gb"
    )
    assert components.workload_resource({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "0"}) == (
        "nvidia.com/gpu"
    )
    assert components.workload_resource({"cpu": "4"}) is None


@pytest.mark.parametrize(
    ("owner", "owned"),
    [
        ({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "controller": True}, True),
        ({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "controller": True}, True),
        ({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy"}, False),
        ({"apiVersion": "example.com/v1", "kind": "ClusterPolicy", "controller": True}, False),
    ],
)
def test_a_driver_daemonset_is_the_operators_when_its_controller_is_a_policy(
    owner: dict[str, object], owned: bool
) -> None:
    ds = {"metadata": {"ownerReferences": [owner]}}
    assert components.owned_by_operator(ds) is owned


def test_unknown_components_name_the_known_ones_or_the_agent_to_use() -> None:
    assert "expected one of driver, toolkit, cuda, plugin" in components.unknown_component("gpu")
    assert components.unknown_component("vfio-pci") == (
        "component 'vfio-pci' is validated by `gpu-operator agent sandbox-validator`"
    )


def test_output_tail_is_the_last_non_empty_line() -> None:
    assert components.output_tail("a\nb failed\n\n") == "b failed"
    assert components.output_tail("") == ""


def test_settings_have_upstreams_defaults() -> None:
    settings = command.settings_from({"COMPONENT": "driver"})
    assert (settings.with_wait, settings.with_workload, settings.sleep_interval) == (
        False,
        True,
        5.0,
    )
    assert (settings.output_dir, settings.driver_install_dir_ctr_path) == (
        "/run/nvidia/validations",
        "/run/nvidia/driver",
    )
    assert (settings.pod_retries, settings.pod_interval) == (60, 5.0)
    assert (settings.resource_retries, settings.resource_interval) == (30, 5.0)
    assert settings.wait_retries == 60


def test_settings_read_the_workload_env() -> None:
    settings = command.settings_from(
        {
            "COMPONENT": "cuda",
            "WITH_WAIT": "TRUE",
            "VALIDATOR_IMAGE": "nvcr.io/v:1",
            "VALIDATOR_IMAGE_PULL_POLICY": "Always",
            "VALIDATOR_IMAGE_PULL_SECRETS": "a, b,,",
            "VALIDATOR_RUNTIME_CLASS": "nvidia",
            "POD_CREATION_WAIT_RETRIES": "3",
        }
    )
    assert settings.with_wait is True
    assert settings.workload.pull_secrets == ("a", "b")
    assert (settings.workload.runtime_class, settings.pod_retries) == ("nvidia", 3)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("WITH_WAIT", "maybe", "WITH_WAIT: expected true or false, got 'maybe'"),
        ("SLEEP_INTERVAL_SECONDS", "soon", "SLEEP_INTERVAL_SECONDS: expected a number of seconds"),
        ("POD_CREATION_WAIT_RETRIES", "0", "POD_CREATION_WAIT_RETRIES: expected a positive value"),
        ("WITH_WAIT_RETRIES", "1.5", "WITH_WAIT_RETRIES: expected a whole number"),
    ],
)
def test_bad_settings_name_the_variable(name: str, value: str, expected: str) -> None:
    with pytest.raises(command.SettingsError, match=expected):
        command.settings_from({"COMPONENT": "driver", name: value})


def test_a_workload_result_is_vector_adds_verdict_or_the_last_line() -> None:
    log = "[Vector addition of 50000 elements]\nTest PASSED\nDone\n"
    assert components.workload_result(log) == "Test PASSED"
    assert components.workload_result("step\nfinished\n\n") == "finished"
    assert components.workload_result("") == ""
