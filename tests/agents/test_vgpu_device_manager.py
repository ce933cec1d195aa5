"""The vGPU device manager: its config file, the planner on every mock model, applying plans
on the simulated host, and the node protocol (labels, pause, state, Events)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from vm_hosts import PRESETS, host
from waiting import eventually, within

from gpu_operator.agents.pci import models, sysfs
from gpu_operator.agents.vgpu_device_manager import apply, config, planner, runner, state
from gpu_operator.nvml import machines

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kubevirt-vgpu.yaml"
VGPU_PRESETS = [
    p for p in PRESETS if models.vm_facts(machines.preset(p).gpu_models()[0]).vgpu_types
]


def _entries(text: str, name: str = "x") -> tuple[config.Entry, ...]:
    return config.loads(text).select(name)


def _one(devices: str, vgpus: Mapping[str, int], extra: str = "") -> tuple[config.Entry, ...]:
    body = ", ".join(f"{k}: {v}" for k, v in vgpus.items())
    return _entries(
        f"version: v1\nvgpu-configs:\n  x:\n  - devices: {devices}\n{extra}"
        f"    vgpu-devices: {{{body}}}\n"
    )


def _vgpu_host(tmp_path: Path, preset: str) -> Any:
    kernel = host(tmp_path, preset)
    kernel.load_nvidia(vgpu=True, enable_vfs=True)
    return kernel


# ----- the config file ---------------------------------------------------------------------


def test_the_example_configs_parse() -> None:
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    (cm,) = [d for d in documents if d["kind"] == "ConfigMap"]
    parsed = config.loads(cm["data"]["config.yaml"])
    assert {"default", "A100-4C", "T4-1Q"} <= set(parsed.configs)
    (a100,) = [e for e in parsed.select("default") if e.vgpu_devices == {"A100-4C": 10}]
    assert a100.covers(0, 0x20B010DE)
    assert not a100.covers(0, 0x1EB810DE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vgpu-configs: {}", "missing 'version'"),
        ("version: v2\nvgpu-configs: {x: []}", "unknown version: 'v2'"),
        ("version: v1\nvgpu-configs: {}", "at least one entry is required"),
        ("version: v1\nvgpu-configs: {x: []}", "vgpu-configs.x: at least one entry"),
        ("version: v1\nextra: 1\nvgpu-configs: {}", "unexpected field: extra"),
        ("version: v1\nvgpu-configs: {x: [{devices: some, vgpu-devices: {}}]}",
         "x[0].devices: invalid string input: 'some'"),
        ("version: v1\nvgpu-configs: {x: [{devices: all}]}",
         "missing required field: vgpu-devices"),
        ("version: v1\nvgpu-configs: {x: [{devices: all, vgpu-devices: {a100-4c: 1}}]}",
         "vgpu-devices.a100-4c: malformed vGPU type"),
        ("version: v1\nvgpu-configs: {x: [{devices: all, vgpu-devices: {A100-4C: -1}}]}",
         "A100-4C: expected a count >= 0, got -1"),
        ("version: v1\nvgpu-configs: {x: [{devices: all, device-filter: [true],"
         " vgpu-devices: {}}]}", "device-filter: expected a PCI id"),
    ],
)  # fmt: skip
def test_a_bad_config_names_its_field(text: str, message: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.loads(text, "cfg")
    assert message in str(err.value)


def test_an_unknown_config_name_lists_the_known_ones() -> None:
    parsed = config.loads("version: v1\nvgpu-configs: {a: [{devices: all, vgpu-devices: {}}]}")
    with pytest.raises(config.ConfigError, match=r"not present: 'b' \(configs: a\)"):
        parsed.select("b")


def test_mig_backed_and_time_sliced_type_names_are_both_accepted() -> None:
    entries = _one("all", {"A100-1-5CME": 1, "A100D-80C": 1, "M60-0Q": 1})
    assert entries[0].vgpu_devices == {"A100-1-5CME": 1, "A100D-80C": 1, "M60-0Q": 1}
    assert config.mig_backed("A100-1-5CME")
    assert not config.mig_backed("A100-4C")


# ----- planning and applying on every model with vGPU types -------------------------------


@pytest.mark.parametrize("preset", VGPU_PRESETS)
def test_every_type_fills_its_gpu_and_one_more_is_refused(tmp_path: Path, preset: str) -> None:
    kernel = _vgpu_host(tmp_path, preset)
    gpus = state.read(tmp_path)
    gpu = gpus[0]
    facts = models.vm_facts(machines.preset(preset).gpu_models()[0])
    assert gpu.framework == facts.framework
    assert [t.short_name for t in gpu.types] == [v.short_name for v in facts.vgpu_types]
    for vgpu in facts.vgpu_types:
        fits = planner.capacity(gpu, vgpu.short_name)
        assert fits is not None
        assert fits >= vgpu.max_instances
        with pytest.raises(planner.PlanError, match=f"at most {fits} fit"):
            planner.plan(gpus, _one("[0]", {vgpu.short_name: fits + 1}))
    # The largest count a type allows really fits: apply it and read it back.
    vgpu = facts.vgpu_types[0]
    wanted = _one("[0]", {vgpu.short_name: vgpu.max_instances})
    plan = planner.plan(gpus, wanted)
    assert [c.gpu.index for c in plan.changes] == [0]
    apply.apply(kernel, plan)
    after = state.read(tmp_path)
    assert after[0].current() == {vgpu.short_name: vgpu.max_instances}
    assert all(g.current() == {} for g in after[1:])  # GPUs the entry does not cover
    assert planner.plan(after, wanted).applied


@pytest.mark.parametrize("preset", VGPU_PRESETS)
def test_changing_the_type_deletes_the_old_vgpus_first(tmp_path: Path, preset: str) -> None:
    kernel = _vgpu_host(tmp_path, preset)
    facts = models.vm_facts(machines.preset(preset).gpu_models()[0])
    small, large = facts.vgpu_types[0], facts.vgpu_types[-1]
    apply.apply(kernel, planner.plan(state.read(tmp_path), _one("[0]", {small.short_name: 2})))
    apply.apply(kernel, planner.plan(state.read(tmp_path), _one("[0]", {large.short_name: 1})))
    assert state.read(tmp_path)[0].current() == {large.short_name: 1}
    apply.apply(kernel, planner.plan(state.read(tmp_path), _one("[0]", {large.short_name: 0})))
    assert state.read(tmp_path)[0].vgpus == ()


def test_problems_are_all_reported_before_anything_changes(tmp_path: Path) -> None:
    _vgpu_host(tmp_path, "t4x4")
    gpus = state.read(tmp_path)
    with pytest.raises(planner.PlanError) as err:
        planner.plan(gpus, _one("all", {"A100-4C": 1, "T4-1Q": 1}))
    text = str(err.value)
    assert "vGPU type A100-4C is not supported on GPU 0 (0000:10:00.0, TU104GL [Tesla T4])" in text
    assert "supported: T4-1Q, T4-2Q" in text
    assert "GPU 3" in text
    with pytest.raises(planner.PlanError, match="must all be of one type"):
        planner.plan(gpus, _one("[1]", {"T4-1Q": 1, "T4-2Q": 1}))
    with pytest.raises(planner.PlanError, match="MIG-backed vGPU types are not simulated"):
        planner.plan(gpus, _one("[1]", {"T4-1-4C": 1}))
    twice = _entries(
        "version: v1\nvgpu-configs:\n  x:\n  - {devices: all, vgpu-devices: {T4-1Q: 1}}\n"
        "  - {devices: [2], vgpu-devices: {T4-2Q: 1}}\n"
    )
    with pytest.raises(planner.PlanError, match=r"GPU 2 .* is covered by entries 0 and 1"):
        planner.plan(gpus, twice)
    assert sysfs.mdevs(tmp_path) == []


def test_without_the_vgpu_host_driver_the_gpus_offer_nothing(tmp_path: Path) -> None:
    host(tmp_path, "dgx-a100").load_nvidia()  # the container driver, not the vGPU one
    with pytest.raises(planner.PlanError, match="offers no vGPU types: the vGPU host driver"):
        planner.plan(state.read(tmp_path), _one("all", {"A100-4C": 1}))
    # A config without vGPUs needs no vGPU support.
    assert planner.plan(state.read(tmp_path), _one("all", {})).applied


def test_a_device_filter_selects_gpus_by_pci_id(tmp_path: Path) -> None:
    _vgpu_host(tmp_path, "t4x4")
    gpus = state.read(tmp_path)
    t4 = _one("all", {"T4-8Q": 2}, extra="    device-filter: 0x1EB810DE\n")
    assert [c.gpu.index for c in planner.plan(gpus, t4).changes] == [0, 1, 2, 3]
    other = _one("all", {"T4-8Q": 2}, extra="    device-filter: [0x20B010DE]\n")
    assert planner.plan(gpus, other).applied  # covers no GPU here


def test_running_out_on_a_vendor_vfio_gpu_leaves_it_without_vgpus(tmp_path: Path) -> None:
    kernel = _vgpu_host(tmp_path, "l4x8")
    # 32 VFs could take two vGPUs, but one L4-24Q fills the GPU: found out while creating.
    plan = planner.plan(state.read(tmp_path), _one("[0]", {"L4-24Q": 2}))
    with pytest.raises(apply.ApplyError) as err:
        apply.apply(kernel, plan)
    assert "failed to create 2 L4-24Q vGPU devices on GPU 0" in str(err.value)
    assert "only 1 fitted" in str(err.value)
    assert state.read(tmp_path)[0].vgpus == ()


# ----- the node protocol ------------------------------------------------------------------


class FakeNode:
    """A node's labels, pods and Events in memory; pods leave when their label is paused."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.history: list[dict[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.values: asyncio.Queue[str | None] = asyncio.Queue()
        self.evented = asyncio.Condition()

    async def label_values(self, label: str) -> AsyncIterator[str | None]:
        while True:
            yield await self.values.get()

    async def metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.labels), {}

    async def patch(self, patch: Mapping[str, Any]) -> None:
        for key, value in patch["metadata"]["labels"].items():
            if value is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = value
        self.history.append(dict(self.labels))

    async def pods(self) -> list[dict[str, Any]]:
        out = []
        for app, key in zip(runner.PAUSED_APPS, (runner.PLUGIN_LABEL, runner.VALIDATOR_LABEL),
                            strict=True):  # fmt: skip
            if self.labels.get(key) == "true":
                out.append({"metadata": {"name": app, "namespace": "ns", "labels": {"app": app}}})
        return out

    async def event(self, type_: str, reason: str, message: str) -> None:
        async with self.evented:
            self.events.append((type_, reason, message))
            self.evented.notify_all()

    async def until_events(self, count: int) -> None:
        await eventually(
            lambda: len(self.events) >= count, f"{count} event(s)", state=lambda: self.events
        )


