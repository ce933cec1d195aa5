"""Fleets of simulated nodes: named fleets, the fleet YAML file, and scaling to about N nodes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pydantic

from gpu_operator.api import keys, manifests
from gpu_operator.nvml import driver_branches, machines

RUNTIME_VERSIONS = {
    "containerd": "containerd://2.0.5",
    "cri-o": "cri-o://1.32.1",
    "docker": "docker://27.3.1",
}
OS_IMAGES = {
    ("ubuntu", "22.04"): "Ubuntu 22.04.5 LTS",
    ("ubuntu", "24.04"): "Ubuntu 24.04.1 LTS",
    ("rhel", "9.4"): "Red Hat Enterprise Linux 9.4 (Plow)",
    ("rocky", "9.4"): "Rocky Linux 9.4 (Blue Onyx)",
}


# The driver an AKS GPU node image brings when the node pool is created without
# `--gpu-driver none` (a current 570-branch data-center driver).
DEFAULT_HOST_DRIVER = "570.195.03"
# A 580-branch driver, the least a GPUCluster (the DRA stack) accepts.
DRA_HOST_DRIVER = "580.95.05"


class FleetError(ValueError):
    """A fleet that cannot be built; the message names the file and field."""


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Taint(_Strict):
    """A taint the pool registers its nodes with (kubelet `--register-with-taints`), e.g. the
    readiness gate's startup taint (docs/coexistence.md, "Readiness gate")."""

    key: str = pydantic.Field(min_length=1, max_length=253)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, **({"value": self.value} if self.value else {}),
                "effect": self.effect}  # fmt: skip

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


class Rack(_Strict):
    """An NVL72 rack: the pool's nodes are its compute trays, whose GPUs the fabric manager
    registers with the rack's cluster UUID and the clique id of their NVLink partition."""

    cluster_uuid: str = pydantic.Field(alias="clusterUuid")
    clique_id: int = pydantic.Field(default=machines.DEFAULT_PARTITION, alias="cliqueId", ge=0)


# Machines whose host CPUs are Grace (arm64): their nodes register as arm64 nodes.
ARM64_MACHINES = frozenset({"gb200-nvl72", "gb300-nvl72"})


