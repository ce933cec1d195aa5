"""Descriptions of simulated machines: named presets and a small YAML format.

A `MachineSpec` says what a node looks like (GPU models, driver, DMI product name, NVLink, initial
MIG layout); `gpu_operator.nvml.mock.MockMachine` turns it into live simulated GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from gpu_operator.nvml import catalog, protocol


class UnknownMachine(LookupError):
    """No preset with that name."""


class MachineFileError(ValueError):
    """A machine YAML file is unreadable or invalid; the message names the field."""


# A cluster UUID as NVML's fabric info spells it (16 bytes, 8-4-4-4-12 hex).
_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class GpuGroup(_Strict):
    """`count` GPUs of one catalog model, optionally with MIG enabled and a MIG layout."""

    model: str
    count: int = pydantic.Field(default=1, ge=1, le=64)
    mig_enabled: bool = pydantic.Field(default=False, alias="migEnabled")
    mig_devices: tuple[str, ...] = pydantic.Field(default=(), alias="migDevices")
    pci_class: int | None = pydantic.Field(default=None, alias="pciClass")

    @pydantic.field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        try:
            catalog.model(value)
        except KeyError as err:
            raise ValueError(str(err.args[0])) from None
        return value

    @pydantic.model_validator(mode="after")
    def _mig_layout(self) -> GpuGroup:
        gpu = catalog.model(self.model)
        if self.mig_enabled and not gpu.mig_capable:
            raise ValueError(f"migEnabled: {self.model} is not MIG capable")
        if self.mig_devices and not self.mig_enabled:
            raise ValueError("migDevices: needs migEnabled: true")
        for name in self.mig_devices:
            try:
                gpu.mig_profile(name)
            except KeyError as err:
                raise ValueError(f"migDevices: {err.args[0]}") from None
        return self


class Fabric(_Strict):
    """NVLink fabric membership. `state` is the fabric probe's (nvmlGpuFabricState_t: 3 is
    completed) and `status` its outcome (an NVML return code: 0 success, 10 timeout);
    `healthMask` the health bits NVML's versioned call reports (protocol.FabricHealth; the
    default 0x1aa is a healthy fabric, 0 a driver that reports no health)."""

    cluster_uuid: str = pydantic.Field(alias="clusterUuid", pattern=_UUID)
    clique_id: int = pydantic.Field(alias="cliqueId", ge=0)
    state: int = pydantic.Field(default=3, ge=0, le=3)
    status: int = pydantic.Field(default=0, ge=0)
    health_mask: int = pydantic.Field(
        default=protocol.HEALTHY_FABRIC_MASK, alias="healthMask", ge=0, le=0xFFFFFFFF
    )


class Host(_Strict):
    """The host around the GPUs: its processors (one NUMA node per socket, Linux's CPU numbering:
    every socket's first hardware threads, then their siblings) and its RDMA NICs (`mlx5_<n>`),
    which sit on the PCIe switches of the GPUs they serve, spread evenly in index order."""

    sockets: int = pydantic.Field(default=2, ge=1, le=8)
    cores_per_socket: int = pydantic.Field(default=32, alias="coresPerSocket", ge=1, le=512)
    threads_per_core: int = pydantic.Field(default=2, alias="threadsPerCore", ge=1, le=2)
    nics: int = pydantic.Field(default=0, ge=0, le=16)

    def node_cpus(self, node: int) -> tuple[int, ...]:
        """The logical CPUs of NUMA node `node` (its socket's cores and their siblings)."""
        total = self.sockets * self.cores_per_socket
        first = node * self.cores_per_socket
        return tuple(
            thread * total + first + core
            for thread in range(self.threads_per_core)
            for core in range(self.cores_per_socket)
        )


class Vgpu(_Strict):
    host_driver_version: str = pydantic.Field(alias="hostDriverVersion")
    host_driver_branch: str = pydantic.Field(alias="hostDriverBranch")


# The driver a machine emulates when its description names none: 550.54.15 (CUDA 12.4), or a
# 580-branch driver for GPUs that need a newer branch than 550 (GpuModel.min_driver_branch).
DEFAULT_DRIVER = ("550.54.15", 12040)
NEWER_DRIVER = ("580.82.07", 13000)


class MachineSpec(_Strict):
    """A whole node: GPUs in index order plus driver and platform facts."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _default_driver(cls, data: object) -> object:
        if not isinstance(data, dict) or "driverVersion" in data or "driver_version" in data:
            return data
        needed = 0
        for group in data.get("gpus") or ():
            key = group.get("model") if isinstance(group, dict) else None
            if isinstance(key, str):
                try:
                    needed = max(needed, catalog.model(key).min_driver_branch)
                except KeyError:
                    continue  # the group's own validator names the unknown model
        if needed <= int(DEFAULT_DRIVER[0].split(".")[0]):
            return data
        version, cuda = NEWER_DRIVER
        filled = {**data, "driverVersion": version}
        if "cudaDriverVersion" not in data and "cuda_driver_version" not in data:
            filled["cudaDriverVersion"] = cuda
        return filled

    name: str
    product_name: str = pydantic.Field(default="", alias="productName")
    driver_version: str = pydantic.Field(default="550.54.15", alias="driverVersion")
    cuda_driver_version: int = pydantic.Field(default=12040, alias="cudaDriverVersion", ge=1000)
    nvlink: Literal["auto", "none", "nvswitch"] = "auto"
    seed: int = 0
    gpus: tuple[GpuGroup, ...] = pydantic.Field(min_length=1)
    fabric: Fabric | None = None
    vgpu: Vgpu | None = None
    host: Host = pydantic.Field(default_factory=Host)

    @pydantic.model_validator(mode="after")
    def _nics_fit(self) -> MachineSpec:
        if self.host.nics > 2 * self.gpu_count:
            raise ValueError(
                f"host.nics: {self.host.nics} NICs for {self.gpu_count} GPU(s); at most two "
                "per GPU share its PCIe switch"
            )
        return self

    @property
    def nvml_version(self) -> str:
        major = self.cuda_driver_version // 1000
        return f"{major}.{self.driver_version}"

    @property
    def driver_branch(self) -> int:
        """The driver branch the machine emulates (550 for 550.54.15)."""
        return int(self.driver_version.split(".", 1)[0])

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)

    def gpu_models(self) -> list[catalog.GpuModel]:
        """One catalog entry per GPU, in index order."""
        return [catalog.model(g.model) for g in self.gpus for _ in range(g.count)]

    def has_nvswitch(self) -> bool:
        """NVSwitch boards: 8 identical NVLink GPUs unless `nvlink` says otherwise."""
        if self.nvlink != "auto":
            return self.nvlink == "nvswitch"
        models = self.gpu_models()
        return len(models) == 8 and len({m.key for m in models}) == 1 and models[0].nvlink_count > 0


def _board(
    name: str,
    product: str,
    model: str,
    count: int,
    host: dict[str, int] | None = None,
    **extra: object,
) -> MachineSpec:
    data: dict[str, object] = {
        "name": name,
        "productName": product,
        "gpus": [{"model": model, "count": count, **extra}],
    }
    if host is not None:
        data["host"] = host
    return MachineSpec.model_validate(data)


# DGX A100: two 64-core AMD EPYC 7742; DGX H100/H200 and HGX B200 boards: two 56-core Xeons. Each
# has one compute ConnectX NIC per GPU (the storage NICs are not modelled).
_EPYC_7742 = {"coresPerSocket": 64, "nics": 8}
_XEON_56 = {"coresPerSocket": 56, "nics": 8}


def _presets() -> dict[str, MachineSpec]:
    a100 = "A100-SXM4-40GB"
    presets = [
        _board("dgx-a100", "NVIDIA DGX A100", a100, 8, _EPYC_7742),
        _board("dgx-a100-80gb", "NVIDIA DGX A100 80GB", "A100-SXM4-80GB", 8, _EPYC_7742),
        _board("dgx-h100", "NVIDIA DGX H100", "H100-SXM5-80GB", 8, _XEON_56),
        _board("dgx-h200", "NVIDIA DGX H200", "H200-141GB", 8, _XEON_56),
        _board("hgx-b200", "NVIDIA HGX B200", "B200", 8, _XEON_56),
        _board("t4x4", "ProLiant DL380 Gen10", "T4", 4),
        _board("l4x8", "PowerEdge R760xa", "L4", 8),
        _board("a30x4", "PowerEdge R750xa", "A30-24GB", 4),
        _board("l40sx4", "PowerEdge R760xa", "L40S", 4),
        _board("hgx-b300", "NVIDIA HGX B300", "B300", 8, {"nics": 8}),
        _board("rtx-pro-6000x8", "NVIDIA RTX PRO Server", "RTX-PRO-6000", 8),
        _board(
            "dgx-a100-mig-single",
            "NVIDIA DGX A100",
            a100,
            8,
            _EPYC_7742,
            migEnabled=True,
            migDevices=["1g.5gb"] * 7,
        ),
        _board(
            "dgx-a100-mig-mixed",
            "NVIDIA DGX A100",
            a100,
            8,
            _EPYC_7742,
            migEnabled=True,
            migDevices=["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"],
        ),
        # Half the GPUs split into MIG devices, half whole: a node that serves both kinds (the
        # DRA demo claims a whole GPU and a MIG device by profile on one node).
        MachineSpec.model_validate(
            {
                "name": "dgx-a100-mig-half",
                "productName": "NVIDIA DGX A100",
                "host": _EPYC_7742,
                "gpus": [
                    {
                        "model": a100,
                        "count": 4,
                        "migEnabled": True,
                        "migDevices": ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"],
                    },
                    {"model": a100, "count": 4},
                ],
            }
        ),
    ]
    b200 = presets[4].model_copy(
        update={"driver_version": "560.28.03", "cuda_driver_version": 12060}
    )
    presets[4] = b200
    # Blackwell Ultra and RTX PRO 6000 Blackwell need a 580-branch driver (CUDA 13.0).
    for index, preset in enumerate(presets):
        if preset.name in ("hgx-b300", "rtx-pro-6000x8"):
            presets[index] = preset.model_copy(
                update={"driver_version": "580.82.07", "cuda_driver_version": 13000}
            )
    presets += [_nvl72_tray("gb200-nvl72", "GB200-186GB"), _nvl72_tray("gb300-nvl72", "GB300")]
    return {p.name: p for p in presets}


# An NVL72 rack is 18 compute trays of 4 GPUs (two Grace-Blackwell superchips: two 72-core
# Grace CPUs, one thread per core, one ConnectX NIC per GPU) behind the rack's NVLink switches.
# The fabric manager gives every GPU of a rack the rack's cluster UUID, and the clique id of
# its NVLink partition: 32766 is the default partition that spans the whole rack.
NVL72_TRAYS = 18
NVL72_GPUS_PER_TRAY = 4
DEFAULT_PARTITION = 32766
_NVL72_RACK_UUID = "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0b001"


def _nvl72_tray(name: str, model: str) -> MachineSpec:
    return MachineSpec.model_validate(
        {
            "name": name,
            "productName": f"NVIDIA {model.split('-')[0]} NVL72",
            "driverVersion": "580.82.07",
            "cudaDriverVersion": 13000,
            "nvlink": "nvswitch",
            "gpus": [{"model": model, "count": NVL72_GPUS_PER_TRAY}],
            "fabric": {"clusterUuid": _NVL72_RACK_UUID, "cliqueId": DEFAULT_PARTITION},
            "host": {"sockets": 2, "coresPerSocket": 72, "threadsPerCore": 1, "nics": 4},
        }
    )


def in_rack(
    spec: MachineSpec, cluster_uuid: str, clique_id: int = DEFAULT_PARTITION
) -> MachineSpec:
    """`spec` as a tray of the rack `cluster_uuid`, in NVLink partition `clique_id` (the fabric
    state, status and health stay the preset's). ValueError for a machine without a fabric."""
    if spec.fabric is None:
        raise ValueError(f"machine {spec.name} has no NVLink fabric; it cannot join a rack")
    fabric = Fabric.model_validate(
        {**spec.fabric.model_dump(by_alias=True), "clusterUuid": cluster_uuid,
         "cliqueId": clique_id}
    )  # fmt: skip
    return spec.model_copy(update={"fabric": fabric})


PRESETS: dict[str, MachineSpec] = _presets()


def preset(name: str) -> MachineSpec:
    """The preset called `name`; UnknownMachine lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise UnknownMachine(f"unknown machine {name!r}; known presets: {known}") from None


def from_dict(data: object, source: str = "machine") -> MachineSpec:
    """Validate a machine description (the parsed YAML); errors name the offending field."""
    if not isinstance(data, dict):
        raise MachineFileError(f"{source}: expected a mapping at the top level")
    try:
        return MachineSpec.model_validate(data)
    except pydantic.ValidationError as err:
        from gpu_operator.api import manifests

        raise MachineFileError(f"{source}: {manifests.field_errors(err)}") from None


def load(path: str | Path) -> MachineSpec:
    """Read a machine YAML file (format in docs/gpu-layer.md)."""
    # Imported here: `gpu_operator.api` loads every CRD model, which agents on a preset
    # machine (the demo's mock-backed exporters) would otherwise carry for nothing.
    from gpu_operator.api import manifests

    try:
        data = manifests.load_one(path)
    except manifests.ManifestError as err:
        raise MachineFileError(str(err)) from None
    return from_dict(data, str(path))
