"""Hand edits to the DaemonSets we render: which of our fields differ on the live object, what
someone added that must go, and who did it (from `metadata.managedFields`).

Our hash annotation only says what we last applied; an edit such as `kubectl set image` leaves it
alone (upstream compares only that annotation, so it never notices). The cache keeps a view of
each live DaemonSet's spec (its pod template and the strategy fields; `view`), and `differences`
compares it with what we render. The rule:

* **What we render is ours, and the live object must hold it**: every field we render is present
  and equal, at any depth. Fields the API server fills in (`terminationMessagePath`, a pull policy
  we do not set, `defaultMode`, probe timeouts, `protocol: TCP`, a `hostPort` under hostNetwork)
  are not ours and never compared, so defaulting cannot cause a revert loop. An empty value we
  render (`value: ""`, `{}`) equals a missing one, as the server drops those; quantities compare
  by amount (`1Gi` == `1024Mi`) and int-or-string fields by text (`8080` == `"8080"`).
* **Lists of named things match by key**, as strategic merge and server-side apply match them:
  containers, init containers, env and volumes by name, volumeMounts by mountPath, ports by
  containerPort. Every other list (command, args, tolerations, capabilities) is compared whole.
* **Additions are left alone unless they change security.** Server-side apply with our field
  manager (how we write) would keep a field another manager added; upstream, when its hash
  differs, replaces the whole object and so drops every addition. Keeping them is right for
  harmless additions (an annotation from `kubectl rollout restart`, resources where we set none,
  a toleration's extra seconds), and wrong where the addition changes what runs, with which
  privileges, or what it reaches. So an addition is removed when it is: a container or init
  container, a volume or a volume source, a volumeMount or one of its fields, an env entry
  (`LD_PRELOAD`, `NVIDIA_VISIBLE_DEVICES`), `envFrom`, a port, a command, arguments or a working
  directory where we set none, a probe or lifecycle handler (an exec handler runs a command in a
  privileged container), anything in a pod or container securityContext (`privileged`,
  capabilities, `runAsUser: 0`), `hostPID`/`hostNetwork`/`hostIPC`/`shareProcessNamespace`,
  the service account or its token, the runtime class, or a key in nodeSelector or affinity
  (which narrow where the operand runs, so the status would lie). A `false` or empty addition
  is harmless and stays (`privileged: false`).

Changed values are restored by our usual server-side apply (force). Additions cannot be: apply
never removes what another manager owns, so the controller first sends one JSON patch
(`restore_patch`) that tests the resourceVersion it judged, removes the additions and writes
our values back, then applies as usual. Pure functions: no client code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

CONTAINER_LISTS = ("initContainers", "containers")
# DaemonSet spec fields we render besides the template (the selector is handled elsewhere: it
# is immutable, and a changed one replaces the DaemonSet, kube/writer.py).
SPEC_FIELDS = ("updateStrategy", "minReadySeconds", "revisionHistoryLimit", "template")

# The merge key of each list of named things in a pod template (strategic merge's patchMergeKey;
# server-side apply's list-map keys, where ports add the protocol the server defaults).
KEYED = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resizePolicy": "resourceName",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "topologySpreadConstraints": "topologyKey",
}

# Where an addition is removed (see the module docstring): per place in the pod spec (field
# names from the pod spec down, list keys left out), the fields that may not be added; ALL:
# none may be added there; subtrees under STRICT accept no addition at any depth.
ALL = frozenset({"*"})
_POD_GUARDED = frozenset({
    "containers", "initContainers", "volumes", "securityContext", "hostPID", "hostNetwork",
    "hostIPC", "shareProcessNamespace", "hostUsers", "serviceAccountName", "serviceAccount",
    "automountServiceAccountToken", "runtimeClassName", "nodeSelector", "affinity",
})  # fmt: skip
_CONTAINER_GUARDED = frozenset({
    "command", "args", "workingDir", "env", "envFrom", "volumeMounts", "volumeDevices", "ports",
    "securityContext", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe",
})  # fmt: skip
_HANDLERS = frozenset({"exec", "httpGet", "tcpSocket", "grpc", "sleep"})
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
STRICT = frozenset({"securityContext", "nodeSelector", "affinity"})

# Fields whose zero value the server drops (plain Go fields with omitempty): a rendered `false`
# or 0 there equals a missing one. Pointer fields (`privileged`, `runAsUser`) keep their zero.
_OMITTED_ZERO = frozenset({
    "hostPID", "hostNetwork", "hostIPC", "stdin", "stdinOnce", "tty", "readOnly", "hostPort",
    "initialDelaySeconds", "minReadySeconds",
})  # fmt: skip
# int-or-string fields in a pod template and a DaemonSet's update strategy.
_INT_OR_STRING = frozenset({"port", "maxUnavailable", "maxSurge"})
# Maps of resource quantities, and single quantity fields.
_QUANTITY_MAPS = frozenset({"limits", "requests"})
_QUANTITY_FIELDS = frozenset({"sizeLimit"})

View = dict[str, Any]


class Change(NamedTuple):
    """One difference: where (a readable path and a JSON pointer), the live value, ours (None
    for an addition to remove), and whether it is such an addition."""

    path: str
    live: Any
    want: Any
    pointer: str
    added: bool = False


def view(workload: Mapping[str, Any]) -> View:
    """The part of a live workload the comparison reads: its spec without the selector (the pod
    template and the update strategy fields). Pods are never viewed, only ~17 DaemonSets."""
    spec = workload.get("spec")
    if not isinstance(spec, Mapping):
        return {}
    return {"spec": {k: spec[k] for k in SPEC_FIELDS if k in spec}}


def differences(desired: View, live: View | None) -> list[Change]:
    """Every rendered field the live object lacks or holds differently, and every addition that
    changes security (module docstring). Nothing without a live view."""
    if live is None:
        return []
    found: list[Change] = []
    _compare(desired.get("spec") or {}, live.get("spec") or {}, ("spec",), "/spec", found)
    return found


def restore_patch(changes: Iterable[Change], resource_version: str) -> list[dict[str, Any]] | None:
    """A JSON patch that restores the live object the changes were found on: it tests that
    object's resourceVersion (a newer one fails the patch with 409/422, and the next pass judges
    again), writes our values back and removes the additions. None when nothing was added:
    server-side apply restores changed values by itself.

    Values are written and missing list entries appended first, while the indices they name
    still hold (an append shifts nothing); removals follow from the highest index down, so no
    removal shifts another."""
    changes = list(changes)
    if not any(c.added for c in changes):
        return None
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    ]
    ops += [{"op": "add", "path": c.pointer, "value": c.want} for c in changes if not c.added]
    removals = sorted((c.pointer for c in changes if c.added), key=_pointer_order, reverse=True)
    ops += [{"op": "remove", "path": p} for p in removals]
    return ops


def _pointer_order(pointer: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in pointer.split("/"))


# ----- the comparison -----------------------------------------------------------------------


def _compare(
    want: Any, have: Any, path: tuple[str, ...], pointer: str, found: list[Change]
) -> None:
    if _equal_leaf(want, have, path):
        return
    if isinstance(want, dict) and isinstance(have, dict):
        _compare_dict(want, have, path, pointer, found)
    elif isinstance(want, list) and isinstance(have, list):
        list_key = KEYED.get(path[-1])
        if list_key is not None and all(isinstance(i, dict) and list_key in i for i in want):
            _compare_keyed(want, have, list_key, path, pointer, found)
        elif len(want) != len(have) or any(
            _differs(w, h, (*path, "[]")) for w, h in zip(want, have, strict=False)
        ):
            found.append(Change(_text(path), have, want, pointer))
    else:
        found.append(Change(_text(path), have, want, pointer))


def _compare_dict(
    want: dict[str, Any],
    have: dict[str, Any],
    path: tuple[str, ...],
    pointer: str,
    found: list[Change],
) -> None:
    for key, value in want.items():
        _compare(value, have.get(key), (*path, key), f"{pointer}/{_escape(key)}", found)
    guarded = _guarded(path)
    for key, value in have.items():
        if key in want or not _harmful(value) or _defaulted(path, key, want):
            continue
        if guarded is ALL or key in guarded:
            at = (*path, key)
            found.append(Change(_text(at), value, None, f"{pointer}/{_escape(key)}", True))


def _compare_keyed(
    want: list[Any],
    have: list[Any],
    list_key: str,
    path: tuple[str, ...],
    pointer: str,
    found: list[Change],
) -> None:
    live = {
        _key_text(item.get(list_key)): index
        for index, item in enumerate(have)
        if isinstance(item, dict) and list_key in item
    }
    ours = set()
    for item in want:
        key = _key_text(item[list_key])
        ours.add(key)
        at = (*path[:-1], f"{path[-1]}[{list_key}={key}]")
        index = live.get(key)
        if index is None:
            found.append(Change(_text(at), None, item, f"{pointer}/-"))
        else:
            _compare(item, have[index], at, f"{pointer}/{index}", found)
    if not _guarded_list(path):
        return
    for key, index in live.items():
        if key not in ours:
            at = (*path[:-1], f"{path[-1]}[{list_key}={key}]")
            found.append(Change(_text(at), have[index], None, f"{pointer}/{index}", True))


def _differs(want: Any, have: Any, path: tuple[str, ...]) -> bool:
    found: list[Change] = []
    _compare(want, have, path, "", found)
    return bool(found)


def _equal_leaf(want: Any, have: Any, path: tuple[str, ...]) -> bool:
    field, parent = path[-1], path[-2] if len(path) > 1 else ""
    if _empty(want) and _empty(have):
        return True
    if (
        have is None
        and field in _OMITTED_ZERO
        and (want is False or (type(want) is int and want == 0))
    ):
        return True
    if isinstance(want, dict | list):
        return False
    if want == have and type(want) is type(have):
        return True
    if field in _INT_OR_STRING:
        return _int_or_string(want) is not None and _int_or_string(want) == _int_or_string(have)
    if field in _QUANTITY_FIELDS or (
        parent in _QUANTITY_MAPS and len(path) > 2 and path[-3] == "resources"
    ):
        ours = amount(want)
        return ours is not None and ours == amount(have)
    return False


def _empty(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, dict | list) and not value)


def _harmful(value: Any) -> bool:
    """Whether an added value can change anything: `false` and empty values cannot."""
    return not (_empty(value) or value is False)


def _pod_names(path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The field names below `spec.template.spec` (list keys left out); None outside it."""
    if path[:3] != ("spec", "template", "spec"):
        return None
    return tuple(p.split("[", 1)[0] for p in path[3:] if p != "[]")