class Pool(_Strict):
    """Identical nodes: a machine preset (or none for CPU-only nodes) and their OS facts."""

    name: str = pydantic.Field(
        min_length=1, max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )
    machine: str | None = None
    count: int = pydantic.Field(default=1, ge=0, le=5000)
    os: str = "ubuntu"
    os_version: str = pydantic.Field(default="22.04", alias="osVersion")
    kernel: str = "6.8.0-52-generic"
    runtime: Literal["containerd", "cri-o", "docker"] = "containerd"
    # The runtime's version (containerd 2.x reads config version 3, 1.7 version 2); None: the
    # default of RUNTIME_VERSIONS.
    runtime_version: str | None = pydantic.Field(
        default=None, alias="runtimeVersion", pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?$"
    )
    workload: Literal["container", "vm-passthrough", "vm-vgpu"] | None = None
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    # Who brings the NVIDIA driver: the operator's driver container, or the node image itself
    # (`preinstalled`: modules loaded at boot, nvidia-smi and libraries on the host).
    driver: Literal["operator", "preinstalled"] = "operator"
    driver_version: str | None = pydantic.Field(default=None, alias="driverVersion")
    # UEFI Secure Boot: the kernel then loads signed modules only.
    secure_boot: bool = pydantic.Field(default=False, alias="secureBoot")
    # Taints the nodes register with, as an autoscaled node pool sets them.
    taints: list[Taint] = pydantic.Field(default_factory=list)
    # The NVL72 rack the pool's trays form (a machine with an NVLink fabric, at most 18 nodes).
    rack: Rack | None = None

    @pydantic.model_validator(mode="after")
    def _rack(self) -> Pool:
        if self.rack is None:
            return self
        spec = machines.preset(self.machine) if self.machine in machines.PRESETS else None
        if spec is None or spec.fabric is None:
            raise ValueError(
                f"rack: machine {self.machine} has no multi-node NVLink fabric; use an NVL72 "
                "tray (gb200-nvl72, gb300-nvl72)"
            )
        if self.count > machines.NVL72_TRAYS:
            raise ValueError(
                f"rack: {self.count} nodes, but an NVL72 rack holds {machines.NVL72_TRAYS} "
                "compute trays; split the pool into racks"
            )
        machines.in_rack(spec, self.rack.cluster_uuid, self.rack.clique_id)
        return self

    def machine_spec(self) -> machines.MachineSpec | None:
        """The pool's machine, as a tray of its rack when it has one, emulating the driver the
        node image brings when the pool has one (its NVML reports that version, as a real
        node's does, even before the host's driver state is probed)."""
        if self.machine is None:
            return None
        spec = machines.preset(self.machine)
        if self.rack is not None:
            spec = machines.in_rack(spec, self.rack.cluster_uuid, self.rack.clique_id)
        host = self.host_driver
        if host is not None and host != spec.driver_version:
            cuda = driver_branches.cuda_driver_version(host)
            spec = spec.model_copy(update={"driver_version": host, "cuda_driver_version": cuda})
        return spec

    @pydantic.field_validator("driver_version")
    @classmethod
    def _driver_version(cls, value: str | None) -> str | None:
        if value is not None:
            driver_branches.cuda_driver_version(value)  # DriverVersionError is a ValueError
        return value

    @pydantic.model_validator(mode="after")
    def _host_driver(self) -> Pool:
        if self.driver == "preinstalled":
            if self.machine is None:
                raise ValueError("driver: preinstalled needs a GPU machine (this pool has none)")
            if self.workload in ("vm-passthrough", "vm-vgpu"):
                raise ValueError(
                    f"driver: preinstalled cannot serve workload {self.workload}: a host driver "
                    "holds the GPUs that VM workloads need free"
                )
        elif self.driver_version is not None:
            raise ValueError(
                "driverVersion: only for driver: preinstalled (the operator's driver version "
                "comes from its driver image)"
            )
        return self

    @property
    def container_runtime_version(self) -> str:
        """The runtime's version without the scheme: `2.0.5`."""
        if self.runtime_version is not None:
            return self.runtime_version.lstrip("v")
        return RUNTIME_VERSIONS[self.runtime].split("://", 1)[1]

    @property
    def host_driver(self) -> str | None:
        """The version of the driver the node image brings, None when the operator brings it."""
        if self.driver != "preinstalled":
            return None
        return self.driver_version or DEFAULT_HOST_DRIVER

    @pydantic.field_validator("machine")
    @classmethod
    def _known_machine(cls, value: str | None) -> str | None:
        if value is not None and value not in machines.PRESETS:
            known = ", ".join(sorted(machines.PRESETS))
            raise ValueError(f"unknown machine preset {value!r}; known: {known}")
        return value

    @property
    def gpus_per_node(self) -> int:
        return 0 if self.machine is None else machines.preset(self.machine).gpu_count


class Fleet(_Strict):
    """A named list of pools."""

    name: str = "custom"
    pools: list[Pool] = pydantic.Field(min_length=1)

    @pydantic.model_validator(mode="after")
    def _unique_pools(self) -> Fleet:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dupes)}")
        return self

    @property
    def node_count(self) -> int:
        return sum(p.count for p in self.pools)


# The taint of the `autoscaled` fleet, named with the cluster autoscaler's startup-taint prefix.
STARTUP_TAINT = {
    "key": "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready",
    "value": "true",
    "effect": "NoSchedule",
}


def _fleet(name: str, *pools: dict[str, object]) -> Fleet:
    return Fleet.model_validate({"name": name, "pools": list(pools)})


