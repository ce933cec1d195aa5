"""The GPUCluster's status, its requirements and its exclusivity with the ClusterPolicy (pure).

A cluster runs a ClusterPolicy (device plugin stack) or a GPUCluster (DRA stack), never both:
NVIDIA's operator refuses either one while the other exists. Ours refuses only the newer of the two
(the one created later) so that creating a second object never tears down the stack that runs: the
newer gets Ready=False with reason `ConflictingCustomResource` and a Warning Event, the older keeps
running and carries a `Conflict` condition and an Event naming the refused object. Both say what to
do.

Creation timestamps have a resolution of one second, so two objects created within the same second
tie. A tie is settled by what the objects' statuses already say, so that the verdict never flips
between passes and the stack that was running first keeps running: one already refused stays
refused; else the one the operator reconciled before the other existed (it has a status) wins;
else (both or neither have one) the GPUCluster is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpu_operator.status import conditions

# Condition reasons (upstream's PrerequisiteNotMet; the others ours).
CONFLICT_REASON: Final = "ConflictingCustomResource"
PREREQUISITE_NOT_MET: Final = "PrerequisiteNotMet"
CONFLICT_CONDITION: Final = "Conflict"
MIN_KUBERNETES: Final = (1, 34, 2)
MIN_DRIVER_MAJOR: Final = 580


def _created(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _live(obj: Mapping[str, Any] | None) -> bool:
    return obj is not None and not (obj.get("metadata") or {}).get("deletionTimestamp")


def oldest_live(objects: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The object in charge among several of one kind: the oldest not being deleted (by creation
    time, then name)."""
    live = [o for o in objects if _live(o)]
    return min(live, key=lambda o: (_created(o), _name(o))) if live else None


def _says_refused(obj: Mapping[str, Any]) -> bool:
    """The object's status already carries the refusal (its Ready/Error condition; the winner's
    `Conflict` condition has the same reason and does not count)."""
    found = (obj.get("status") or {}).get("conditions") or []
    return any(
        c.get("reason") == CONFLICT_REASON and c.get("type") != CONFLICT_CONDITION for c in found
    )


def _has_run(obj: Mapping[str, Any]) -> bool:
    """The operator reconciled the object (it wrote a status) and did not refuse it."""
    return bool((obj.get("status") or {}).get("state")) and not _says_refused(obj)


def _policy_is_older(cluster: Mapping[str, Any], policy: Mapping[str, Any]) -> bool:
    """Whether the ClusterPolicy wins (module docstring: a tie is settled by the statuses)."""
    gc_created, cp_created = _created(cluster), _created(policy)
    if cp_created != gc_created:
        return cp_created < gc_created
    if _says_refused(cluster) != _says_refused(policy):
        return _says_refused(cluster)
    if _has_run(cluster) != _has_run(policy):
        return _has_run(policy)
    return True


@dataclass(frozen=True)
class Conflict:
    """Both kinds exist: which one runs, which one is refused, and what each should say."""

    winner_kind: str
    winner: str
    refused_kind: str
    refused: str
    refused_message: str
    winner_message: str


def conflict(
    cluster: Mapping[str, Any] | None, policies: Iterable[Mapping[str, Any]]
) -> Conflict | None:
    """The conflict between the GPUCluster and the oldest live ClusterPolicy, if both exist."""
    policy = oldest_live(policies)
    if cluster is None or not _live(cluster) or policy is None:
        return None
    gc_name, cp_name = _name(cluster), _name(policy)
    gc_created, cp_created = _created(cluster), _created(policy)
    never_both = "a cluster runs a ClusterPolicy or a GPUCluster, never both"
    if _policy_is_older(cluster, policy):
        return Conflict(
            winner_kind="ClusterPolicy",
            winner=cp_name,
            refused_kind="GPUCluster",
            refused=gc_name,
            refused_message=(
                f"refused: ClusterPolicy {cp_name} (created {cp_created}) already manages the "
                f"GPUs and {never_both}; nothing of this GPUCluster is deployed. To move to DRA, "
                f"delete the ClusterPolicy (kubectl delete clusterpolicy {cp_name}) and this "
                f"GPUCluster takes over; to keep the device plugin stack, delete this GPUCluster "
                f"(kubectl delete gpucluster {gc_name})"
            ),
            winner_message=(
                f"GPUCluster {gc_name} (created {gc_created}) is refused while this "
                f"ClusterPolicy exists ({never_both}); delete one of the two "
                f"(kubectl delete gpucluster {gc_name} keeps this ClusterPolicy)"
            ),
        )
    return Conflict(
        winner_kind="GPUCluster",
        winner=gc_name,
        refused_kind="ClusterPolicy",
        refused=cp_name,
        refused_message=(
            f"refused: GPUCluster {gc_name} (created {gc_created}) already manages the GPUs "
            f"through DRA and {never_both}; nothing of this ClusterPolicy is applied. To go back "
            f"to the device plugin stack, delete the GPUCluster (kubectl delete gpucluster "
            f"{gc_name}) and this ClusterPolicy takes over; else delete this ClusterPolicy "
            f"(kubectl delete clusterpolicy {cp_name})"
        ),
        winner_message=(
            f"ClusterPolicy {cp_name} (created {cp_created}) is refused while this GPUCluster "
            f"exists ({never_both}); delete one of the two (kubectl delete clusterpolicy "
            f"{cp_name} keeps this GPUCluster)"
        ),
    )