def _in_container(names: tuple[str, ...]) -> bool:
    return bool(names) and names[0] in (*CONTAINER_LISTS, "ephemeralContainers")


def _guarded(path: tuple[str, ...]) -> frozenset[str]:
    """The fields that may not be added to the dict at `path` (ALL: none may)."""
    if path == ("spec", "updateStrategy"):
        return frozenset({"rollingUpdate"})  # unless the rendered type gets it (_defaulted)
    names = _pod_names(path)
    if names is None:
        return frozenset()
    # securityContext, nodeSelector and affinity, of the pod or of a container: all ours.
    if (names[:1] and names[0] in STRICT) or (
        _in_container(names) and names[1:2] and names[1] in STRICT
    ):
        return ALL
    if not names:
        return _POD_GUARDED
    if _in_container(names):
        inner = names[1:]
        if not inner:
            return _CONTAINER_GUARDED
        if inner == ("volumeMounts",):
            return ALL
        if len(inner) == 1 and inner[0] in _PROBES:
            return _HANDLERS
        if inner == ("lifecycle",):
            return frozenset({"postStart", "preStop"})
        if len(inner) == 2 and inner[0] == "lifecycle":
            return _HANDLERS
        return frozenset()
    return ALL if names == ("volumes",) else frozenset()


def _guarded_list(path: tuple[str, ...]) -> bool:
    """Whether extra entries of the keyed list at `path` are removed."""
    names = _pod_names(path)
    if names is None:
        return False
    if len(names) == 1:
        return names[0] in (*CONTAINER_LISTS, "volumes")
    return len(names) == 2 and _in_container(names) and names[1] in _CONTAINER_LISTS_GUARDED


