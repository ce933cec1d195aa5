"""Adoption planner: what taking over operand objects another operator created would do to each.

State in (the objects our renderers want, the live objects in the operator namespace and the
ClusterPolicy's uid), plan out: per object adopted as is, patched in place (which fields, and
whether its pods roll), replaced, created, deleted, or blocked. The `adopt` command prints it; the
controller's server-side apply does the same thing, so the plan says what the operator will do.

The comparison models a forced server-side apply: a field the desired object sets takes the desired
value; a field only the live object has stays (another field manager owns it). So a pod template
the live object already satisfies is not changed, whatever the API server defaulted into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpu_operator.api import keys

Verdict = Literal["adopt", "patch", "replace", "create", "delete", "blocked"]
VERDICTS: Final[tuple[Verdict, ...]] = ("adopt", "patch", "replace", "create", "delete", "blocked")
WORKLOADS: Final = ("DaemonSet", "Deployment", "StatefulSet")
# Lists the API server merges by key under server-side apply (x-kubernetes-list-map-keys);
# any other list is atomic: the desired list replaces the live one.
LIST_KEYS: Final[dict[str, str]] = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "ownerReferences": "uid",
}
# Our bookkeeping on an object's own metadata: writing it never touches pods (README, differences).
BOOKKEEPING: Final = (
    f"metadata.annotations[{keys.LAST_APPLIED_HASH}]",
    f"metadata.labels[{keys.OPERATOR_STATE_LABEL}]",
)
# Exit codes of `gpu-operator adopt`: every object can be taken over without replacing one
# (0), some must be replaced or deleted (3), some cannot be taken over at all (4).
EXIT_OK: Final = 0
EXIT_REPLACE: Final = 3
EXIT_BLOCKED: Final = 4


@dataclass(frozen=True)
class ObjectPlan:
    """What adopting one object does; `changes` are field paths whose value changes."""

    kind: str
    name: str
    namespace: str
    verdict: Verdict
    reason: str = ""
    changes: tuple[str, ...] = ()
    rolls: bool = False
    pods_kept: bool = True

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class AdoptionPlan:
    """The plan for every object, desired ones first in render order, then live leftovers."""

    objects: tuple[ObjectPlan, ...]
    notes: tuple[str, ...] = field(default=())

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for o in self.objects if o.verdict == v) for v in VERDICTS}

    @property
    def rolling(self) -> tuple[ObjectPlan, ...]:
        return tuple(o for o in self.objects if o.rolls)

    @property
    def exit_code(self) -> int:
        counts = self.counts()
        if counts["blocked"]:
            return EXIT_BLOCKED
        if counts["replace"] or counts["delete"]:
            return EXIT_REPLACE
        return EXIT_OK


def owner_reference(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The controller owner reference every operand object carries (upstream's, and ours)."""
    meta = policy.get("metadata") or {}
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths of the fields a forced server-side apply of `desired` would change in `live`."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return [path or "."]
        found: list[str] = []
        for name, value in desired.items():
            child = f"{path}.{name}" if path else str(name)
            if isinstance(value, list) and name in LIST_KEYS and isinstance(live.get(name), list):
                found += _keyed_differences(value, live[name], LIST_KEYS[name], child)
            elif name in ("labels", "annotations") and isinstance(value, Mapping):
                have = live.get(name) or {}
                found += [f"{child}[{k}]" for k, v in value.items() if have.get(k) != v]
            else:
                found += differences(value, live.get(name), child)
        return found
    return [] if desired == live else [path or "."]


def _keyed_differences(
    desired: Sequence[Any], live: Sequence[Any], key: str, path: str
) -> list[str]:
    have = {item.get(key): item for item in live if isinstance(item, Mapping)}
    found: list[str] = []
    for item in desired:
        if not isinstance(item, Mapping):
            return [path] if list(desired) != list(live) else []
        name = item.get(key)
        child = f"{path}[{name}]"
        found += differences(item, have[name], child) if name in have else [child]
    return found


def _selector(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {})


def _template_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    template = (obj.get("spec") or {}).get("template") or {}
    return dict((template.get("metadata") or {}).get("labels") or {})


