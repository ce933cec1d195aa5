"""Adoption planner: what taking over operand objects another operator created would do to each.

State in (the objects our renderers want, the live objects in the operator namespace and the
ClusterPolicy's uid), plan out: per object adopted as is, patched in place (which fields, and
whether its pods roll), replaced, created, deleted, or blocked. The `adopt` command prints it; the
controller's server-side apply does the same thing, so the plan says what the operator will do.

The comparison models a forced server-side apply: a field the desired object sets takes the desired
value; a field only the live object has stays (another field manager owns it). So a pod template
the live object already satisfies is not changed, whatever the API server defaulted into it.
Where `gpu-operator adopt` could ask the API server (a dry run of the operator's first write of
each object: the takeover patch of operands/takeover.py, or the apply), its answer (`Trial`)
decides instead: a refused write is `blocked` with the server's message, and the fields that
change, and whether a pod template changes, are read from the object the server would store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpu_operator.api import keys
from gpu_operator.operands import takeover

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
class Trial:
    """The API server's answer to a dry run of the operator's first write of an object: the
    object it would store, or why it refuses the write."""

    result: Mapping[str, Any] | None = None
    rejected: str | None = None


@dataclass(frozen=True)
class ObjectPlan:
    """What adopting one object does; `changes` are field paths whose value changes;
    `restarts` the pods that would restart for it."""

    kind: str
    name: str
    namespace: str
    verdict: Verdict
    reason: str = ""
    changes: tuple[str, ...] = ()
    rolls: bool = False
    pods_kept: bool = True
    restarts: tuple[str, ...] = ()

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
    def restarts(self) -> tuple[str, ...]:
        """Every pod that would restart, sorted."""
        return tuple(sorted({pod for o in self.objects for pod in o.restarts}))

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


def _pods_of(obj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    uid = (obj.get("metadata") or {}).get("uid")
    if not uid:
        return ()
    return tuple(
        sorted(
            str((p.get("metadata") or {}).get("name"))
            for p in pods
            if any(
                o.get("uid") == uid for o in (p.get("metadata") or {}).get("ownerReferences") or []
            )
        )
    )


def content_changes(live: Any, result: Any, path: str = "", name: str | None = None) -> list[str]:
    """Paths where `result` (what the API server would store) differs from `live`: content,
    labels, annotations (our bookkeeping left out) and owner references; not status."""
    if not path:
        found: list[str] = []
        for key in sorted({*(live or {}), *(result or {})}):
            if key in takeover.NOT_CONTENT:
                continue
            found += content_changes(live.get(key), result.get(key), key, key)
        old_meta, new_meta = live.get("metadata") or {}, result.get("metadata") or {}
        for field_name in ("labels", "annotations"):
            before, after = old_meta.get(field_name) or {}, new_meta.get(field_name) or {}
            for k in sorted({*before, *after}):
                where = f"metadata.{field_name}[{k}]"
                if before.get(k) != after.get(k) and where not in BOOKKEEPING:
                    found.append(where)
        if old_meta.get("ownerReferences") != new_meta.get("ownerReferences"):
            found.append("metadata.ownerReferences")
        return found
    if isinstance(live, Mapping) and isinstance(result, Mapping):
        found = []
        for key in sorted({*live, *result}):
            found += content_changes(live.get(key), result.get(key), f"{path}.{key}", key)
        return found
    if isinstance(live, list) and isinstance(result, list):
        keys = takeover.list_keys(name, [*live, *result])
        if keys is not None:

            def by_key(items: list[Any]) -> dict[str, Any]:
                return {_item_key(i, keys): i for i in items if isinstance(i, Mapping)}

            before, after = by_key(live), by_key(result)
            found = []
            for key in sorted({*before, *after}):
                found += content_changes(before.get(key), after.get(key), f"{path}[{key}]", name)
            if not found and [*before] != [*after]:
                found.append(f"{path} (order)")
            return found
    return [] if live == result else [path]


def _item_key(item: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    """A keyed list item's name in a path: its key values, defaulted ones left out
    (`ports[8080]`, `ports[53,UDP]`)."""
    values = [item.get(k, takeover.KEY_DEFAULTS.get(k)) for k in keys]
    shown = [str(v) for k, v in zip(keys, values, strict=True) if v != takeover.KEY_DEFAULTS.get(k)]
    return ",".join(shown or [str(v) for v in values])


def _template(obj: Mapping[str, Any]) -> Any:
    return (obj.get("spec") or {}).get("template")


def plan_object(
    desired: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    trial: Trial | None = None,
    pods: Sequence[Mapping[str, Any]] = (),
    *,
    auto_upgrade: bool = True,
) -> ObjectPlan:
    """The verdict for one desired object against its live namesake (None: not there), with the
    API server's answer to a dry run of the write where there is one; `pods` are the operand
    pods (the ones of a workload whose template changes restart)."""
    kind, namespace, name = _key(desired)
    if live is None:
        if trial is not None and trial.rejected:
            return ObjectPlan(
                kind, name, namespace, "blocked",
                f"the API server would refuse to create it: {trial.rejected}",
            )  # fmt: skip
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
            restarts=() if kept else _pods_of(live, pods),
        )  # fmt: skip
    if trial is not None and trial.rejected:
        return ObjectPlan(
            kind, name, namespace, "blocked",
            f"the API server would reject the write (the operator would retry it forever): "
            f"{trial.rejected}",
        )  # fmt: skip
    changes = tuple(differences(desired, live))
    if trial is not None and trial.result is not None:
        substantive = tuple(content_changes(live, trial.result))
        template_changed = kind in WORKLOADS and _template(trial.result) != _template(live)
    else:
        substantive = tuple(c for c in changes if c not in BOOKKEEPING)
        template_changed = kind in WORKLOADS and any(
            c.startswith("spec.template.") for c in substantive
        )
    if not substantive:
        why = "equal in substance" + ("; our bookkeeping added" if changes else "")
        return ObjectPlan(kind, name, namespace, "adopt", why, changes=changes)
    on_delete = _strategy(live) == "OnDelete"
    restarts: tuple[str, ...] = ()
    if not template_changed:
        reason = "patched in place; pods do not restart"
    elif on_delete and auto_upgrade:
        reason = (
            "pod template changes; OnDelete: the driver upgrade flow restarts its pods node by "
            "node (autoUpgrade is on)"
        )
        restarts = _pods_of(live, pods)
    elif on_delete:
        reason = (
            "pod template changes; OnDelete: running pods are kept until someone deletes them "
            "(autoUpgrade is off)"
        )
    else:
        reason = "pod template changes: pods roll once"
        restarts = _pods_of(live, pods)
    return ObjectPlan(
        kind, name, namespace, "patch", reason, changes=substantive, rolls=template_changed,
        pods_kept=not template_changed or on_delete, restarts=restarts,
    )  # fmt: skip


def plan(
    desired: Iterable[Mapping[str, Any]],
    live: Iterable[Mapping[str, Any]],
    *,
    policy_uid: str | None,
    trials: Mapping[tuple[str, str, str], Trial] | None = None,
    pods: Sequence[Mapping[str, Any]] = (),
    auto_upgrade: bool = True,
) -> AdoptionPlan:
    """Plan the takeover of `live` operand objects by the `desired` ones, as the operator writes
    them (owner reference and hash annotation set); `trials` hold the API server's dry-run
    answers by (kind, namespace, name), `pods` the operand pods, `auto_upgrade` the driver's
    upgrade policy (whether a changed OnDelete template restarts the driver pods).

    Live objects controlled by the ClusterPolicy that ours does not render are deleted by the
    operator's prune; other live objects are not ours and are left out of the plan."""
    by_key = {_key(obj): obj for obj in live}
    planned: list[ObjectPlan] = []
    seen: set[tuple[str, str, str]] = set()
    for obj in desired:
        key = _key(obj)
        seen.add(key)
        trial = (trials or {}).get(key)
        planned.append(plan_object(obj, by_key.get(key), trial, pods, auto_upgrade=auto_upgrade))
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
                restarts=_pods_of(obj, pods) if kind in WORKLOADS else (),
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
    "Trial",
    "Verdict",
    "content_changes",
    "differences",
    "owner_reference",
    "plan",
    "plan_object",
]
