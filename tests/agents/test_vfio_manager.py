"""The VFIO manager on the simulated host of every mock machine: binding and unbinding, the
variant driver choice, the audio function and NVSwitches, and its refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from vm_hosts import PRESETS, gpus, host, nvidia

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import models, sysfs
from gpu_operator.agents.vfio_manager import aliases, command, holders, manage, plan
from simhost import pci as simulated


@pytest.mark.parametrize("preset", PRESETS)
def test_bind_all_puts_every_gpu_and_its_audio_function_on_vfio_pci(
    tmp_path: Path, preset: str
) -> None:
    kernel = host(tmp_path, preset)
    kernel.load_nvidia()  # a container node's driver was there: the manager takes them over
    changed = manage.bind_all(kernel)
    functions = {f.address: f for f in nvidia(kernel)}
    # Each goes to the vfio driver modules.alias names for it: nvgrace_gpu_vfio_pci for the Grace
    # GPUs of the NVL72 trays, vfio-pci for the others.
    found = aliases.load(tmp_path)
    wanted = {a: aliases.driver_for(f.modalias, found) for a, f in functions.items()}
    bound = {a for a, f in functions.items() if sysfs.is_vfio_driver(f.driver)}
    expected = {f.address for f in functions.values() if f.gpu or f.audio}
    assert bound == expected
    assert len(changed) == len(expected)
    for f in functions.values():
        if f.nvswitch:
            assert f.driver == "nvidia"  # NVSwitches only on request
            continue
        assert f.driver == f.driver_override == wanted[f.address]
        assert (tmp_path / "dev" / "vfio" / str(f.iommu_group)).exists()
    assert (tmp_path / "dev" / "vfio" / "vfio").exists()
    for module in {aliases.module_of(wanted[a]) for a in expected}:
        assert kernel.loaded(module)  # only the drivers it needs (no vfio_pci on a Grace tray)
    assert kernel.loaded("vfio_iommu_type1")
    # The audio function shares its GPU's IOMMU group (a VM can only get both).
    for audio in (f for f in functions.values() if f.audio):
        gpu = functions[audio.slot + ".0"]
        assert audio.iommu_group == gpu.iommu_group
        assert models.AUDIO_FUNCTIONS[models.by_device_id(gpu.device).key] == audio.device  # type: ignore[union-attr]
    # Idempotent: a second run changes nothing.
    assert manage.bind_all(kernel) == []


@pytest.mark.parametrize("preset", PRESETS)
def test_unbind_all_returns_the_gpus_to_the_loaded_driver_and_removes_the_vfio_nodes(
    tmp_path: Path, preset: str
) -> None:
    kernel = host(tmp_path, preset)
    manage.bind_all(kernel, nvswitches=True)
    groups = {f.iommu_group for f in nvidia(kernel)}
    kernel.load_nvidia()  # the NVIDIA driver is back: released GPUs go to it
    manage.unbind_all(kernel)
    for f in nvidia(kernel):
        assert f.driver_override is None
        assert f.driver == ("snd_hda_intel" if f.audio else "nvidia")
    assert not any((tmp_path / "dev" / "vfio" / str(g)).exists() for g in groups)


def test_unbind_without_a_driver_leaves_the_gpus_unbound(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    manage.bind_all(kernel)
    manage.unbind_all(kernel)
    assert {f.driver for f in gpus(kernel)} == {None}


def test_nvswitches_are_bound_on_request(tmp_path: Path) -> None:
    kernel = host(tmp_path, "dgx-h100")
    manage.bind_all(kernel, nvswitches=True)
    switches = [f for f in nvidia(kernel) if f.nvswitch]
    assert len(switches) == 4
    assert {f.driver for f in switches} == {"vfio-pci"}


def test_one_device_binds_alone_with_its_audio_function(tmp_path: Path) -> None:
    kernel = host(tmp_path, "l40sx4")
    first = gpus(kernel)[0]
    manage.bind_all(kernel, device=first.address)
    on_vfio = {f.address for f in nvidia(kernel) if f.driver == "vfio-pci"}
    assert on_vfio == {first.address, first.slot + ".1"}
    manage.unbind_all(kernel, device=first.address)
    assert not any(f.driver == "vfio-pci" for f in nvidia(kernel))


def test_a_variant_driver_named_by_modules_alias_wins_over_vfio_pci(tmp_path: Path) -> None:
    kernel = host(tmp_path, "dgx-h200")
    alias_file = tmp_path / "lib/modules" / sysfs.kernel_release(tmp_path) / "modules.alias"
    # As on a Grace host, where the variant claims the GPU's device id.
    alias_file.write_text(
        alias_file.read_text()
        + "alias vfio_pci:v000010DEd00002335sv*sd*bc03sc*i* nvgrace_gpu_vfio_pci\n"
    )
    # The simulated variant module, like the real one, binds what driver_override hands it.
    manage.bind_all(kernel)
    assert {f.driver for f in gpus(kernel)} == {"nvgrace_gpu_vfio_pci"}
    assert kernel.loaded("nvgrace_gpu_vfio_pci")
    manage.unbind_all(kernel)
    assert {f.driver for f in gpus(kernel)} == {None}


@pytest.mark.parametrize("preset", ["gb200-nvl72", "gb300-nvl72"])
def test_grace_blackwell_gpus_go_to_the_grace_variant_driver(tmp_path: Path, preset: str) -> None:
    # The kernel's nvgrace-gpu-vfio-pci serves GB200 (0x2941) and, since Linux 6.18, GB300
    # (0x31C2): plain vfio-pci cannot hand a VM the GPU's memory that is coherent with Grace.
    kernel = host(tmp_path, preset)
    manage.bind_all(kernel)
    assert {f.driver for f in gpus(kernel)} == {"nvgrace_gpu_vfio_pci"}
    assert kernel.loaded("nvgrace_gpu_vfio_pci")


def test_the_most_specific_alias_wins() -> None:
    found = aliases.parse(
        "alias vfio_pci:v000010DEd*sv*sd*bc*sc*i* generic_vfio_pci\n"
        "alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n"
        "alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n"
    )
    assert [a.module for a in found] == ["generic_vfio_pci", "nvgrace_gpu_vfio_pci"]
    gh200 = "pci:v000010DEd00002342sv000010DEsd00001809bc03sc02i00"
    assert aliases.driver_for(gh200, found) == "nvgrace_gpu_vfio_pci"
    other = "pci:v000010DEd000020B0sv000010DEsd00001000bc03sc02i00"
    assert aliases.driver_for(other, found) == "generic_vfio_pci"
    assert aliases.driver_for(other, []) == "vfio-pci"


def test_without_an_iommu_nothing_is_bound_and_the_error_says_how_to_fix_it(
    tmp_path: Path,
) -> None:
    kernel = host(tmp_path, "t4x4", iommu=False)
    with pytest.raises(plan.PlanError) as err:
        manage.bind_all(kernel)
    assert "no IOMMU group" in str(err.value)
    assert "intel_iommu=on" in str(err.value)
    assert {f.driver for f in gpus(kernel)} == {None}
    assert all(f.driver_override is None for f in gpus(kernel))


def test_gpus_carrying_vgpus_are_not_passed_through(tmp_path: Path) -> None:
    kernel = host(tmp_path, "dgx-a100")
    kernel.load_nvidia(vgpu=True, enable_vfs=True)
    with pytest.raises(plan.PlanError, match="vGPU host driver has VFs or vGPUs"):
        manage.bind_all(kernel)


def test_an_unknown_device_is_refused_by_name(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    with pytest.raises(plan.PlanError, match=r"device 0000:99:00\.0: no such PCI device"):
        manage.bind_all(kernel, device="0000:99:00.0")
    with pytest.raises(plan.PlanError, match=r"0000:02:00\.0: not an NVIDIA GPU"):
        manage.bind_all(kernel, device="0000:02:00.0")


def test_a_kernel_refusal_names_the_device_and_leaves_no_override(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    first = gpus(kernel)[0]
    targets = plan.plan_bind(sysfs.scan(tmp_path), [], device=first.address)
    # Someone else binds the GPU between planning and binding: the kernel says EBUSY.
    kernel.modprobe("vfio_pci")
    kernel.load_nvidia()
    busy = [plan.Target(t.address, t.role, None, t.driver, t.iommu_group) for t in targets]
    with pytest.raises(manage.VfioError) as err:
        manage.bind(_NoUnbind(kernel), busy)
    assert first.address in str(err.value)
    assert "Device or resource busy" in str(err.value)
    assert sysfs.read_function(tmp_path, first.address).driver_override is None  # type: ignore[union-attr]


class _NoUnbind:
    """A kernel that ignores unbind writes (to provoke EBUSY on bind)."""

    def __init__(self, inner: simulated.SimulatedKernel) -> None:
        self.inner = inner
        self.root = inner.root

    def write(self, path: Path, value: str) -> None:
        if path.name != "unbind":
            self.inner.write(path, value)

    def modprobe(self, module: str) -> None:
        self.inner.modprobe(module)


def test_an_unknown_module_fails_with_modprobes_message(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    with pytest.raises(kernel_mod.KernelError, match="Module foo_vfio_pci not found"):
        kernel.modprobe("foo_vfio_pci")


class _Holders(holders.Holders):
    """Pod resources answered from a list the test changes."""

    def __init__(self, held: list[holders.Allocation]) -> None:
        super().__init__(None)
        self.held = held

    async def allocations(self) -> list[holders.Allocation]:
        return list(self.held)


async def test_binding_waits_while_a_pod_holds_a_container_gpu(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    cuda = holders.Allocation("default", "cuda", "c", "nvidia.com/gpu", "GPU-1")
    gate = _Holders([cuda])
    told: list[str] = []

    async def notify(message: str) -> None:
        told.append(message)
        gate.held.clear()  # the user deletes the pod once told

    options = command.Options(poll_interval=0.01)
    assert await command.bind(kernel, options, gate, notify=notify) == command.EXIT_OK
    assert told == ["waiting for 1 pod(s) holding container-stack GPUs: default/cuda"]
    assert {f.driver for f in gpus(kernel)} == {"vfio-pci"}


async def test_unbinding_keeps_devices_a_vm_still_holds_after_the_timeout(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    manage.bind_all(kernel)
    first, *rest = gpus(kernel)
    vm = holders.Allocation("default", "vm", "compute", "nvidia.com/TU104GL_TESLA_T4",
                            first.address)  # fmt: skip
    options = command.Options(poll_interval=0.01)
    code = await command.unbind(kernel, options, _Holders([vm]), timeout=0.05)
    assert code == command.EXIT_FAILED
    drivers = {f.address: f.driver for f in gpus(kernel)}
    assert drivers[first.address] == "vfio-pci"
    assert {drivers[f.address] for f in rest} == {None}


async def test_run_binds_reports_and_unbinds_on_stop(tmp_path: Path) -> None:
    kernel = host(tmp_path, "a30x4")
    stop = asyncio.Event()
    bound: list[set[str | None]] = []

    def on_bound() -> None:
        bound.append({f.driver for f in gpus(kernel)})
        stop.set()

    code = await command.run(kernel, command.Options(), _Holders([]), stop, on_bound)
    assert code == command.EXIT_OK
    assert bound == [{"vfio-pci"}]
    assert {f.driver for f in gpus(kernel)} == {None}
