"""The exporter on a real GPU (read-only): every default counter NVML can give is read and
rendered with upstream's labels, and the time of one collection is printed. Skipped where NVML
has no GPU."""

from __future__ import annotations

import re
import time
from pathlib import Path

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
    # Values, not only shapes: temperature, power and clocks are plausible.
    for (metric, gpu), value in _values(text).items():
        if metric == "DCGM_FI_DEV_GPU_TEMP":
            assert 5 <= value <= 110, (gpu, value)
        elif metric in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"):
            assert value > 0, (metric, gpu, value)
    print(f"one collection of the default counters: {elapsed * 1000:.1f} ms")


def test_framebuffer_and_power_values_on_real_gpus(tmp_path: Path) -> None:
    """R4 and R15 on hardware: the framebuffer fields add up to the total (the reserved part is
    neither used nor free), and both power readings are positive."""
    _real_or_skip()
    csv = tmp_path / "counters.csv"
    csv.write_text(
        "\n".join(
            f"{name}, gauge, {name}"
            for name in (
                "DCGM_FI_DEV_FB_TOTAL",
                "DCGM_FI_DEV_FB_FREE",
                "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_DEV_FB_RESERVED",
                "DCGM_FI_DEV_POWER_USAGE",
                "DCGM_FI_DEV_POWER_USAGE_INSTANT",
            )
        )
        + "\n"
    )
    settings = collector.Settings(
        counters_path=csv, options=exposition.Options(hostname="gpu-test")
    )
    exporter = collector.Collector(real.RealNvml, settings)
    exporter.start()
    try:
        values = _values(exporter.render_once().decode())
    finally:
        exporter.stop()
    totals = {e: v for (m, e), v in values.items() if m == "DCGM_FI_DEV_FB_TOTAL"}
    assert totals
    for entity, total in totals.items():
        parts = sum(
            values.get((m, entity), 0.0)
            for m in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")
        )
        assert parts == pytest.approx(total, abs=4), entity
    for (metric, entity), value in values.items():
        if metric.startswith("DCGM_FI_DEV_POWER_USAGE"):
            assert value > 0, (metric, entity)


SAMPLE = re.compile(r"^(DCGM_FI_\w+)\{([^}]*)\} ([-\d.e+]+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def _values(text: str) -> dict[tuple[str, str], float]:
    """(metric, `gpu` or `gpu/instance`) -> value, for the samples of whole GPUs and instances."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if not found:
            continue
        metric, labels, value = found.groups()
        named = dict(LABEL.findall(labels))
        entity = named.get("gpu", "?")
        if "GPU_I_ID" in named:
            entity += "/" + named["GPU_I_ID"]
        out[(metric, entity)] = float(value)
    return out
