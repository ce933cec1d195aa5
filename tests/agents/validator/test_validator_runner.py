"""Each validation on a temporary container root with scripted programs and an in-memory API:
markers removed first and written on success, bounded waits, and one failure message that is
both the last log line and the termination message."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from validator_fakes import (
    FakeCluster,
    FakeContainer,
    driver_daemonset,
    pod,
    succeeded,
    validator_daemonset,
)
from waiting import within

from gpu_operator.agents.validator import runner, workload
from gpu_operator.agents.validator.protocols import ProgramResult

NS = "gpu-operator"
NODE = "node-1"
FAST = runner.Settings(
    component="driver",
    node_name=NODE,
    namespace=NS,
    sleep_interval=0.01,
    wait_retries=3,
    pod_interval=0.01,
    pod_retries=3,
    resource_interval=0.01,
    resource_retries=3,
    workload=workload.WorkloadSpec(image="validator:1", runtime_class="nvidia"),
)
SMI_TABLE = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |\n"


def _settings(**changes: Any) -> runner.Settings:
    return dataclasses.replace(FAST, **changes)


async def _validate(container: FakeContainer, cluster: FakeCluster | None, **changes: Any) -> int:
    return await runner.Validator(_settings(**changes), container, cluster).run()


@pytest.fixture
def container(tmp_path: Path) -> FakeContainer:
    return FakeContainer(tmp_path)


def _driver_container_install(container: FakeContainer) -> None:
    container.file("/run/nvidia/driver/usr/bin/nvidia-smi")
    container.file("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    container.file("/run/nvidia/validations/.driver-ctr-ready", "")
    container.program("/run/nvidia/driver/usr/bin/nvidia-smi", stdout=SMI_TABLE)


def _last_error(caplog: pytest.LogCaptureFixture) -> str:
    records = [r for r in caplog.records if r.name == "gpu_operator.agents.validator"]
    assert records[-1].levelno == logging.ERROR
    return records[-1].getMessage()


# ----- driver ------------------------------------------------------------------------------


async def test_a_host_driver_is_validated_with_chroot_and_recorded_as_the_hosts(
    container: FakeContainer,
) -> None:
    container.file("/host/usr/bin/nvidia-smi")
    container.program("chroot", stdout=SMI_TABLE)
    assert await _validate(container, FakeCluster()) == 0
    assert container.calls[0][0] == ["chroot", "/host", "/usr/bin/nvidia-smi"]
    assert (
        "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n"
        in container.marker("driver-ready").read_text()
    )


async def test_an_empty_or_non_executable_host_nvidia_smi_is_no_host_driver(
    container: FakeContainer,
) -> None:
    container.file("/host/usr/bin/nvidia-smi", "", 0o755)
    container.file("/host/usr/sbin/nvidia-smi", "x", 0o644)
    _driver_container_install(container)
    cluster = FakeCluster(daemonsets_=[driver_daemonset()])
    assert await _validate(container, cluster) == 0
    assert all(call[0][0] != "chroot" for call in container.calls)
    assert "IS_HOST_DRIVER=false" in container.marker("driver-ready").read_text()


async def test_the_driver_containers_nvidia_smi_runs_with_its_nvml_preloaded(
    container: FakeContainer,
) -> None:
    _driver_container_install(container)
    cluster = FakeCluster(daemonsets_=[driver_daemonset()])
    assert await _validate(container, cluster) == 0
    argv, env = container.calls[-1]
    assert argv == ["/run/nvidia/driver/usr/bin/nvidia-smi"]
    assert env == {"LD_PRELOAD": "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}
    assert container.marker("driver-ready").read_text() == (
        "IS_HOST_DRIVER=false\n"
        "NVIDIA_DRIVER_ROOT=/run/nvidia/driver\n"
        "DRIVER_ROOT_CTR_PATH=/driver-root\n"
        "NVIDIA_DEV_ROOT=/\n"
        "DEV_ROOT_CTR_PATH=/host\n"
    )


async def test_skip_gpu_init_asks_nvidia_smi_only_for_its_version(
    container: FakeContainer,
) -> None:
    _driver_container_install(container)
    cluster = FakeCluster(daemonsets_=[driver_daemonset()])
    assert await _validate(container, cluster, skip_gpu_init=True) == 0
    assert container.calls[-1][0] == ["/run/nvidia/driver/usr/bin/nvidia-smi", "--version"]


async def test_a_driver_container_that_never_gets_ready_fails_bounded_naming_its_pod(
    container: FakeContainer, caplog: pytest.LogCaptureFixture
) -> None:
    container.file("/run/nvidia/validations/driver-ready", "stale")
    crashing = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "nvidia-driver-ctr", "ready": False, "restartCount": 2,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        ],
    }  # fmt: skip
    cluster = FakeCluster(
        daemonsets_=[driver_daemonset()],
        pods_={"drv": pod("nvidia-driver-daemonset-abc", NS, NODE,
                          {"app.kubernetes.io/component": "nvidia-driver"}, crashing)},
    )  # fmt: skip
    caplog.set_level(logging.INFO)
    assert await _validate(container, cluster, with_wait=True) == 1
    expected = (
        "driver: /run/nvidia/validations/.driver-ctr-ready not present after 0.03 s: the driver "
        "container on this node is not ready (pod nvidia-driver-daemonset-abc: container "
        "nvidia-driver-ctr in CrashLoopBackOff (restarted 2 times))"
    )
    assert container.termination_message == expected + "\n"
    assert _last_error(caplog) == expected
    assert not container.marker("driver-ready").exists()


async def test_without_a_driver_pod_the_failure_says_so(container: FakeContainer) -> None:
    cluster = FakeCluster(daemonsets_=[driver_daemonset()])
    assert await _validate(container, cluster) == 1
    assert container.termination_message is not None
    assert container.termination_message.endswith(f"(no driver pod runs on node {NODE})\n")


async def test_a_failing_driver_nvidia_smi_is_quoted(container: FakeContainer) -> None:
    _driver_container_install(container)
    container.program(
        "/run/nvidia/driver/usr/bin/nvidia-smi",
        code=9,
        stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    )
    assert await _validate(container, FakeCluster(daemonsets_=[driver_daemonset()])) == 1
    assert container.termination_message == (
        "driver: /run/nvidia/driver/usr/bin/nvidia-smi failed (exit code 9): NVIDIA-SMI has "
        "failed because it couldn't communicate with the NVIDIA driver.\n"
    )


async def test_a_driver_root_without_nvml_is_named(container: FakeContainer) -> None:
    container.file("/run/nvidia/driver/usr/bin/nvidia-smi")
    container.file("/run/nvidia/validations/.driver-ctr-ready", "")
    assert await _validate(container, FakeCluster(daemonsets_=[driver_daemonset()])) == 1
    assert container.termination_message == (
        "driver: no libnvidia-ml.so.1 in the driver root /run/nvidia/driver\n"
    )


async def test_without_an_operator_driver_daemonset_the_driver_root_alone_is_checked(
    container: FakeContainer,
) -> None:
    container.file("/run/nvidia/driver/usr/bin/nvidia-smi")
    container.file("/run/nvidia/driver/lib64/libnvidia-ml.so.1")
    container.program("/run/nvidia/driver/usr/bin/nvidia-smi")
    assert await _validate(container, FakeCluster()) == 0  # no .driver-ctr-ready needed


async def test_a_driver_root_with_dev_is_the_dev_root(container: FakeContainer) -> None:
    _driver_container_install(container)
    container.path("/run/nvidia/driver/dev").mkdir(parents=True)
    assert await _validate(container, FakeCluster(daemonsets_=[driver_daemonset()])) == 0
    text = container.marker("driver-ready").read_text()
    assert "NVIDIA_DEV_ROOT=/run/nvidia/driver\nDEV_ROOT_CTR_PATH=/driver-root\n" in text


async def test_extras_the_driver_container_installed_are_validated_too(
    container: FakeContainer,
) -> None:
    _driver_container_install(container)
    container.file("/run/nvidia/validations/.driver-ctr-ready", "GDS_ENABLED=true\n")
    container.file("/proc/modules", "nvidia_fs 1 0 - Live 0x0\nnvidia 5 1 - Live 0x0\n")
    assert await _validate(container, FakeCluster(daemonsets_=[driver_daemonset()])) == 0
    assert container.marker("nvidia-fs-ready").exists()
    assert container.marker("driver-ready").exists()


async def test_a_missing_extra_module_fails_the_driver_validation(
    container: FakeContainer,
) -> None:
    _driver_container_install(container)
    container.file("/run/nvidia/validations/.driver-ctr-ready", "GDRCOPY_ENABLED=true\n")
    container.file("/proc/modules", "nvidia 5 1 - Live 0x0\n")
    assert await _validate(container, FakeCluster(daemonsets_=[driver_daemonset()])) == 1
    assert container.termination_message == "gdrcopy: kernel module gdrdrv is not loaded\n"
    assert not container.marker("driver-ready").exists()


def _char_device(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating character devices needs CAP_MKNOD")


async def test_dev_char_symlinks_point_at_the_nvidia_devices(container: FakeContainer) -> None:
    container.file("/host/usr/bin/nvidia-smi")
    container.program("chroot")
    _char_device(container.path("/host/dev/nvidia0"), 195, 0)
    _char_device(container.path("/host/dev/nvidiactl"), 195, 255)
    container.file("/host/dev/nvidia-not-a-device", "x", 0o644)
    assert await _validate(container, FakeCluster()) == 0
    links = container.path("/host-dev-char")
    assert {p.name: os.readlink(p) for p in links.iterdir()} == {
        "195:0": "../nvidia0",
        "195:255": "../nvidiactl",
    }


async def test_dev_char_symlinks_can_be_disabled(container: FakeContainer) -> None:
    container.file("/host/usr/bin/nvidia-smi")
    container.program("chroot")
    _char_device(container.path("/host/dev/nvidia0"), 195, 0)
    assert await _validate(container, FakeCluster(), disable_dev_char_symlinks=True) == 0
    assert not container.path("/host-dev-char").exists()


# ----- modules, toolkit, mofed --------------------------------------------------------------


async def test_a_loaded_module_writes_its_marker(container: FakeContainer) -> None:
    container.file("/proc/modules", "nvidia_peermem 16384 0 - Live 0x0\n")
    assert await _validate(container, None, component="nvidia-peermem") == 0
    assert container.marker("nvidia-peermem-ready").exists()


async def test_the_toolkit_validation_runs_nvidia_smi_in_its_container(
    container: FakeContainer,
) -> None:
    container.program("nvidia-smi", stdout=SMI_TABLE)
    assert await _validate(container, None, component="toolkit") == 0
    assert container.calls == [(["nvidia-smi"], {})]
    assert container.marker("toolkit-ready").exists()


async def test_no_injected_nvidia_smi_points_at_the_runtime(container: FakeContainer) -> None:
    container.file("/run/nvidia/validations/toolkit-ready", "")
    assert await _validate(container, None, component="toolkit") == 1
    assert container.termination_message == (
        'toolkit: nvidia-smi is not in this container (exec: "nvidia-smi": executable file not '
        "found in $PATH): the container runtime injected no driver (is the runtime class "
        "configured on this node?)\n"
    )
    assert not container.marker("toolkit-ready").exists()


async def test_with_wait_the_toolkit_validation_retries_until_nvidia_smi_works(
    container: FakeContainer,
) -> None:
    answers = iter([ProgramResult(6, "No devices were found\n", ""), ProgramResult(0, "ok", "")])
    container.programs["nvidia-smi"] = lambda argv, env: next(answers)
    assert await _validate(container, None, component="toolkit", with_wait=True) == 0


async def test_mofed_is_skipped_without_gpudirect_rdma(container: FakeContainer) -> None:
    assert await _validate(container, FakeCluster(), component="mofed") == 0
    assert not container.marker("mofed-ready").exists()


async def test_mofed_waits_for_the_mofed_driver_container(container: FakeContainer) -> None:
    cluster = FakeCluster(
        nodes={
            NODE: {"metadata": {"labels": {"feature.node.kubernetes.io/pci-15b3.present": "true"}}}
        }
    )
    assert await _validate(container, cluster, component="mofed", gpu_direct_rdma=True) == 1
    assert container.termination_message == (
        "mofed: /run/mellanox/drivers/.driver-ready is not there yet\n"
    )
    container.file("/run/mellanox/drivers/.driver-ready", "")
    assert await _validate(container, cluster, component="mofed", gpu_direct_rdma=True) == 0
    assert container.marker("mofed-ready").exists()


# ----- cuda and plugin workloads ------------------------------------------------------------


async def test_the_cuda_workload_replaces_the_previous_pod_and_writes_cuda_ready(
    container: FakeContainer,
) -> None:
    old = pod("nvidia-cuda-validator-old", NS, NODE, {"app": "nvidia-cuda-validator"}, {})
    other = pod(
        "nvidia-cuda-validator-elsewhere", NS, "node-2", {"app": "nvidia-cuda-validator"}, {}
    )
    cluster = FakeCluster(
        daemonsets_=[validator_daemonset()],
        pods_={"nvidia-cuda-validator-old": old, "nvidia-cuda-validator-elsewhere": other},
        script=succeeded,
    )
    assert await _validate(container, cluster, component="cuda") == 0
    assert cluster.deleted == ["nvidia-cuda-validator-old"]
    [created] = cluster.created
    assert created["spec"]["nodeName"] == NODE
    assert created["spec"]["runtimeClassName"] == "nvidia"
    assert created["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert created["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert container.marker("cuda-ready").exists()


async def test_a_succeeded_workload_is_logged_with_its_result(
    container: FakeContainer, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster(script=succeeded)
    cluster.logs[("nvidia-cuda-validator-00001", "cuda-validation")] = "Test PASSED\nDone\n"
    caplog.set_level(logging.INFO)
    assert await _validate(container, cluster, component="cuda") == 0
    assert (
        "cuda: pod nvidia-cuda-validator-00001 succeeded (cuda-validation: Test PASSED)"
        in caplog.messages
    )


async def test_a_failing_cuda_workload_names_the_pod_container_and_cuda_error(
    container: FakeContainer, caplog: pytest.LogCaptureFixture
) -> None:
    def fails(_pod: dict[str, Any]) -> dict[str, Any]:
        terminated = {"exitCode": 1, "reason": "Error",
                      "message": "Failed to launch vectorAdd kernel (error code uncorrectable "
                                 "ECC error encountered)!\n"}  # fmt: skip
        return {
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": "cuda-validation", "state": {"terminated": terminated}}
            ],
        }

    cluster = FakeCluster(daemonsets_=[validator_daemonset()], script=fails)
    caplog.set_level(logging.INFO)
    assert await _validate(container, cluster, component="cuda") == 1
    expected = (
        "cuda: pod nvidia-cuda-validator-00001 failed: container cuda-validation (exit code 1): "
        "Failed to launch vectorAdd kernel (error code uncorrectable ECC error encountered)!"
    )
    assert container.termination_message == expected + "\n"
    assert _last_error(caplog) == expected
    assert not container.marker("cuda-ready").exists()


async def test_a_cuda_workload_that_never_finishes_times_out_with_its_state(
    container: FakeContainer,
) -> None:
    cluster = FakeCluster(script=lambda _pod: {"phase": "Pending"})
    assert await _validate(container, cluster, component="cuda") == 1
    assert container.termination_message == (
        "cuda: pod nvidia-cuda-validator-00001 did not succeed within 0.03 s: Pending\n"
    )


async def test_without_workload_cuda_only_writes_its_marker(container: FakeContainer) -> None:
    cluster = FakeCluster()
    assert await _validate(container, cluster, component="cuda", with_workload=False) == 0
    assert cluster.created == []
    assert container.marker("cuda-ready").exists()


def _gpu_node(capacity: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": NODE}, "status": {"capacity": capacity, "allocatable": capacity}}


async def test_the_plugin_validation_waits_for_gpu_capacity_and_names_the_plugin_pod(
    container: FakeContainer,
) -> None:
    serving = {"name": "nvidia-device-plugin", "ready": True, "state": {"running": {}}}
    labels = {"app": "nvidia-device-plugin-daemonset"}
    status = {"phase": "Running", "containerStatuses": [serving]}
    plugin = pod("nvidia-device-plugin-daemonset-x", NS, NODE, labels, status)
    cluster = FakeCluster(nodes={NODE: _gpu_node({"cpu": "8"})}, pods_={"x": plugin})
    assert await _validate(container, cluster, component="plugin", with_workload=False) == 1
    assert container.termination_message == (
        "plugin: node node-1 has no nvidia.com/gpu or nvidia.com/mig-* capacity after 0.03 s: "
        "the device plugin has not registered the GPUs (pod nvidia-device-plugin-daemonset-x is "
        "running and ready)\n"
    )


async def test_the_plugin_workload_requests_a_mig_device_when_there_is_one(
    container: FakeContainer,
) -> None:
    node = _gpu_node({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7"})
    cluster = FakeCluster(nodes={NODE: node}, script=succeeded)
    assert await _validate(container, cluster, component="plugin") == 0
    [created] = cluster.created
    limits = created["spec"]["initContainers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "1"}
    assert container.marker("plugin-ready").exists()


# ----- usage, skipping, stopping ------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"component": "gpu"}, "validator: unknown component 'gpu'; expected one of driver"),
        ({"component": "cc-manager"}, "`gpu-operator agent sandbox-validator`"),
        ({"component": "cuda", "namespace": ""}, "cuda: OPERATOR_NAMESPACE (--namespace) is"),
        ({"component": "plugin", "node_name": ""}, "plugin: NODE_NAME (--node-name) is required"),
    ],
)
async def test_bad_settings_exit_2_with_a_message(
    container: FakeContainer, changes: dict[str, Any], message: str
) -> None:
    assert await _validate(container, FakeCluster(), **changes) == 2
    assert container.termination_message is not None
    assert message in container.termination_message


async def test_skip_validation_writes_the_marker_without_checking(
    container: FakeContainer,
) -> None:
    assert await _validate(container, None, component="toolkit", skip_validation=True) == 0
    assert container.calls == []
    assert container.marker("toolkit-ready").exists()
    assert await _validate(container, None, component="driver", skip_validation=True) == 1


async def test_a_stop_request_ends_a_wait_as_a_failure(container: FakeContainer) -> None:
    stop = asyncio.Event()
    settings = _settings(component="toolkit", with_wait=True, wait_retries=1000)
    task = asyncio.create_task(runner.Validator(settings, container, None, stop).run())
    await asyncio.sleep(0)  # the first check runs; then the wait sees the stop
    stop.set()
    assert await within(task, "the validator to give up") == 1
    assert container.termination_message is not None
    assert container.termination_message.startswith("toolkit: stopped while waiting for nvidia-smi")


async def test_cleanup_all_empties_the_output_dir_first(container: FakeContainer) -> None:
    container.file("/run/nvidia/validations/plugin-ready", "")
    container.file("/proc/modules", "gdrdrv 1 0 - Live 0x0\n")
    assert await _validate(container, None, component="gdrcopy", cleanup_all=True) == 0
    names = sorted(p.name for p in container.path("/run/nvidia/validations").iterdir())
    assert names == ["gdrcopy-ready"]


async def test_an_api_error_is_one_line_and_the_termination_message(
    container: FakeContainer,
) -> None:
    class Broken(FakeCluster):
        async def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
            raise RuntimeError("pods is forbidden: cannot create pods")

    assert await _validate(container, Broken(), component="cuda") == 1
    assert container.termination_message == (
        "cuda: RuntimeError: pods is forbidden: cannot create pods\n"
    )
