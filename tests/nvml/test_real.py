"""The real backend on nvidia-ml-py: error mapping everywhere, read-only calls on a real GPU."""

from __future__ import annotations

import contextlib
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
def test_real_gpu_memory_reports_reserved_apart() -> None:
    """R4 on hardware: memory v2's parts add up, and nothing counts the reserved part twice."""
    lib = _real_or_skip()
    try:
        for i in range(lib.device_count()):
            info = lib.device_by_index(i).memory_info()
            assert info.total > 0
            assert info.free + info.used + info.reserved == pytest.approx(info.total, abs=4 << 20)
    finally:
        lib.shutdown()


@pytest.mark.gpu
def test_real_gpu_profile_ids_and_names_match_nvml() -> None:
    """R1 on hardware: each GPU-instance profile NVML lists has its own internal id, and our
    naming rule gives the name NVML gives it (`MIG 1g.18gb`, `MIG 1g.18gb+me`). Needs MIG mode
    on where the driver is older than R550; skipped on GPUs without MIG."""
    from gpu_operator.nvml import catalog

    lib = _real_or_skip()
    try:
        checked = 0
        for i in range(lib.device_count()):
            dev = lib.device_by_index(i)
            try:
                dev.mig_mode()
            except nvml.NotSupported:
                continue
            total_mib = dev.memory_info().total >> 20
            ids = []
            for enum in range(catalog.GI_PROFILE_COUNT):
                try:
                    info = dev.gpu_instance_profile_info(enum)
                except (nvml.NotSupported, nvml.InvalidArgument):
                    continue
                ids.append(info.id)
                ours = catalog.mig_profile_name(
                    info.slice_count,
                    info.slice_count,
                    info.memory_size_mb,
                    total_mib,
                    suffix=catalog.profile_suffix(enum),
                )
                assert info.name.removeprefix("MIG ") == ours, (enum, info)
                checked += 1
            assert len(ids) == len(set(ids)), ids
        if not checked:
            pytest.skip("no GPU lists MIG profiles (no MIG, or MIG off on a pre-R550 driver)")
    finally:
        lib.shutdown()


@pytest.mark.gpu
def test_real_gpu_mig_device_names_match_nvml() -> None:
    """R1 on hardware: our name for every existing MIG device equals the profile in the name
    NVML gives the device. Skipped where no GPU has MIG devices (configure them beforehand)."""
    from gpu_operator.nvml import migname

    lib = _real_or_skip()
    try:
        seen = 0
        for i in range(lib.device_count()):
            dev = lib.device_by_index(i)
            try:
                if not dev.mig_mode().current:
                    continue
            except nvml.NotSupported:
                continue
            total_mib = dev.memory_info().total >> 20
            enums = migname.profile_enums(dev)
            for j in range(dev.max_mig_device_count()):
                try:
                    mig = dev.mig_device_by_index(j)
                except nvml.NotFound:
                    continue
                ours = migname.device_profile(dev, mig, total_mib, enums)
                assert mig.name().rsplit(" MIG ", 1)[-1] == ours
                seen += 1
        if not seen:
            pytest.skip("no MIG devices on this machine")
    finally:
        lib.shutdown()


@pytest.mark.gpu
def test_real_gpu_optional_readings_answer_or_say_not_supported() -> None:
    """R5, R9, R11, R15 on hardware: the readings that depend on the driver branch or the GPU
    either answer sensibly or raise NotSupported, never another error."""
    from gpu_operator.nvml import protocol as p

    lib = _real_or_skip()
    try:
        dev = lib.device_by_index(0)
        with contextlib.suppress(nvml.NotSupported):  # drivers before R565
            assert isinstance(dev.gpu_recovery_action(), p.RecoveryAction)
        with contextlib.suppress(nvml.NotSupported):
            assert dev.power_usage_instant() > 0
        with contextlib.suppress(nvml.NotSupported):
            assert dev.fabric_info().state in range(4)
        events = lib.event_set()
        try:
            mask = p.EventType.XID_CRITICAL & dev.supported_event_types()
            if mask:
                events.register(dev, mask)
                with pytest.raises(nvml.Timeout):
                    events.wait(100)
        finally:
            events.free()
    finally:
        lib.shutdown()


@pytest.mark.gpu
def test_real_gpu_performance_monitoring_gives_activity() -> None:
    """R7 on hardware: two GPM samples give a graphics activity within 0..100 (Hopper and
    later; skipped elsewhere)."""
    import time

    from gpu_operator.nvml import protocol as p

    lib = _real_or_skip()
    try:
        dev = lib.device_by_index(0)
        try:
            first = dev.gpm_sample()
        except nvml.NotSupported:
            pytest.skip("no GPU performance monitoring on this GPU")
        time.sleep(0.2)
        second = dev.gpm_sample()
        try:
            values = lib.gpm_metrics(first, second, [p.GpmMetric.GRAPHICS_UTIL])
        finally:
            first.free()
            second.free()
        assert 0.0 <= values[p.GpmMetric.GRAPHICS_UTIL] <= 100.0
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
    assert int(got["nvidia.com/gpu.memory"]) > 0
    assert got["nvidia.com/gpu.product"]
