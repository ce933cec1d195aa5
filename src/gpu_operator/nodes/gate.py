"""Readiness gate for autoscalers: a startup taint the operator removes once a GPU node validated.

The node pool (cluster autoscaler, Karpenter, a cloud node pool) registers GPU nodes with the
taint; the operator never adds it. It removes it, and only it, once the node's chain validated
end to end: the node advertises allocatable GPUs (`nvidia.com/gpu` or `nvidia.com/mig-*`) and the
validator pod on the node is Ready. A DRA node (`nvidia.com/dra-kubelet-plugin=true`) advertises
no allocatable GPUs (the device plugin is off there): its GPUs count once the node's
`gpu.nvidia.com` ResourceSlices publish at least as many devices as the node has GPUs.
Operand pods tolerate the taint (they must run there to validate the node); workloads do not,
so they never land on a half-ready node. Pure: facts in, plan out. See docs/coexistence.md,
"Readiness gate".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV = "STARTUP_TAINT"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Whole GPUs and MIG slices a device plugin advertises (mixed strategy: nvidia.com/mig-1g.10gb).
GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
# What a node at the gate lacks, in the short words the status message uses.
NO_GPUS = "no allocatable GPUs"
NO_DRA_DEVICES = "GPUs not all published as DRA devices"
NO_SLICES = "ResourceSlices not watched"
# The DRA driver whose ResourceSlices carry a DRA node's GPUs.
DRA_DRIVER = "gpu.nvidia.com"
VALIDATOR_NOT_READY = "validator not Ready"
# Names listed per reason in the status message; the rest are counted.
SHOWN = 5


@dataclass(frozen=True)
class StartupTaint:
    """The taint the operator removes: `key[=value]:Effect`, matched on key and effect (as
    `kubectl taint node N key:Effect-` removes it, whatever its value)."""

    key: str
    effect: str
    value: str = ""

    @classmethod
    def parse(cls, text: str, source: str = ENV) -> StartupTaint:
        head, sep, effect = text.strip().rpartition(":")
        key, _, value = head.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{source}: {text!r} is not KEY[=VALUE]:EFFECT")
        if effect not in EFFECTS:
            raise ValueError(f"{source}: effect {effect!r} is not one of {', '.join(EFFECTS)}")
        return cls(key.strip(), effect, value.strip())

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StartupTaint | None:
        """STARTUP_TAINT, or None when unset or empty (the gate is off)."""
        raw = environ.get(ENV, "").strip()
        return cls.parse(raw) if raw else None

    def matches(self, taint: Mapping[str, Any]) -> bool:
        return taint.get("key") == self.key and taint.get("effect") == self.effect

    def toleration(self) -> dict[str, str]:
        """The toleration operand pods carry: any value of the key, this effect."""
        return {"key": self.key, "operator": "Exists", "effect": self.effect}

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


def allocatable_gpus(allocatable: Mapping[str, Any] | None) -> int:
    """Whole GPUs plus MIG slices in a node's `status.allocatable` (bad quantities count 0)."""
    total = 0
    for name, quantity in (allocatable or {}).items():
        if name == GPU_RESOURCE or name.startswith(MIG_PREFIX):
            try:
                total += int(quantity)
            except (TypeError, ValueError):
                continue
    return total


GPU_COUNT_LABEL = "nvidia.com/gpu.count"


def node_gpus(labels: Mapping[str, str], capacity_gpus: int = 0) -> int:
    """The GPUs a node has, as far as known: GFD's `nvidia.com/gpu.count`, else the whole GPUs
    in its capacity (0: not known)."""
    try:
        counted = int(labels.get(GPU_COUNT_LABEL) or 0)
    except ValueError:
        counted = 0
    return max(counted, capacity_gpus, 0)


def slice_devices(slices: Sequence[Mapping[str, Any]]) -> int:
    """The devices published in the gpu.nvidia.com ResourceSlices among `slices`."""
    return sum(
        len((s.get("spec") or {}).get("devices") or ())
        for s in slices
        if (s.get("spec") or {}).get("driver") == DRA_DRIVER
    )


