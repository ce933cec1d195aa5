"""The NVML side of the MIG manager: read every GPU's MIG state, and carry out a plan.

A plan runs in two phases, as mig-parted's: the mode phase (destroy the changing GPUs' instances,
set their MIG mode, reset the GPUs whose mode must take effect) and the device phase (re-read
the GPUs, re-plan against what they now report, create the instances at their placements).
All calls block, so async callers run these in a thread.

What a GPU can hold comes from NVML, as mig-parted asks it: the GPU-instance profiles the driver
offers (a profile this driver lacks is simply absent), their placements, and at creation the
compute-instance placements of the new GPU instance. The catalog only names the model and fills
in what a driver cannot say while MIG is off (before R550 the profile queries need MIG on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence

from gpu_operator import nvml
from gpu_operator.agents.mig_manager import generate, layout, planner
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.nvml import catalog
from gpu_operator.nvml.catalog import Placement

log = logging.getLogger("gpu_operator.agents.mig_manager")


class ApplyError(RuntimeError):
    """A step of a plan failed on the GPUs; the message names the GPU and the step, `code` the
    NVML return code behind it (None: not an NVML error)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


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
        """Every GPU's model (its MIG profiles and placements as NVML reports them), MIG mode and
        instances; a GPU NVML says has no MIG counts as non-MIG, catalogued or not."""
        lib = self._lib()
        try:
            return [_read_gpu(lib, i) for i in range(lib.device_count())]
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()

    def profiles(self) -> list[generate.GpuProfiles]:
        """The GPU-instance profiles each MIG-capable GPU's driver reports (for the generated
        config). GPUs without MIG (NVML says so) are left out; a MIG GPU whose profiles cannot
        be read reports none."""
        lib = self._lib()
        try:
            found = []
            for index in range(lib.device_count()):
                device = lib.device_by_index(index)
                if _mig_mode(device) is None:
                    continue
                pci = device.pci_info()
                total_mib = device.memory_info().total >> 20
                # What the driver itself reports: none at all sends the manager to the default
                # file, as upstream (the catalog does not stand in here).
                model = nvml_model(device, None, total_mib)
                profiles = tuple(
                    generate.Profile(p.profile_id, p.name, p.slice_count, p.instance_count)
                    for p in sorted(model.mig_profiles, key=lambda p: p.profile_id)
                )
                found.append(generate.GpuProfiles(index, pci.device_id, profiles))
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
                            f"{'on' if gpu.set_mode else 'off'} failed: {err}",
                            err.code,
                        ) from None
                # Drivers that activate the mode themselves (an idle GPU) need no reset from us.
                if gpu.needs_reset and device.mig_mode().current != gpu.target_enabled:
                    resets.append(host_mod.GpuRef(gpu.index, device.pci_info().bus_id))
        except nvml.NvmlError as err:
            raise ApplyError(f"reading the GPUs failed: {err}", err.code) from None
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
                raise ModeChangeFailed(str(err), err.code) from None


def _mig_mode(device: nvml.Device) -> nvml.MigMode | None:
    """The MIG mode, or None where NVML says the GPU has no MIG."""
    try:
        return device.mig_mode()
    except nvml.NotSupported:
        return None


def _read_gpu(lib: nvml.Nvml, index: int) -> planner.GpuState:
    device = lib.device_by_index(index)
    pci = device.pci_info()
    total_mib = device.memory_info().total >> 20
    known = model_for(pci.device_id, total_mib)
    mode = _mig_mode(device)
    if mode is None:
        if known is None:
            known = _opaque_model(device, pci.device_id)
        elif known.mig_capable:
            log.warning("GPU %d (%s): NVML reports no MIG support", index, known.key)
            known = dataclasses.replace(known, mig_profiles=())
        return planner.GpuState(
            index, known, pci_device_id=pci.device_id, pci_subsystem_id=pci.subsystem_id
        )
    model = nvml_model(device, known, total_mib)
    if not model.mig_capable:
        log.warning(
            "GPU %d (%s, PCI id 0x%08X) reports MIG but no profile it can be partitioned with "
            "while MIG is off (drivers before R550 list profiles only with MIG on)",
            index,
            model.key,
            pci.device_id,
        )
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


_ABSENT = (nvml.NotSupported, nvml.InvalidArgument)


