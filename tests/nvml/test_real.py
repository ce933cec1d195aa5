"""The real backend on nvidia-ml-py: error mapping everywhere, read-only calls on a real GPU."""

from __future__ import annotations

import types

import pytest

from gpu_operator import nvml
from gpu_operator.nvml import errors, real


class _FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"code {value}")
        self.value = value


def _fake_lib(code: int) -> types.ModuleType:
    lib = types.ModuleType("pynvml")
    lib.NVMLError = _FakeNvmlError  # type: ignore[attr-defined]

    def fail(*_: object) -> None:
        raise _FakeNvmlError(code)

    lib.nvmlDeviceCreateGpuInstance = fail  # type: ignore[attr-defined]
    return lib


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (errors.ERROR_INSUFFICIENT_RESOURCES, nvml.InsufficientResources),
        (errors.ERROR_LIBRARY_NOT_FOUND, nvml.LibraryNotFound),
        (errors.ERROR_GPU_IS_LOST, nvml.GpuLost),
        (errors.ERROR_NOT_SUPPORTED, nvml.NotSupported),
        (errors.ERROR_NO_PERMISSION, nvml.NoPermission),
    ],
)
def test_pynvml_errors_become_ours(code: int, cls: type[nvml.NvmlError]) -> None:
    call = real._Calls(_fake_lib(code))
    with pytest.raises(cls) as info:
        call("nvmlDeviceCreateGpuInstance", None, 0)
    assert info.value.code == code
    assert "nvmlDeviceCreateGpuInstance" in str(info.value)


def test_unknown_codes_keep_their_number() -> None:
    call = real._Calls(_fake_lib(4242))
    with pytest.raises(nvml.NvmlError) as info:
        call("nvmlDeviceCreateGpuInstance")
    assert info.value.code == 4242


def test_library_not_found_message_is_actionable() -> None:
    err = errors.from_code(errors.ERROR_LIBRARY_NOT_FOUND)
    assert str(err) == "NVML library not found: is the NVIDIA driver installed on this node?"


def _real_or_skip() -> real.RealNvml:
    lib = real.RealNvml()
    try:
        lib.init()
    except nvml.NvmlError as err:
        pytest.skip(f"no usable NVIDIA GPU: {err}")
    return lib


def test_init_without_a_driver_raises_our_error_type() -> None:
    lib = real.RealNvml()
    try:
        lib.init()
    except nvml.NvmlError:
        pass
    else:
        lib.shutdown()
        pytest.skip("a GPU is present; covered by the gpu-marked tests")
    with pytest.raises((nvml.LibraryNotFound, nvml.DriverNotLoaded), match="driver"):
        lib.init()


@pytest.mark.gpu
def test_real_gpu_read_only_facts() -> None:
    lib = _real_or_skip()
    try:
        assert lib.device_count() >= 1
        assert lib.driver_version().count(".") in (1, 2)
        dev = lib.device_by_index(0)
        assert dev.uuid().startswith("GPU-")
        assert dev.memory_info().total > 0
        assert dev.cuda_compute_capability()[0] >= 3
        assert dev.name()
        try:
            mode = dev.mig_mode()
            assert isinstance(mode.current, bool)
        except nvml.NotSupported:
            pass
    finally:
        lib.shutdown()


@pytest.mark.gpu
def test_real_gpu_feeds_feature_discovery() -> None:
    from gpu_operator.agents import plugin_config as pc
    from gpu_operator.agents.gfd import facts, labels

    lib = _real_or_skip()
    try:
        node = facts.collect(lib, machine_type="test")
    finally:
        lib.shutdown()
    got = labels.compute_labels(node, pc.PluginConfig(), labels.LabelOptions(0))
    assert int(got["nvidia.com/gpu.count"]) >= 1
