"""What the compute-domain kubelet plugin publishes and how it prepares a claim. Pure.

Facts carried from NVIDIA's driver (`compute-domain.nvidia.com`): one pool per node named after
the node; devices `channel-<id>` (attributes `type: channel`, `id`) and `daemon-0` (`type:
daemon`, `id: 0`); the default-channel class selects the channel with id 0. Channel claims carry
an opaque `ComputeDomainChannelConfig` (`domainID`, `allocationMode` Single or All), daemon
claims a `ComputeDomainDaemonConfig` (`domainID`). A channel is the character device
`/dev/nvidia-caps-imex-channels/channel<id>`: major the `nvidia-caps-imex-channels` line of
`/proc/devices`, minor the id, mode 0666. The daemon's container gets the domain's config
directory at `/imexd` and `CLIQUE_ID`, `COMPUTE_DOMAIN_UUID`, `COMPUTE_DOMAIN_NAME`,
`COMPUTE_DOMAIN_NAMESPACE`. Ours adds the string attribute `cliqueID` (`<cluster UUID>.<clique
id>`, empty without a fabric) so a claim can select one NVLink partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents import cdi as common
from gpu_operator.api import computedomain as cdapi
from gpu_operator.nvml import protocol as p

DRIVER = cdapi.DRIVER
CHANNEL = "channel"
DAEMON = "daemon"
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
PROC_DEVICES_NAME = "nvidia-caps-imex-channels"
MAX_CHANNELS = 2048
CDI_VENDOR = "k8s." + DRIVER
CDI_KIND = f"{CDI_VENDOR}/claim"
DAEMON_CONFIG_DIR = "/imexd"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class PrepareError(ValueError):
    """The claim cannot be prepared (yet); the message goes back to the kubelet."""


class FabricError(ValueError):
    """The node's GPUs are not usable for IMEX (CrashOnNVLinkFabricErrors refuses to start)."""


def clique(fabric: Sequence[p.FabricInfo | None]) -> tuple[str, list[str]]:
    """The node's clique (`<cluster UUID>.<clique id>`, "" when no GPU is on a fabric) and the
    problems found: GPUs not registered, registration failed, GPUs in different cliques."""
    found: set[str] = set()
    problems: list[str] = []
    for index, info in enumerate(fabric):
        if info is None or info.state == p.FABRIC_STATE_NOT_SUPPORTED:
            continue
        if info.cluster_uuid in ("", ZERO_UUID):
            continue
        if not info.completed:
            what = "in progress" if info.state == p.FABRIC_STATE_IN_PROGRESS else "not complete"
            if info.state == p.FABRIC_STATE_COMPLETED:
                what = f"failed (NVML error {info.status})"
            problems.append(f"GPU {index}: NVLink fabric registration {what}")
            continue
        found.add(f"{info.cluster_uuid}.{info.clique_id}")
    if len(found) > 1:
        problems.append(f"the node's GPUs are in different cliques: {sorted(found)}")
        return "", problems
    return (next(iter(found)) if found else ""), problems


def channel_name(index: int) -> str:
    return f"{CHANNEL}-{index}"


DAEMON_DEVICE = f"{DAEMON}-0"


def devices(clique_id: str) -> list[dict[str, Any]]:
    """The published devices: channel 0 and the daemon device, both with the node's clique."""
    out: list[dict[str, Any]] = []
    for name, kind in ((channel_name(0), CHANNEL), (DAEMON_DEVICE, DAEMON)):
        out.append({
            "name": name,
            "attributes": {
                "type": {"string": kind},
                "id": {"int": 0},
                "cliqueID": {"string": clique_id},
            },
        })  # fmt: skip
    return out


def slices(node: str, clique_id: str, generation: int) -> list[dict[str, Any]]:
    return [{
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices(clique_id),
        },
    }]  # fmt: skip


def channel_major(proc_devices: str) -> int | None:
    """The major number of `nvidia-caps-imex-channels` in /proc/devices (None: not there)."""
    for line in proc_devices.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == PROC_DEVICES_NAME and parts[0].isdigit():
            return int(parts[0])
    return None


@dataclass(frozen=True)
class Request:
    """One allocated device of ours in a claim, with its opaque config."""

    request: str
    pool: str
    device: str
    kind: str  # ComputeDomainChannelConfig or ComputeDomainDaemonConfig
    domain: str
    allocation_mode: str = cdapi.ALLOCATION_SINGLE


