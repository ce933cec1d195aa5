"""The NVML side of the MIG manager: read every GPU's MIG state, and carry out a plan.

A plan runs in two phases, as mig-parted's: the mode phase (destroy the changing GPUs' instances,
set their MIG mode, reset the GPUs whose mode must take effect) and the device phase (re-read
the GPUs, re-plan against what they now report, create the instances at their placements).
All calls block, so async callers run these in a thread.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from gpu_operator import nvml
from gpu_operator.agents.mig_manager import generate, layout, planner
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.nvml import catalog
from gpu_operator.nvml.catalog import Placement

log = logging.getLogger("gpu_operator.agents.mig_manager")


class ApplyError(RuntimeError):
    """A step of a plan failed on the GPUs; the message names the GPU and the step."""


class ModeChangeFailed(ApplyError):
    """A MIG mode change did not take effect (the GPU reset failed): a reboot may help."""


def model_for(pci_device_id: int, memory_mib: int | None = None) -> catalog.GpuModel | None:
    """The catalogued model with this PCI id, or one with the same MIG geometry (its PCIe, NVL
    and OEM variants); `memory_mib` tells apart boards that drivers size differently."""
    return catalog.for_pci_device_id(pci_device_id, memory_mib)


class Gpus:
    """Reads and changes the node's GPUs through NVML; resets go through the host."""

    def __init__(self, open_nvml: Callable[[], nvml.Nvml], host: host_mod.Host) -> None:
        self._open = open_nvml
        self.host = host

    def _lib(self) -> nvml.Nvml:
        lib = self._open()
        lib.init()
        return lib

    def read(self) -> list[planner.GpuState]:
        """Every GPU's model, MIG mode and instances; GPUs outside the catalog count as non-MIG."""
        lib = self._lib()
        try:
            return [_read_gpu(lib, i) for i in range(lib.device_count())]
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()

    def profiles(self) -> list[generate.GpuProfiles]:
        """The GPU-instance profiles each MIG-capable GPU's driver reports (for the generated
        config). GPUs the manager cannot partition (no MIG, or not in the catalog) are left out;
        a MIG GPU whose profiles cannot be read reports none."""
        lib = self._lib()
        try:
            found = []
            for index in range(lib.device_count()):
                device = lib.device_by_index(index)
                pci = device.pci_info()
                total_mib = device.memory_info().total >> 20
                model = model_for(pci.device_id, total_mib)
                if model is None or not model.mig_capable:
                    continue
                found.append(
                    generate.GpuProfiles(index, pci.device_id, _profiles(device, total_mib))
                )
            return found
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()

    def apply(
        self, plan: planner.NodePlan, replan: Callable[[list[planner.GpuState]], planner.NodePlan]
    ) -> None:
        """Run `plan` on the GPUs it changes; `replan` gives the device phase from fresh state."""
        changed = {g.index for g in plan.changed}
        if not changed:
            return
        self._mode_phase(plan)
        fresh = replan(self.read())
        lib = self._lib()
        try:
            for gpu in fresh.changed:
                if gpu.index not in changed:
                    continue
                if gpu.set_mode is not None or gpu.needs_reset:
                    raise ModeChangeFailed(
                        f"GPU {gpu.index}: MIG mode is still not "
                        f"{'enabled' if gpu.target_enabled else 'disabled'} after the reset"
                    )
                device = lib.device_by_index(gpu.index)
                _destroy(device, gpu.index, gpu.destroy)
                _create(device, gpu.index, gpu.target)
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()

    def _mode_phase(self, plan: planner.NodePlan) -> None:
        lib = self._lib()
        resets: list[host_mod.GpuRef] = []
        try:
            for gpu in plan.changed:
                device = lib.device_by_index(gpu.index)
                _destroy(device, gpu.index, gpu.destroy)
                if gpu.set_mode is not None:
                    try:
                        device.set_mig_mode(gpu.set_mode)
                    except nvml.NvmlError as err:
                        raise ModeChangeFailed(
                            f"GPU {gpu.index}: setting MIG mode "
                            f"{'on' if gpu.set_mode else 'off'} failed: {err}"
                        ) from None
                # Drivers that activate the mode themselves (an idle GPU) need no reset from us.
                if gpu.needs_reset and device.mig_mode().current != gpu.target_enabled:
                    resets.append(host_mod.GpuRef(gpu.index, device.pci_info().bus_id))
        except nvml.NvmlError as err:
            raise ApplyError(f"reading the GPUs failed: {err}") from None
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()
        if resets:
            log.info(
                "resetting GPU(s) %s to change MIG mode", ", ".join(str(r.index) for r in resets)
            )
            try:
                self.host.reset_gpus(resets)
            except host_mod.HostError as err:
                raise ModeChangeFailed(str(err)) from None