CONFIG = """version: v1
vgpu-configs:
  default:
    - devices: all
      vgpu-devices: {T4-4Q: 4}
  T4-1Q:
    - devices: all
      vgpu-devices: {T4-1Q: 16}
  bad:
    - devices: all
      vgpu-devices: {T4-32Q: 1}
"""


def _manager(tmp_path: Path, node: FakeNode) -> runner.Manager:
    kernel = _vgpu_host(tmp_path / "host", "t4x4")
    (tmp_path / "config.yaml").write_text(CONFIG)
    settings = runner.Settings(tmp_path / "config.yaml", "default", 1.0, 0.01)
    return runner.Manager(settings, node, kernel)


def _deployed() -> dict[str, str]:
    return {runner.PLUGIN_LABEL: "true", runner.VALIDATOR_LABEL: "true"}


async def test_a_change_pauses_the_sandbox_operands_and_reports_success(tmp_path: Path) -> None:
    node = FakeNode(_deployed())
    manager = _manager(tmp_path, node)
    assert await manager.report("T4-1Q")
    states = [h.get(runner.STATE_LABEL) for h in node.history]
    assert states[0] == runner.PENDING
    assert node.labels[runner.STATE_LABEL] == runner.SUCCESS
    assert any(h.get(runner.PLUGIN_LABEL) == runner.PAUSED for h in node.history)
    assert node.labels[runner.PLUGIN_LABEL] == "true"
    assert node.labels[runner.VALIDATOR_LABEL] == "true"
    assert node.events[-1][:2] == ("Normal", "VgpuConfigApplied")
    assert "16 x T4-1Q" in node.events[-1][2]
    assert len(sysfs.mdevs(tmp_path / "host")) == 64
    # Applied already: no pause, no pending, success again.
    node.history.clear()
    assert await manager.report("T4-1Q")
    assert [h.get(runner.STATE_LABEL) for h in node.history] == [runner.SUCCESS]