def _strategy(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec") or {}
    found = (spec.get("updateStrategy") or spec.get("strategy") or {}).get("type")
    return str(found or "RollingUpdate")


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid"))
    return None


def _text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"


def plan_object(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> ObjectPlan:
    """The verdict for one desired object against its live namesake (None: not there)."""
    kind, namespace, name = _key(desired)
    if live is None:
        return ObjectPlan(kind, name, namespace, "create", "not there yet")
    wanted_uid = _controller_uid(desired)
    live_uid = _controller_uid(live)
    if live_uid is not None and wanted_uid is not None and live_uid != wanted_uid:
        owner = next(
            o for o in live["metadata"]["ownerReferences"] if str(o.get("uid")) == live_uid
        )
        return ObjectPlan(
            kind, name, namespace, "blocked",
            f"controlled by {owner.get('kind')}/{owner.get('name')} (uid {live_uid}), not by "
            f"this ClusterPolicy (uid {wanted_uid}); delete it or the other owner first",
        )  # fmt: skip
    if kind in WORKLOADS and _selector(desired) != _selector(live):
        old, new = _selector(live), _selector(desired)
        kept = all(_template_labels(live).get(k) == v for k, v in new.items())
        how = "its pods are kept and adopted" if kept else "its pods are replaced"
        return ObjectPlan(
            kind, name, namespace, "replace",
            f"spec.selector {_text(old)} -> {_text(new)} is immutable: deleted and created "
            f"again; {how}",
            changes=("spec.selector",), rolls=not kept, pods_kept=kept,
        )  # fmt: skip
    changes = tuple(differences(desired, live))
    substantive = tuple(c for c in changes if c not in BOOKKEEPING)
    if not substantive:
        why = "equal in substance" + ("; our bookkeeping added" if changes else "")
        return ObjectPlan(kind, name, namespace, "adopt", why, changes=changes)
    template = tuple(c for c in substantive if c.startswith("spec.template."))
    rolls = bool(template) and kind in WORKLOADS
    if not rolls:
        reason = "patched in place; pods do not restart"
    elif _strategy(live) == "OnDelete":
        reason = (
            "pod template changes; OnDelete: running pods are not restarted by the DaemonSet "
            "(the driver upgrade flow restarts them if autoUpgrade is on)"
        )
    else:
        reason = "pod template changes: pods roll once"
    return ObjectPlan(
        kind, name, namespace, "patch", reason, changes=substantive, rolls=rolls,
        pods_kept=not rolls or _strategy(live) == "OnDelete",
    )  # fmt: skip


def plan(
    desired: Iterable[Mapping[str, Any]],
    live: Iterable[Mapping[str, Any]],
    *,
    policy_uid: str | None,
) -> AdoptionPlan:
    """Plan the takeover of `live` operand objects by the `desired` ones, as the operator writes
    them (owner reference and hash annotation set).

    Live objects controlled by the ClusterPolicy that ours does not render are deleted by the
    operator's prune; other live objects are not ours and are left out of the plan."""
    by_key = {_key(obj): obj for obj in live}
    planned: list[ObjectPlan] = []
    seen: set[tuple[str, str, str]] = set()
    for obj in desired:
        key = _key(obj)
        seen.add(key)
        planned.append(plan_object(obj, by_key.get(key)))
    for key, obj in by_key.items():
        if key in seen or policy_uid is None or _controller_uid(obj) != policy_uid:
            continue
        kind, namespace, name = key
        planned.append(
            ObjectPlan(
                kind,
                name,
                namespace,
                "delete",
                "controlled by the ClusterPolicy but not rendered by this operator for it: "
                "deleted as no longer wanted",
                rolls=kind in WORKLOADS,
                pods_kept=False,
            )
        )
    notes: list[str] = []
    if policy_uid is None:
        notes.append("no ClusterPolicy: nothing is adopted until one exists")
    return AdoptionPlan(tuple(planned), tuple(notes))


__all__ = [
    "EXIT_BLOCKED",
    "EXIT_OK",
    "EXIT_REPLACE",
    "AdoptionPlan",
    "ObjectPlan",
    "Verdict",
    "differences",
    "owner_reference",
    "plan",
    "plan_object",
]