def _read_gpu(lib: nvml.Nvml, index: int) -> planner.GpuState:
    device = lib.device_by_index(index)
    pci = device.pci_info()
    model = model_for(pci.device_id, device.memory_info().total >> 20)
    if model is None:
        log.warning(
            "GPU %d (%s, PCI id 0x%08X) is not in the GPU catalog: treated as not MIG capable",
            index,
            device.name(),
            pci.device_id,
        )
        model = _opaque_model(device, pci.device_id)
        return planner.GpuState(index, model, pci_device_id=pci.device_id)
    if not model.mig_capable:
        return planner.GpuState(
            index, model, pci_device_id=pci.device_id, pci_subsystem_id=pci.subsystem_id
        )
    mode = device.mig_mode()
    instances = _instances(device, model) if mode.current else ()
    return planner.GpuState(
        index=index,
        model=model,
        mig_enabled=mode.current,
        mig_pending=mode.pending,
        instances=instances,
        pci_device_id=pci.device_id,
        pci_subsystem_id=pci.subsystem_id,
    )


def _profiles(device: nvml.Device, total_mib: int) -> tuple[generate.Profile, ...]:
    """Every GPU-instance profile id NVML answers for, named from its slices and memory."""
    found = []
    for profile_id in range(catalog.GI_PROFILE_COUNT):
        try:
            info = device.gpu_instance_profile_info(profile_id)
        except nvml.NvmlError:
            continue  # not offered by this GPU (or this driver)
        if info.instance_count <= 0 or info.slice_count <= 0:
            continue
        name = catalog.mig_profile_name(
            info.slice_count,
            info.slice_count,
            info.memory_size_mb,
            total_mib,
            suffix=catalog.profile_suffix(profile_id),
        )
        found.append(generate.Profile(profile_id, name, info.slice_count, info.instance_count))
    return tuple(found)


def _opaque_model(device: nvml.Device, pci_device_id: int) -> catalog.GpuModel:
    return catalog.GpuModel(
        key=device.name(),
        nvml_name=device.name(),
        memory_mib=device.memory_info().total >> 20,
        compute_capability=device.cuda_compute_capability(),
        architecture="",
        brand="",
        pci_device_id=pci_device_id,
        multiprocessor_count=0,
        tdp_watts=0,
        idle_watts=0,
        max_sm_clock_mhz=0,
        memory_clock_mhz=0,
    )


def _instances(device: nvml.Device, model: catalog.GpuModel) -> layout.Layout:
    found = []
    for profile in model.mig_profiles:
        for gi in device.gpu_instances(profile.profile_id):
            info = gi.info()
            compute = []
            for ci_profile in profile.compute_profiles:
                for ci in gi.compute_instances(ci_profile.profile_id):
                    ci_info = ci.info()
                    compute.append(
                        layout.ComputeInstance(
                            ci_profile.slice_count, ci_info.placement, ci_info.id
                        )
                    )
            compute.sort(key=lambda c: c.placement.start)
            found.append(layout.GpuInstance(profile, info.placement, tuple(compute), info.id))
    found.sort(key=lambda g: g.placement.start)
    return tuple(found)


def _destroy(device: nvml.Device, index: int, instances: layout.Layout) -> None:
    for gi in instances:
        if gi.id is None:
            continue
        try:
            handle = device.gpu_instance_by_id(gi.id)
            for ci_profile in gi.profile.compute_profiles:
                for ci in handle.compute_instances(ci_profile.profile_id):
                    ci.destroy()
            handle.destroy()
        except nvml.NotFound:
            continue  # already gone
        except nvml.NvmlError as err:
            raise ApplyError(
                f"GPU {index}: destroying the {gi.profile.name} instance at "
                f"{_where(gi.placement)} failed: {err}"
            ) from None


def _create(device: nvml.Device, index: int, instances: Sequence[layout.GpuInstance]) -> None:
    for gi in instances:
        try:
            handle = device.create_gpu_instance(gi.profile.profile_id, gi.placement)
        except nvml.NvmlError as err:
            raise ApplyError(
                f"GPU {index}: creating {gi.profile.name} at {_where(gi.placement)} failed: {err}"
            ) from None
        for ci in gi.compute:
            ci_id = catalog.CI_PROFILE_BY_SLICES[ci.slices]
            try:
                handle.create_compute_instance(ci_id, ci.placement)
            except nvml.NvmlError as err:
                raise ApplyError(
                    f"GPU {index}: creating a {ci.slices}-slice compute instance in "
                    f"{gi.profile.name} failed: {err}"
                ) from None


def _where(placement: Placement) -> str:
    return f"slices {placement.start}-{placement.end - 1}"