_CONTAINER_LISTS_GUARDED = frozenset({"env", "volumeMounts", "volumeDevices", "ports"})


def _defaulted(path: tuple[str, ...], key: str, want: Mapping[str, Any]) -> bool:
    """Additions the server makes itself at a guarded place."""
    if path == ("spec", "updateStrategy"):
        # A RollingUpdate strategy gets its parameters defaulted; OnDelete has none.
        return bool(want.get("type", "RollingUpdate") == "RollingUpdate")
    # The deprecated alias the server copies from serviceAccountName.
    return (
        _pod_names(path) == () and key == "serviceAccount" and bool(want.get("serviceAccountName"))
    )


# ----- values -------------------------------------------------------------------------------


def _int_or_string(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return str(value)


_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15,
                      "E": 18}  # fmt: skip
_BINARY_FACTORS = {s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}
_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(|[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)"
)


def amount(value: Any) -> Fraction | None:
    """The amount a resource quantity stands for (`"1Gi"`, `"500m"`, `2`, `"1e3"`); None when it
    is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if not isinstance(value, str):
        return Fraction(value)
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        return None
    number, suffix = Fraction(match.group(1)), match.group(2)
    if suffix in _BINARY_FACTORS:
        binary: int = _BINARY_FACTORS[suffix]
        return number * binary
    exponent = _DECIMAL_EXPONENTS.get(suffix)
    if exponent is None:  # the regular expression left only an exponent such as e3
        exponent = int(suffix[1:])
    factor: int = 10 ** abs(exponent)
    return number * factor if exponent >= 0 else number / factor


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _key_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _text(path: tuple[str, ...]) -> str:
    return ".".join(p for p in path if p != "[]")


# ----- who changed it -----------------------------------------------------------------------

# At most this many field paths are kept per other manager (a `kubectl replace` owns them all).
MAX_EDITOR_PATHS = 400


def editors(managed_fields: Any, ours: str) -> list[dict[str, Any]]:
    """The managedFields entries of other managers on the main resource (not the status),
    compacted to manager, operation, time and the spec field paths they own (in the notation
    of `Change.path`)."""
    out: list[dict[str, Any]] = []
    for entry in managed_fields if isinstance(managed_fields, list) else []:
        if not isinstance(entry, Mapping) or entry.get("subresource"):
            continue
        manager = str(entry.get("manager") or "")
        if not manager or manager == ours:
            continue
        spec = (entry.get("fieldsV1") or {}).get("f:spec")
        paths = list(_owned_paths(spec, ("spec",))) if isinstance(spec, Mapping) else []
        out.append(
            {
                "manager": manager,
                "operation": str(entry.get("operation") or ""),
                "time": str(entry.get("time") or ""),
                "paths": paths[:MAX_EDITOR_PATHS],
            }
        )
    return out


def _owned_paths(fields: Mapping[str, Any], path: tuple[str, ...]) -> Iterator[str]:
    """The leaves of a FieldsV1 set (and elements marked `.`) as readable paths."""
    if not fields or "." in fields:
        yield _text(path)
    for element, below in fields.items():
        if element == ".":
            continue
        kind, _, rest = element.partition(":")
        if kind == "f":
            step: tuple[str, ...] = (*path, rest)
        elif kind == "k":
            try:
                item = json.loads(rest)
            except ValueError:
                continue
            list_key = KEYED.get(path[-1])
            if isinstance(item, dict) and list_key in item:
                key = _key_text(item[list_key])
            else:
                key = ",".join(f"{k}={_key_text(v)}" for k, v in sorted(dict(item).items()))
            step = (*path[:-1], f"{path[-1]}[{list_key or 'key'}={key}]")
        else:  # a set member or an index: the list as a whole
            step = path
        if isinstance(below, Mapping):
            yield from _owned_paths(below, step)


def who_changed(path: str, found: list[dict[str, Any]]) -> str:
    """The manager most likely behind a changed field: the latest one owning that field (or a
    field under or above it), else the latest other manager; "" when the server recorded none."""

    def related(owned: str) -> bool:
        return any(
            a == b or a.startswith((b + ".", b + "[")) for a, b in ((owned, path), (path, owned))
        )

    touching = [e for e in found if any(related(p) for p in e.get("paths") or ())]
    candidates = touching or found
    if not candidates:
        return ""
    latest = max(candidates, key=lambda e: e["time"])
    return str(latest["manager"])


def message(kind_name: str, changes: list[Change], manager: str) -> str:
    """The Event text for restoring hand-edited fields (the first five changes)."""
    by = f" by {manager}" if manager else ""
    parts = [
        f"{c.path} was added ({_short(c.live)}), removed"
        if c.added
        else f"{c.path} was {_short(c.live)}, restored to {_short(c.want)}"
        for c in changes
    ]
    more = f"; and {len(parts) - 5} more" if len(parts) > 5 else ""
    return f"{kind_name}: fields we own were changed{by}; " + "; ".join(parts[:5]) + more


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."
