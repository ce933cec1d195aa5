"""Claim preparation: an allocated ResourceClaim in, the devices, CDI spec and sharing out. Pure.

Facts carried from NVIDIA's driver: CDI vendor `k8s.gpu.nvidia.com`, class `claim`; one spec
per claim (file `k8s.gpu.nvidia.com-claim_<claim UID>.json`) whose devices are named
`<claim UID>-<device name>`, so the CDI ids handed to the kubelet are
`k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0`. Opaque configs for the driver come from the
allocation (class configs first, then the claim's; a later one for the same request wins; an
entry without `requests` applies to every request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.agents import cdi as common
from gpu_operator.agents.device_plugin import devices as dp_devices
from gpu_operator.agents.dra_kubelet_plugin import gpuconfig
from gpu_operator.agents.dra_kubelet_plugin.inventory import Inventory
from gpu_operator.agents.dra_kubelet_plugin.slices import DRIVER, PublishedDevice

CDI_VENDOR = "k8s." + DRIVER
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
# NVIDIA's: the daemon is named after the claim, the claim's containers find its pipe directory
# at this path and its shm as /dev/shm.
MPS_DAEMON_PREFIX = "mps-control-daemon-"
MPS_PIPE_CONTAINER_PATH = "/tmp/nvidia-mps"
MPS_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")


class PrepareError(ValueError):
    """The claim cannot be prepared on this node; the message goes back to the kubelet."""


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    uuid: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class SharingAction:
    """Sharing to apply to a full GPU (time-slicing) before the claim's containers start."""

    uuid: str
    sharing: gpuconfig.Sharing


@dataclass(frozen=True)
class MpsAction:
    """The claim's MPS control daemon: its name, the full GPUs it runs on and the commands it
    gets once started (`gpuconfig.mps_commands`); its files live under `<mps root>/<claim UID>`."""

    name: str
    uuids: tuple[str, ...]
    commands: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    claim_uid: str
    name: str
    namespace: str
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any]
    sharing: tuple[SharingAction, ...] = field(default=())
    mps: MpsAction | None = None


def spec_file_name(claim_uid: str) -> str:
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


def mps_daemon_name(claim_uid: str) -> str:
    return f"{MPS_DAEMON_PREFIX}{claim_uid}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def _configs(allocation: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    entries = list((allocation.get("devices") or {}).get("config") or [])
    ours = [c for c in entries if ((c.get("opaque") or {}).get("driver")) == DRIVER]
    # Class configs apply first, the claim's after them (and so win).
    return sorted(ours, key=lambda c: 0 if c.get("source") == "FromClass" else 1)


def _config_for(request: str, configs: Sequence[Mapping[str, Any]]) -> Any:
    chosen: Any = None
    parent = request.split("/", 1)[0]
    for c in configs:
        requests = c.get("requests") or []
        if not requests or request in requests or parent in requests:
            chosen = (c.get("opaque") or {}).get("parameters")
    return chosen


def _device_nodes(pub: PublishedDevice, inv: Inventory) -> tuple[str, ...]:
    facts = {g.index: g for g in inv.node.gpus}[pub.gpu.index]
    if pub.mig is None:
        return dp_devices.gpu_device(facts).paths
    mig = next(m for m in facts.migs if m.uuid == pub.uuid)
    return dp_devices.mig_device(facts, mig, inv.node.mig_minors).paths