async def test_a_config_that_cannot_apply_fails_without_touching_anything(tmp_path: Path) -> None:
    node = FakeNode(_deployed())
    manager = _manager(tmp_path, node)
    assert await manager.report("default")
    assert not await manager.report("bad")
    assert node.labels[runner.STATE_LABEL] == runner.FAILED
    type_, reason, message = node.events[-1]
    assert (type_, reason) == ("Warning", "VgpuConfigFailed")
    assert message.startswith("bad: vGPU type T4-32Q is not supported on GPU 0")
    assert not await manager.report("missing")
    assert "selected vgpu-config not present: 'missing'" in node.events[-1][2]
    assert {m.short_name for m in sysfs.mdevs(tmp_path / "host")} == {"T4-4Q"}
    assert node.labels[runner.PLUGIN_LABEL] == "true"


async def test_a_pause_left_by_an_interrupted_change_is_restored(tmp_path: Path) -> None:
    node = FakeNode({runner.PLUGIN_LABEL: runner.PAUSED, runner.VALIDATOR_LABEL: "true"})
    manager = _manager(tmp_path, node)
    assert await manager.report("default")  # applies, then restores both
    assert node.labels[runner.PLUGIN_LABEL] == "true"
    node.labels[runner.VALIDATOR_LABEL] = runner.PAUSED
    assert await manager.report("default")  # already applied: just restores
    assert node.labels[runner.VALIDATOR_LABEL] == "true"


