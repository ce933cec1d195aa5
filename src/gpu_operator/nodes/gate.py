"""Readiness gate for autoscalers: a startup taint the operator removes once a GPU node validated.

The node pool (cluster autoscaler, Karpenter, a cloud node pool) registers GPU nodes with the
taint; the operator never adds it. It removes it, and only it, once the node's chain validated
end to end: the node advertises allocatable GPUs (`nvidia.com/gpu` or `nvidia.com/mig-*`) and the
validator pod on the node is Ready. Operand pods tolerate the taint (they must run there to
validate the node); workloads do not, so they never land on a half-ready node. Pure: facts in,
plan out. See docs/coexistence.md, "Readiness gate".
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


@dataclass(frozen=True)
class GateFacts:
    """What the gate reads about one node: its taints, the GPUs (and MIG slices) it advertises
    as allocatable, and whether the validator pod on it is Ready."""

    taints: Sequence[Mapping[str, Any]]
    gpu_allocatable: int = 0
    validator_ready: bool = False


@dataclass(frozen=True)
class GatePlan:
    """`remove`: drop the startup taint now; `keep` is the node's taint list without it, `seen`
    the list it was planned on; `waiting_for` says what the node still lacks."""

    remove: bool
    keep: tuple[Mapping[str, Any], ...] = ()
    seen: tuple[Mapping[str, Any], ...] = ()
    waiting_for: str = ""

    def json_patch(self) -> list[dict[str, Any]]:
        """One JSON patch: fail unless spec.taints is still the list the plan read (the guard:
        a taint added or changed meanwhile is never lost), then replace it without ours."""
        return [
            {"op": "test", "path": "/spec/taints", "value": [dict(t) for t in self.seen]},
            {"op": "replace", "path": "/spec/taints", "value": [dict(t) for t in self.keep]},
        ]


def plan(facts: GateFacts, taint: StartupTaint | None) -> GatePlan:
    """Whether to remove the startup taint from one node now (never adds it)."""
    if taint is None or not any(taint.matches(t) for t in facts.taints):
        return GatePlan(remove=False)
    lacking = []
    if facts.gpu_allocatable <= 0:
        lacking.append(f"allocatable {GPU_RESOURCE} (or {MIG_PREFIX}*)")
    if not facts.validator_ready:
        lacking.append("a Ready nvidia-operator-validator pod")
    if lacking:
        return GatePlan(remove=False, waiting_for=" and ".join(lacking))
    keep = tuple(t for t in facts.taints if not taint.matches(t))
    return GatePlan(remove=True, keep=keep, seen=tuple(facts.taints))