def plan(
    claim: Mapping[str, Any],
    published: Mapping[str, PublishedDevice],
    inv: Inventory,
    gates: Mapping[str, bool],
    *,
    dev_root: str = "/",
    driver_root: str = "/",
    present_control_nodes: Iterable[str] = (),
    driver_files: Sequence[str] = (),
    mps_root: str = "/var/lib/kubelet/plugins/gpu.nvidia.com/mps",
) -> Plan:
    """What preparing `claim` (the object from the API) does on this node."""
    meta = claim.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    ref = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"{ref} is not allocated")
    results = [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == DRIVER
    ]
    configs = _configs(allocation)
    prepared: list[PreparedDevice] = []
    entries: list[dict[str, Any]] = []
    sharing: list[SharingAction] = []
    uuids: list[str] = []
    mps_uuids: list[str] = []
    mps_settings: Mapping[str, Any] | None = None
    for result in results:
        name = str(result.get("device"))
        pub = published.get(name)
        if pub is None:
            raise PrepareError(
                f"{ref}: device {name} is not a device of this node "
                f"(published: {', '.join(sorted(published)) or 'none'})"
            )
        request = str(result.get("request"))
        parameters = _config_for(request, configs)
        mig = pub.mig is not None
        try:
            effective = (
                gpuconfig.default_sharing(gates, mig=mig)
                if parameters is None
                else gpuconfig.parse(parameters, gates, mig=mig)
            )
        except gpuconfig.ConfigError as err:
            raise PrepareError(f"{ref}, request {request}: {err}") from None
        if effective.strategy == gpuconfig.MPS:
            if mig:
                raise PrepareError(
                    f"{ref}, request {request}: MPS sharing of MIG devices is not implemented by "
                    "this plugin (docs/dra.md, Sharing); share full GPUs with MPS"
                )
            if mps_settings is not None and dict(mps_settings) != dict(effective.mps):
                raise PrepareError(
                    f"{ref}, request {request}: the claim's requests ask for different mpsConfig "
                    "settings; a claim runs one MPS control daemon, give its requests one config"
                )
            mps_settings = effective.mps
            if pub.uuid not in mps_uuids:
                mps_uuids.append(pub.uuid)
        if effective.strategy == gpuconfig.TIME_SLICING and not mig:
            sharing.append(SharingAction(pub.uuid, effective))
        cdi_name = cdi_device_name(uid, name)
        nodes = _device_nodes(pub, inv)
        entries.append(
            {
                "name": cdi_name,
                "containerEdits": {"deviceNodes": [common.device_node(p, dev_root) for p in nodes]},
            }
        )
        if pub.uuid not in uuids:
            uuids.append(pub.uuid)
        prepared.append(
            PreparedDevice(
                request=request.split("/", 1)[0],
                pool=str(result.get("pool")),
                device=name,
                uuid=pub.uuid,
                cdi_ids=(f"{CDI_KIND}={cdi_name}",),
            )
        )
    present = set(present_control_nodes)
    edits: dict[str, Any] = {
        # Exactly the claim's devices: the runtime's hook and CUDA see these and no others.
        "env": [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids) or 'void'}"],
        "deviceNodes": [
            common.device_node(p, dev_root) for p in common.CONTROL_DEVICE_NODES if p in present
        ],
    }
    root = driver_root.rstrip("/")
    if driver_files:
        edits["mounts"] = [
            {
                "hostPath": f"{root}/{f}",
                "containerPath": f"/{f}",
                "options": list(
                    common.SOCKET_MOUNT_OPTIONS if f in common.SOCKETS else common.MOUNT_OPTIONS
                ),
            }
            for f in driver_files
        ]
    mps: MpsAction | None = None
    if mps_settings is not None:
        try:
            commands = gpuconfig.mps_commands(mps_settings, mps_uuids)
        except gpuconfig.ConfigError as err:
            raise PrepareError(f"{ref}: {err}") from None
        mps = MpsAction(mps_daemon_name(uid), tuple(mps_uuids), tuple(commands))
        claim_dir = f"{mps_root.rstrip('/')}/{uid}"
        edits["env"].append(f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_CONTAINER_PATH}")
        edits.setdefault("mounts", []).extend(
            {"hostPath": host, "containerPath": path, "options": list(MPS_MOUNT_OPTIONS)}
            for host, path in (
                (f"{claim_dir}/shm", "/dev/shm"),
                (f"{claim_dir}/pipe", MPS_PIPE_CONTAINER_PATH),
            )
        )
    spec = {
        "cdiVersion": common.CDI_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": edits,
    }
    return Plan(
        claim_uid=uid,
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        devices=tuple(prepared),
        spec=spec,
        sharing=tuple(sharing),
        mps=mps,
    )
