"""The kubelet DRA manager's decisions, as pure functions: which ResourceClaims a pod uses on its
node, whether the kubelet may prepare them, which drivers it has to call, and which CDI devices
each container gets.

Facts of kubelet 1.35 these follow (messages are the kubelet's, since users read them in the
pod's `FailedPrepareDynamicResources` Events):
- a pod's claim entry names its claim directly (`resourceClaimName`) or through a template, and
  then the claim's name is the one the resource claim controller wrote into the pod's
  `status.resourceClaimStatuses` (an entry without a name there needs no claim);
- a claim from a template must be controlled by the pod (owner reference with controller=true);
- the claim must list the pod in `status.reservedFor` and must be allocated; the drivers to call
  are the distinct `driver`s of `status.allocation.devices.results`;
- a container gets the CDI devices of the claims it lists in `resources.claims`: for an entry
  with a `request`, the devices the driver tied to that request (or to no request at all), for an
  entry without one, all of the claim's devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ClaimError(Exception):
    """A claim the kubelet cannot prepare for a pod; the text is the kubelet's."""


@dataclass
class PreparedDevice:
    """One device a driver prepared for a claim (a NodePrepareResources `Device`)."""

    pool: str
    device: str
    request_names: list[str] = field(default_factory=list)
    cdi_device_ids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "PoolName": self.pool,
            "DeviceName": self.device,
            "RequestNames": list(self.request_names),
            "CDIDeviceIDs": list(self.cdi_device_ids),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedDevice:
        return cls(
            pool=str(data.get("PoolName", "")),
            device=str(data.get("DeviceName", "")),
            request_names=[str(n) for n in data.get("RequestNames") or []],
            cdi_device_ids=[str(n) for n in data.get("CDIDeviceIDs") or []],
        )


@dataclass
class ClaimInfo:
    """What the kubelet keeps about one claim on its node: the pods using it and, per driver,
    the devices the driver prepared. `prepared` is not checkpointed: after a kubelet restart
    every claim is prepared again (drivers must answer a repeated call the same way)."""

    uid: str
    name: str
    namespace: str
    drivers: dict[str, list[PreparedDevice]]
    pod_uids: set[str] = field(default_factory=set)
    prepared: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def cdi_devices(self, request: str) -> list[str]:
        """The CDI device ids of the devices serving `request` ("": all of the claim's)."""
        result: list[str] = []
        for driver in sorted(self.drivers):
            for device in self.drivers[driver]:
                if not request or not device.request_names or request in device.request_names:
                    result.extend(device.cdi_device_ids)
        return result

    def to_json(self) -> dict[str, Any]:
        return {
            "ClaimUID": self.uid,
            "ClaimName": self.name,
            "Namespace": self.namespace,
            "PodUIDs": sorted(self.pod_uids),
            "DriverState": {
                driver: {"Devices": [d.to_json() for d in devices]}
                for driver, devices in sorted(self.drivers.items())
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClaimInfo:
        drivers = {
            str(driver): [PreparedDevice.from_json(d) for d in (state or {}).get("Devices") or []]
            for driver, state in (data.get("DriverState") or {}).items()
        }
        return cls(
            uid=str(data["ClaimUID"]),
            name=str(data["ClaimName"]),
            namespace=str(data["Namespace"]),
            drivers=drivers,
            pod_uids={str(u) for u in data.get("PodUIDs") or []},
        )


def pod_ref(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def uses_claims(pod: dict[str, Any]) -> bool:
    """Whether a pod has any ResourceClaim entries (the kubelet's DRA work starts only then)."""
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def claim_name(pod: dict[str, Any], entry: dict[str, Any]) -> tuple[str | None, bool]:
    """The ResourceClaim a pod's `spec.resourceClaims` entry stands for and whether the pod must
    own it (template claims); None: the entry needs no claim. Raises ClaimError."""
    direct = entry.get("resourceClaimName")
    if direct:
        return str(direct), False
    if entry.get("resourceClaimTemplateName"):
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("name") == entry.get("name"):
                generated = status.get("resourceClaimName")
                return (str(generated) if generated else None), True
        raise ClaimError(f'pod "{pod_ref(pod)}": ResourceClaim not created yet')
    raise ClaimError(
        f'pod "{pod_ref(pod)}", spec.resourceClaim "{entry.get("name", "")}": '
        "unsupported ResourceClaim API"
    )


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """Names of the claims a pod uses, as far as they can be resolved (for unpreparing)."""
    names: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        try:
            name, _ = claim_name(pod, entry)
        except ClaimError:
            continue
        if name is not None and name not in names:
            names.append(name)
    return names


def check_claim(pod: dict[str, Any], claim: dict[str, Any], must_own: bool) -> list[str]:
    """Check that the kubelet may prepare `claim` for `pod`; returns the drivers to call
    (sorted). Raises ClaimError with the kubelet's message."""
    meta = claim.get("metadata") or {}
    pod_meta = pod["metadata"]
    if must_own and not _controlled_by(claim, pod):
        raise ClaimError(
            f"ResourceClaim {meta.get('namespace', '')}/{meta.get('name', '')} was not created "
            f"for pod {pod_ref(pod)} (pod is not owner)"
        )
    status = claim.get("status") or {}
    reserved = any(
        ref.get("resource") == "pods" and ref.get("uid") == pod_meta.get("uid")
        for ref in status.get("reservedFor") or []
    )
    if not reserved:
        raise ClaimError(
            f"pod {pod_meta.get('name', '')} ({pod_meta.get('uid', '')}) is not allowed to use "
            f"ResourceClaim {meta.get('name', '')} ({meta.get('uid', '')})"
        )
    allocation = status.get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {meta.get('name', '')}: not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    return sorted({str(r.get("driver", "")) for r in results})


def _controlled_by(claim: dict[str, Any], pod: dict[str, Any]) -> bool:
    meta = claim.get("metadata") or {}
    if meta.get("namespace") != pod["metadata"].get("namespace"):
        return False
    return any(
        ref.get("controller") and ref.get("uid") == pod["metadata"].get("uid")
        for ref in meta.get("ownerReferences") or []
    )


def container_claim_requests(
    pod: dict[str, Any], container: dict[str, Any]
) -> list[tuple[str, str]]:
    """(claim name, request name) for each claim a container lists in `resources.claims`, in
    the pod's claim order ("" request: the whole claim); entries without a claim are left out."""
    wanted: dict[str, list[str]] = {}
    for ref in (container.get("resources") or {}).get("claims") or []:
        wanted.setdefault(str(ref.get("name", "")), []).append(str(ref.get("request") or ""))
    result: list[tuple[str, str]] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        requests = wanted.get(str(entry.get("name", "")))
        if requests is None:
            continue
        try:
            name, _ = claim_name(pod, entry)
        except ClaimError:
            continue
        if name is None:
            continue
        result.extend((name, request) for request in requests)
    return result


def container_cdi_devices(
    pod: dict[str, Any], container: dict[str, Any], infos: dict[tuple[str, str], ClaimInfo]
) -> tuple[str, ...]:
    """The CDI device ids the kubelet passes the runtime for one container, de-duplicated in
    order. Raises ClaimError when a listed claim was not prepared."""
    namespace = str(pod["metadata"].get("namespace", ""))
    ids: dict[str, None] = {}
    for name, request in container_claim_requests(pod, container):
        info = infos.get((namespace, name))
        if info is None:
            raise ClaimError(
                "internal error: unable to get claim info for ResourceClaim "
                f"{name} in namespace {namespace}"
            )
        ids.update(dict.fromkeys(info.cdi_devices(request)))
    return tuple(ids)