def policy_in_charge(
    policies: Iterable[Mapping[str, Any]], clusters: Iterable[Mapping[str, Any]] = ()
) -> Mapping[str, Any] | None:
    """The ClusterPolicy the operator acts on: the oldest live one, unless the GPUCluster refuses
    it (it is newer). Every reconciler that follows a ClusterPolicy (its own, NVIDIADriver's, node
    labelling's) asks this, so a refused ClusterPolicy drives nothing anywhere."""
    policy = oldest_live(policies)
    if policy is None:
        return None
    clash = conflict(oldest_live(clusters), [policy])
    return None if clash is not None and clash.refused_kind == "ClusterPolicy" else policy


def with_conflict(
    previous: Sequence[Mapping[str, Any]], message: str | None, now: str, generation: int | None
) -> list[dict[str, Any]]:
    """The winner's conditions with its `Conflict` condition set (a message) or removed (None)."""
    others = [dict(c) for c in previous if c.get("type") != CONFLICT_CONDITION]
    if message is None:
        return others
    old = next((c for c in previous if c.get("type") == CONFLICT_CONDITION), None)
    since = str(old.get("lastTransitionTime")) if old and old.get("status") == "True" else now
    condition: dict[str, Any] = {
        "type": CONFLICT_CONDITION,
        "status": "True",
        "reason": CONFLICT_REASON,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return [*others, condition]


# --- requirements ------------------------------------------------------------------------------

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`v1.34.2-gke.100` -> (1, 34, 2); None when unreadable."""
    found = _VERSION.match(text.strip())
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


@dataclass(frozen=True)
class Requirements:
    """What the DRA stack needs, as far as it is known: blocking problems stop the apply,
    warnings are said in the status and an Event."""

    blocking: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def requirements(
    server_version: str | None,
    driver_majors: Mapping[str, int],
    cdi_disabled_nodes: Sequence[str] = (),
) -> Requirements:
    """Kubernetes >= 1.34.2 (the resource.k8s.io/v1 API and fixes the DRA driver needs), a driver
    of the 580 branch or newer where a node's driver is known, CDI enabled in the runtime."""
    blocking: list[str] = []
    warnings: list[str] = []
    if server_version is not None:
        version = parse_version(server_version)
        wanted = ".".join(map(str, MIN_KUBERNETES))
        if version is None:
            warnings.append(f"cannot read the API server version {server_version!r}")
        elif version < MIN_KUBERNETES:
            blocking.append(
                f"Kubernetes {server_version} is older than {wanted}, which NVIDIA's DRA driver "
                "needs (resource.k8s.io/v1); upgrade the control plane and the kubelets"
            )
    old = sorted(n for n, major in driver_majors.items() if major < MIN_DRIVER_MAJOR)
    if old:
        shown = ", ".join(f"{n} ({driver_majors[n]})" for n in old[:5])
        more = f" and {len(old) - 5} more" if len(old) > 5 else ""
        warnings.append(
            f"{len(old)} node(s) run a driver older than the {MIN_DRIVER_MAJOR} branch the DRA "
            f"driver needs: {shown}{more}; upgrade their driver (an NVIDIADriver or the host's)"
        )
    if cdi_disabled_nodes:
        shown = ", ".join(sorted(cdi_disabled_nodes)[:5])
        warnings.append(
            f"{len(cdi_disabled_nodes)} node(s) have CDI disabled in the container toolkit, and "
            f"the DRA driver hands GPUs out as CDI devices: {shown}; enable CDI in the runtime "
            "(nvidia-ctk runtime configure --cdi.enabled)"
        )
    return Requirements(tuple(blocking), tuple(warnings))


# --- status ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """How the GPUCluster stands after a pass."""

    ready: bool
    reason: str
    message: str
    conflict: str | None = None  # the winner's Conflict condition message


def build(
    report: Report,
    *,
    namespace: str,
    now: str,
    generation: int | None,
    previous: Mapping[str, Any] | None,
) -> dict[str, Any]:
    before = list((previous or {}).get("conditions") or [])
    pair = conditions.pair(
        ready=report.ready,
        reason=report.reason,
        message=report.message,
        now=now,
        generation=generation,
        previous=before,
    )
    return {
        "state": "ready" if report.ready else "notReady",
        "namespace": namespace,
        "conditions": with_conflict(pair, report.conflict, now, generation),
    }


__all__ = [
    "CONFLICT_CONDITION",
    "CONFLICT_REASON",
    "PREREQUISITE_NOT_MET",
    "Conflict",
    "Report",
    "Requirements",
    "build",
    "conflict",
    "oldest_live",
    "parse_version",
    "policy_in_charge",
    "requirements",
    "with_conflict",
]


# ----- node labels: keep the DRA driver where claim pods remain -------------------------------


@dataclass(frozen=True)
class ClaimPod:
    """A pod as the DRA driver's node label needs it: its node, namespace, claims and whether it
    has ended (Succeeded or Failed; a terminating pod has not)."""

    node: str
    namespace: str
    claims: tuple[str, ...]
    ended: bool


def nodes_holding_gpu_claims(
    pods: Iterable[ClaimPod], claim_gpu: Mapping[str, bool] | None
) -> set[str]:
    """The nodes where a pod that has not ended (terminating ones included) holds a
    `gpu.nvidia.com` claim: the DRA kubelet plugin must stay there to unprepare it, so the
    node keeps `nvidia.com/gpu.deploy.dra-driver` even when the GPUCluster goes or the node
    stops being a GPU node, as upstream's node labelling does. `claim_gpu`: `namespace/name` ->
    allocated by gpu.nvidia.com; a claim not known there (or None: claims not readable) counts,
    as keeping the plugin one pod too long is harmless and dropping it is not."""
    found: set[str] = set()
    for p in pods:
        if p.ended or not p.node or not p.claims:
            continue
        if claim_gpu is None or any(claim_gpu.get(f"{p.namespace}/{c}", True) for c in p.claims):
            found.add(p.node)
    return found