def requests(claim: Mapping[str, Any]) -> list[Request]:
    """Our allocated devices and their configs; PrepareError when one has none."""
    meta = claim.get("metadata") or {}
    ref = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"{ref} is not allocated")
    devs = allocation.get("devices") or {}
    configs = [
        c for c in devs.get("config") or [] if (c.get("opaque") or {}).get("driver") == DRIVER
    ]
    found: list[Request] = []
    for result in devs.get("results") or []:
        if result.get("driver") != DRIVER:
            continue
        request = str(result.get("request"))
        params: Mapping[str, Any] | None = None
        for c in configs:
            if not c.get("requests") or request.split("/", 1)[0] in c["requests"]:
                params = (c.get("opaque") or {}).get("parameters")
        if not params or params.get("kind") not in (
            cdapi.CHANNEL_CONFIG_KIND,
            cdapi.DAEMON_CONFIG_KIND,
        ):
            raise PrepareError(
                f"{ref}, request {request}: no {cdapi.CHANNEL_CONFIG_KIND} or "
                f"{cdapi.DAEMON_CONFIG_KIND} for driver {DRIVER}: claim channels through the "
                "ResourceClaimTemplate a ComputeDomain names (spec.channel.resourceClaimTemplate)"
            )
        if not params.get("domainID"):
            raise PrepareError(f"{ref}, request {request}: the config names no domainID")
        found.append(
            Request(
                request=request,
                pool=str(result.get("pool")),
                device=str(result.get("device")),
                kind=str(params["kind"]),
                domain=str(params["domainID"]),
                allocation_mode=str(params.get("allocationMode") or cdapi.ALLOCATION_SINGLE),
            )
        )
    return found


def node_ready(domain: Mapping[str, Any], node: str) -> bool:
    """The domain's status says this node's IMEX daemon is ready."""
    return any(
        n.get("name") == node and n.get("status") == cdapi.READY
        for n in (domain.get("status") or {}).get("nodes") or []
    )


def channel_nodes(major: int, mode: str, dev_root: str) -> list[dict[str, Any]]:
    count = MAX_CHANNELS if mode == cdapi.ALLOCATION_ALL else 1
    return [
        {
            **common.device_node(f"{CHANNEL_DIR}/channel{i}", dev_root),
            "type": "c",
            "major": major,
            "minor": i,
            "fileMode": 0o666,
        }
        for i in range(count)
    ]


def spec_file_name(claim_uid: str) -> str:
    return f"{CDI_VENDOR}-claim_{claim_uid}.json"


def channel_spec(claim_uid: str, req: Request, major: int, dev_root: str) -> dict[str, Any]:
    return {
        "cdiVersion": common.CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{
            "name": f"{claim_uid}-{req.device}",
            "containerEdits": {
                "deviceNodes": channel_nodes(major, req.allocation_mode, dev_root)
            },
        }],
    }  # fmt: skip


def daemon_spec(
    claim_uid: str,
    req: Request,
    domain: Mapping[str, Any],
    clique_id: str,
    config_dir: str,
    major: int | None,
    dev_root: str,
) -> dict[str, Any]:
    meta = domain.get("metadata") or {}
    edits: dict[str, Any] = {
        "env": [
            f"CLIQUE_ID={clique_id}",
            f"COMPUTE_DOMAIN_UUID={meta.get('uid')}",
            f"COMPUTE_DOMAIN_NAME={meta.get('name')}",
            f"COMPUTE_DOMAIN_NAMESPACE={meta.get('namespace')}",
        ],
        "mounts": [{
            "hostPath": config_dir, "containerPath": DAEMON_CONFIG_DIR,
            "options": ["rw", "nosuid", "nodev", "bind"],
        }],
    }  # fmt: skip
    if major is not None and clique_id:
        edits["deviceNodes"] = channel_nodes(major, cdapi.ALLOCATION_SINGLE, dev_root)
    return {
        "cdiVersion": common.CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": f"{claim_uid}-{req.device}", "containerEdits": edits}],
    }


def cdi_id(claim_uid: str, device: str) -> str:
    return f"{CDI_KIND}={claim_uid}-{device}"
