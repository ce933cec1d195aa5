"""The exporter on a real GPU (read-only): every default counter NVML can give is read and
rendered with upstream's labels, and the time of one collection is printed. Skipped where NVML
has no GPU."""

from __future__ import annotations

import re
import time

import pytest

from gpu_operator import nvml
from gpu_operator.agents.dcgm_exporter import collector, exposition
from gpu_operator.nvml import real

pytestmark = pytest.mark.gpu

LABELS = re.compile(
    r'^DCGM_FI_DEV_GPU_TEMP\{gpu="(\d+)",UUID="(GPU-[0-9a-f-]+)",pci_bus_id="([0-9A-Fa-f:.]+)",'
    r'device="nvidia\1",modelName="([^"]+)"(,GPU_I_PROFILE="[^"]+",GPU_I_ID="\d+")?,'
    r'Hostname="gpu-test",DCGM_FI_DRIVER_VERSION="[\d.]+"\} \d+$'
)


def _real_or_skip() -> None:
    lib = real.RealNvml()
    try:
        lib.init()
    except nvml.NvmlError as err:
        pytest.skip(f"no usable NVIDIA GPU: {err}")
    lib.shutdown()


def test_default_counters_on_real_gpus() -> None:
    _real_or_skip()
    settings = collector.Settings(options=exposition.Options(hostname="gpu-test"))
    exporter = collector.Collector(real.RealNvml, settings)
    exporter.start()
    try:
        started = time.perf_counter()
        text = exporter.render_once().decode()
        elapsed = time.perf_counter() - started
    finally:
        exporter.stop()
    temps = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert temps, text
    for line in temps:
        assert LABELS.match(line), line
    for metric in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"):
        assert f"# TYPE {metric} " in text
    print(f"one collection of the default counters: {elapsed * 1000:.1f} ms")