NAMED: dict[str, Fleet] = {
    f.name: f
    for f in (
        _fleet(
            "default",
            {"name": "dgx-a100", "machine": "dgx-a100", "count": 2},
            {"name": "dgx-h100", "machine": "dgx-h100", "count": 2},
            {"name": "t4", "machine": "t4x4", "count": 2},
            {"name": "l4", "machine": "l4x8", "count": 1},
            {"name": "cpu", "count": 2},
        ),
        _fleet(
            "small",
            {"name": "dgx-a100", "machine": "dgx-a100", "count": 1},
            {"name": "t4", "machine": "t4x4", "count": 1},
            {"name": "cpu", "count": 1},
        ),
        _fleet(
            "hopper",
            {"name": "dgx-h100", "machine": "dgx-h100", "count": 2},
            {"name": "dgx-h200", "machine": "dgx-h200", "count": 2},
            {
                "name": "hgx-b200",
                "machine": "hgx-b200",
                "count": 1,
                "osVersion": "24.04",
                "kernel": "6.8.0-60-generic",
            },
            {"name": "cpu", "count": 1},
        ),
        # AKS node pools created without `--gpu-driver none` (Azure/aks-rdma-infiniband's GPU
        # driver and GPU Operator configuration pages): the node image brings the driver, which
        # the operator's driver must not fight.
        _fleet(
            "aks-preinstalled",
            {"name": "t4", "machine": "t4x4", "count": 2, "driver": "preinstalled"},
            {"name": "cpu", "count": 1},
        ),
        # The DRA stack (run with --policy examples/gpucluster-dra.yaml): a GPUCluster needs a
        # 580+ driver, which these node images bring; one pool has MIG devices made at boot.
        _fleet(
            "dra",
            {
                "name": "t4",
                "machine": "t4x4",
                "count": 1,
                "driver": "preinstalled",
                "driverVersion": DRA_HOST_DRIVER,
            },
            {
                "name": "a100-mig",
                "machine": "dgx-a100-mig-half",
                "count": 1,
                "driver": "preinstalled",
                "driverVersion": DRA_HOST_DRIVER,
            },
            {"name": "cpu", "count": 1},
        ),
        # Autoscaled GPU nodes behind the readiness gate: they register with the cluster
        # autoscaler's startup taint, which the operator removes once a node validated. The demo
        # turns the gate on for it (gpudemo/fit.py; docs/coexistence.md, "Readiness gate").
        _fleet(
            "autoscaled",
            {"name": "a100", "machine": "dgx-a100", "count": 2, "taints": [STARTUP_TAINT]},
            {"name": "cpu", "count": 1},
        ),
        _fleet(
            "inference",
            {"name": "l4", "machine": "l4x8", "count": 2},
            {"name": "l40s", "machine": "l40sx4", "count": 2},
            {"name": "a30", "machine": "a30x4", "count": 1},
            {"name": "t4", "machine": "t4x4", "count": 2},
            {"name": "cpu", "count": 1},
        ),
        _fleet(
            "mig",
            {"name": "mig-single", "machine": "dgx-a100-mig-single", "count": 1},
            {"name": "mig-mixed", "machine": "dgx-a100-mig-mixed", "count": 1},
            {"name": "dgx-a100-80gb", "machine": "dgx-a100-80gb", "count": 1},
            {"name": "cpu", "count": 1},
        ),
        # Two GB200 NVL72 racks (18 compute trays of 4 GPUs each, one NVLink domain per rack:
        # two cluster UUIDs), for ComputeDomains (docs/compute-domains.md). The trays' OS image
        # brings a 580 driver, as GB200 trays ship: the DRA driver (a GPUCluster) needs one.
        _fleet(
            "nvl72",
            {
                "name": "rack-a",
                "machine": "gb200-nvl72",
                "count": machines.NVL72_TRAYS,
                "driver": "preinstalled",
                "driverVersion": DRA_HOST_DRIVER,
                "rack": {"clusterUuid": "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0a001"},
            },
            {
                "name": "rack-b",
                "machine": "gb200-nvl72",
                "count": machines.NVL72_TRAYS,
                "driver": "preinstalled",
                "driverVersion": DRA_HOST_DRIVER,
                "rack": {"clusterUuid": "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0b002"},
            },
            {"name": "cpu", "count": 1},
        ),
        # VM workloads (docs/vm-workloads.md): run with --policy examples/kubevirt-vgpu.yaml.
        _fleet(
            "kubevirt",
            {
                "name": "passthrough",
                "machine": "dgx-a100",
                "count": 1,
                "workload": "vm-passthrough",
            },
            {"name": "vgpu-t4", "machine": "t4x4", "count": 1, "workload": "vm-vgpu"},
            {"name": "vgpu-a30", "machine": "a30x4", "count": 1, "workload": "vm-vgpu"},
            {"name": "containers", "machine": "t4x4", "count": 1, "workload": "container"},
            {"name": "cpu", "count": 1},
        ),
    )
}


def parse(data: object, source: str = "fleet") -> Fleet:
    """Validate a parsed fleet document; FleetError names the field."""
    if not isinstance(data, dict):
        raise FleetError(f"{source}: expected a mapping with `pools:`, got {type(data).__name__}")
    data = {"name": Path(source).stem, **data}
    try:
        return Fleet.model_validate(data)
    except pydantic.ValidationError as err:
        raise FleetError(f"{source}: {manifests.field_errors(err)}") from None