def nvml_model(
    device: nvml.Device, known: catalog.GpuModel | None, total_mib: int
) -> catalog.GpuModel:
    """The GPU as NVML describes it: the GPU-instance profiles this driver offers, named from
    their slices and memory, with NVML's placements. `known` (the catalog's model, if any)
    gives the key and stands in for what NVML cannot say (no answer at all: its profiles)."""
    profiles = []
    for enum in range(catalog.GI_PROFILE_COUNT):
        try:
            info = device.gpu_instance_profile_info(enum)
        except _ABSENT:
            continue  # not offered by this GPU or this driver
        if info.instance_count <= 0 or info.slice_count <= 0:
            continue
        base = known.mig_profile_by_id(enum) if known is not None else None
        try:
            placements = tuple(device.gpu_instance_possible_placements(enum))
        except _ABSENT:
            placements = base.placements if base is not None else ()
        per_slice = max(1, info.multiprocessor_count // info.slice_count)
        profiles.append(
            catalog.MigProfile(
                profile_id=enum,
                name=catalog.mig_profile_name(
                    info.slice_count,
                    info.slice_count,
                    info.memory_size_mb,
                    total_mib,
                    suffix=catalog.profile_suffix(enum),
                ),
                slice_count=info.slice_count,
                memory_mb=info.memory_size_mb,
                multiprocessor_count=info.multiprocessor_count,
                instance_count=info.instance_count,
                placements=placements,
                copy_engines=info.copy_engine_count,
                decoders=info.decoder_count,
                encoders=info.encoder_count,
                jpegs=info.jpeg_count,
                ofas=info.ofa_count,
                compute_profiles=(
                    base.compute_profiles
                    if base is not None
                    else catalog.compute_profiles(
                        info.slice_count, per_slice, info.multiprocessor_count
                    )
                ),
                p2p_supported=info.is_p2p_supported,
                nvml_id=info.id,
            )
        )
    if not profiles:
        if known is not None:
            return known
        return _opaque_model(device, device.pci_info().device_id)
    compute = max(p.slice_count for p in profiles)
    memory = max((pl.end for p in profiles for pl in p.placements), default=0)
    found = tuple(profiles)
    if known is not None:
        return dataclasses.replace(
            known,
            mig_profiles=found,
            mig_compute_slices=compute,
            mig_memory_slices=memory or known.mig_memory_slices,
        )
    opaque = _opaque_model(device, device.pci_info().device_id)
    return dataclasses.replace(
        opaque, mig_profiles=found, mig_compute_slices=compute, mig_memory_slices=memory
    )


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


def _compute_instances(
    gi: nvml.GpuInstance,
) -> list[tuple[int, nvml.ComputeInstance]]:
    """(compute slices, handle) of every compute instance, over every CI profile NVML has."""
    found: list[tuple[int, nvml.ComputeInstance]] = []
    for enum in range(catalog.CI_PROFILE_COUNT):
        try:
            slices = gi.compute_instance_profile_info(enum).slice_count
            handles = gi.compute_instances(enum)
        except _ABSENT:
            continue  # a compute profile this GPU instance does not have
        found += [(slices, ci) for ci in handles]
    return found


def _instances(device: nvml.Device, model: catalog.GpuModel) -> layout.Layout:
    found = []
    for profile in model.mig_profiles:
        try:
            handles = device.gpu_instances(profile.profile_id)
        except _ABSENT:
            continue  # one profile NVML will not list must not hide the others
        for gi in handles:
            info = gi.info()
            compute = []
            for slices, ci in _compute_instances(gi):
                ci_info = ci.info()
                compute.append(layout.ComputeInstance(slices, ci_info.placement, ci_info.id))
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
            for _, ci in _compute_instances(handle):
                ci.destroy()
            handle.destroy()
        except nvml.NotFound:
            continue  # already gone
        except nvml.NvmlError as err:
            raise ApplyError(
                f"GPU {index}: destroying the {gi.profile.name} instance at "
                f"{_where(gi.placement)} failed: {err}",
                err.code,
            ) from None


def _create(device: nvml.Device, index: int, instances: Sequence[layout.GpuInstance]) -> None:
    for gi in instances:
        try:
            handle = device.create_gpu_instance(gi.profile.profile_id, gi.placement)
        except nvml.NvmlError as err:
            raise ApplyError(
                f"GPU {index}: creating {gi.profile.name} at {_where(gi.placement)} failed: {err}",
                err.code,
            ) from None
        taken: list[Placement] = []
        for ci in gi.compute:
            ci_id = catalog.CI_PROFILE_BY_SLICES[ci.slices]
            try:
                placement = _ci_placement(handle, ci_id, ci.placement, taken)
                handle.create_compute_instance(ci_id, placement)
                if placement is not None:
                    taken.append(placement)
            except nvml.NvmlError as err:
                raise ApplyError(
                    f"GPU {index}: creating a {ci.slices}-slice compute instance in "
                    f"{gi.profile.name} failed: {err}",
                    err.code,
                ) from None


def _ci_placement(
    gi: nvml.GpuInstance, ci_profile: int, planned: Placement, taken: Sequence[Placement]
) -> Placement | None:
    """Where to create a compute instance: the planned placement where NVML lists it for the new
    GPU instance, else NVML's first free one; None (NVML chooses) when it lists none."""
    try:
        valid = gi.compute_instance_possible_placements(ci_profile)
    except _ABSENT:
        return None
    free = [pl for pl in valid if not any(pl.overlaps(t) for t in taken)]
    if planned in free:
        return planned
    return free[0] if free else None


def _where(placement: Placement) -> str:
    return f"slices {placement.start}-{placement.end - 1}"