def test_a_label_held_by_another_operation_is_not_paused() -> None:
    assert runner.pause_labels(_deployed()) == {
        runner.PLUGIN_LABEL: runner.PAUSED,
        runner.VALIDATOR_LABEL: runner.PAUSED,
    }
    assert runner.pause_labels({runner.PLUGIN_LABEL: "false"}) == {}
    with pytest.raises(runner.UpdateError, match="another operation holds it"):
        runner.pause_labels({runner.PLUGIN_LABEL: "paused-for-driver-upgrade"})


async def test_run_applies_the_default_then_follows_the_label(tmp_path: Path) -> None:
    node = FakeNode(_deployed())
    manager = _manager(tmp_path, node)
    stop = asyncio.Event()
    first = asyncio.Event()
    task = asyncio.create_task(manager.run(stop, on_first=first.set))
    await node.values.put(None)
    await within(first.wait(), "the default config applied")
    assert {m.short_name for m in sysfs.mdevs(tmp_path / "host")} == {"T4-4Q"}
    await node.values.put("T4-1Q")
    await node.until_events(2)
    assert node.events[-1][1] == "VgpuConfigApplied"
    stop.set()
    await within(task, "the manager to stop")
    assert {m.short_name for m in sysfs.mdevs(tmp_path / "host")} == {"T4-1Q"}