def load(path: str | Path) -> Fleet:
    """Read a fleet YAML file."""
    try:
        data = manifests.load_one(path)
    except manifests.ManifestError as err:
        raise FleetError(str(err)) from None
    return parse(data, str(path))


def resolve(name_or_file: str | None) -> Fleet:
    """A named fleet, or a fleet file when the argument is a path (or ends in .yaml/.yml)."""
    if name_or_file is None:
        return NAMED["default"]
    if name_or_file in NAMED:
        return NAMED[name_or_file]
    if Path(name_or_file).exists() or name_or_file.endswith((".yaml", ".yml", ".json")):
        return load(name_or_file)
    raise FleetError(
        f"unknown fleet {name_or_file!r}: not a file, and not one of {', '.join(NAMED)}"
    )


def scale(fleet: Fleet, nodes: int) -> Fleet:
    """The fleet with pool counts scaled proportionally so that it has about `nodes` nodes."""
    if nodes < 1:
        raise FleetError("--nodes: expected at least 1")
    total = fleet.node_count or 1
    exact = [p.count * nodes / total for p in fleet.pools]
    counts = [math.floor(x) for x in exact]
    # Largest remainders first, so the sum hits the target and small pools are not starved.
    for index in sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True):
        if sum(counts) >= nodes:
            break
        counts[index] += 1
    pools = [p.model_copy(update={"count": c}) for p, c in zip(fleet.pools, counts, strict=True)]
    return fleet.model_copy(update={"pools": pools})


@dataclass(frozen=True)
class NodePlan:
    """One node to create: name, its pool, labels, nodeInfo and (for GPU nodes) the machine."""

    name: str
    pool: Pool
    labels: dict[str, str]
    node_info: dict[str, str]
    machine: str | None
    seed: int
    taints: tuple[dict[str, str], ...] = ()


def node_labels(pool: Pool) -> dict[str, str]:
    """The labels a node is created with: its workload config and the pool's extras. The hardware
    labels (`feature.node.kubernetes.io/...`) come from NFD, which reads the node's host files
    (`simhost.hardware`)."""
    labels: dict[str, str] = {}
    if pool.workload is not None:
        labels[keys.GPU_WORKLOAD_CONFIG] = pool.workload
    if pool.machine is not None:
        # A preset partitioned before the operator came is labelled with the config naming its
        # layout; otherwise the operator's all-disabled default would undo it.
        from gpudemo import mig  # deferred: it pulls in the MIG manager and kubesim

        layout = mig.preset_mig_config(pool.machine)
        if layout is not None:
            labels[keys.MIG_CONFIG] = layout
    labels.update(pool.labels)
    return labels


def plan_nodes(fleet: Fleet) -> list[NodePlan]:
    """Every node of the fleet, named `<pool>-<n>`."""
    plans = []
    seed = 1
    for pool in fleet.pools:
        labels = node_labels(pool)
        info = {
            "containerRuntimeVersion": f"{pool.runtime}://{pool.container_runtime_version}",
            "kernelVersion": pool.kernel,
            "osImage": OS_IMAGES.get((pool.os, pool.os_version), f"{pool.os} {pool.os_version}"),
        }
        if pool.machine in ARM64_MACHINES:
            # Grace hosts: the kubelet registers the node as arm64 (nodeInfo and its labels).
            info["architecture"] = "arm64"
            labels = {"kubernetes.io/arch": "arm64", "beta.kubernetes.io/arch": "arm64", **labels}
        for index in range(pool.count):
            plans.append(
                NodePlan(f"{pool.name}-{index + 1}", pool, dict(labels), dict(info),
                         pool.machine, seed, tuple(t.to_dict() for t in pool.taints))
            )  # fmt: skip
            seed += 1
    return plans


def describe(fleet: Fleet) -> Sequence[str]:
    """One line per pool, for the banner."""
    lines = []
    for pool in fleet.pools:
        what = pool.machine or "CPU only"
        extra = f", preinstalled driver {pool.host_driver}" if pool.host_driver else ""
        extra += ", Secure Boot" if pool.secure_boot else ""
        extra += "".join(f", tainted {t}" for t in pool.taints)
        if pool.rack is not None:
            extra += f", NVL72 rack {pool.rack.cluster_uuid} clique {pool.rack.clique_id}"
        lines.append(
            f"{pool.count} x {what} ({pool.name}; {pool.os} {pool.os_version}, {pool.runtime}"
            f"{extra})"
        )
    return lines