@dataclass(frozen=True)
class GateFacts:
    """What the gate reads about one node: its taints, the GPUs (and MIG slices) it advertises
    as allocatable, and whether the validator pod on it is Ready."""

    taints: Sequence[Mapping[str, Any]]
    gpu_allocatable: int = 0
    validator_ready: bool = False
    # A DRA node: its GPUs are the devices its gpu.nvidia.com ResourceSlices publish
    # (`dra_devices`; None: the slices are not read, resource.k8s.io/v1 is not served), to be
    # compared with `gpus`, the GPUs the node has (GFD's gpu.count, else its capacity; 0: not
    # known, then one device is enough).
    dra: bool = False
    dra_devices: int | None = None
    gpus: int = 0


@dataclass(frozen=True)
class GatePlan:
    """`remove`: drop the startup taint now; `keep` is the node's taint list without it, `seen`
    the list it was planned on; `waiting_for` says what the node still lacks, `lacking` the same
    in short words (NO_GPUS, VALIDATOR_NOT_READY)."""

    remove: bool
    keep: tuple[Mapping[str, Any], ...] = ()
    seen: tuple[Mapping[str, Any], ...] = ()
    waiting_for: str = ""
    lacking: tuple[str, ...] = ()

    def json_patch(self) -> list[dict[str, Any]]:
        """One JSON patch: fail unless spec.taints is still the list the plan read (the guard:
        a taint added or changed meanwhile is never lost), then replace it without ours. The
        last taint removes the field, as the API server stores an empty list (`omitempty`), so
        `kubectl get node` shows `<none>` rather than `[]`."""
        guard = {"op": "test", "path": "/spec/taints", "value": [dict(t) for t in self.seen]}
        if not self.keep:
            return [guard, {"op": "remove", "path": "/spec/taints"}]
        return [
            guard,
            {"op": "replace", "path": "/spec/taints", "value": [dict(t) for t in self.keep]},
        ]


def plan(facts: GateFacts, taint: StartupTaint | None) -> GatePlan:
    """Whether to remove the startup taint from one node now (never adds it)."""
    if taint is None or not any(taint.matches(t) for t in facts.taints):
        return GatePlan(remove=False)
    wanted, short = [], []
    if facts.dra:
        need = max(facts.gpus, 1)
        if facts.dra_devices is None:
            wanted.append(f"{DRA_DRIVER} ResourceSlices (resource.k8s.io/v1 is not watched)")
            short.append(NO_SLICES)
        elif facts.dra_devices < need:
            wanted.append(
                f"{need} device(s) in its {DRA_DRIVER} ResourceSlices "
                f"({facts.dra_devices} published)"
            )
            short.append(NO_DRA_DEVICES)
    elif facts.gpu_allocatable <= 0:
        wanted.append(f"allocatable {GPU_RESOURCE} (or {MIG_PREFIX}*)")
        short.append(NO_GPUS)
    if not facts.validator_ready:
        wanted.append("a Ready nvidia-operator-validator pod")
        short.append(VALIDATOR_NOT_READY)
    if wanted:
        return GatePlan(remove=False, waiting_for=" and ".join(wanted), lacking=tuple(short))
    keep = tuple(t for t in facts.taints if not taint.matches(t))
    return GatePlan(remove=True, keep=keep, seen=tuple(facts.taints))


def waiting_summary(waiting: Mapping[str, GatePlan], shown: int = SHOWN) -> str:
    """One sentence naming the nodes that still carry the startup taint, grouped by what they
    lack ("" for none): `2 node(s) wait at the startup gate: a-1, a-2 (validator not Ready)`.
    A node whose plan removes the taint is listed as validated (the removal is under way, or
    failing: the operator's log says why)."""
    if not waiting:
        return ""
    groups: dict[str, list[str]] = {}
    for name in sorted(waiting):
        plan = waiting[name]
        reason = ", ".join(plan.lacking) if plan.lacking else "validated, taint being removed"
        groups.setdefault(reason, []).append(name)
    parts = []
    for reason, names in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        listed = ", ".join(names[:shown])
        if len(names) > shown:
            listed += f" and {len(names) - shown} more"
        parts.append(f"{listed} ({reason})")
    return f"{len(waiting)} node(s) wait at the startup gate: {'; '.join(parts)}"
