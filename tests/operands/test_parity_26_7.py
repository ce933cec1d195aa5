"""Render parity with NVIDIA's GPU Operator 26.7, state by state, on real data.

`../shared/reference/upstream-objects-26.7/` (next to the repository; see its README.md) holds the
objects NVIDIA's 26.7 operator wrote for the ClusterPolicy its chart renders by default, on the
nodes in `nodes.yaml`. We render the same policy on the same nodes with the planners
`gpu-operator render` and `adopt` use, default our objects as the API server would, flatten both
sides to `path -> value` and compare. Every difference must be listed in ALLOWED (deliberate, with
a reason; docs/operands.md "Differences from NVIDIA's 26.7 render" says the same); an entry that
no longer occurs fails too, so the list cannot rot. The module is skipped without the reference.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import api
from gpu_operator.api import keys
from gpu_operator.cli.render import DEFAULT_OPERATOR_ENV
from gpu_operator.controller import facts as facts_mod
from gpu_operator.nodes import labelling
from gpu_operator.operands import registry
from kubesim import defaults, resources

REFERENCE = Path(__file__).resolve().parents[3] / "shared/reference/upstream-objects-26.7"
pytestmark = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason=f"no upstream reference objects at {REFERENCE}"
)

Obj = dict[str, Any]
# Files that are not objects the operator wrote, or not compared here.
NOT_OBJECTS = ("clusterpolicy.yaml", "nodes.yaml", "sample-pods.yaml", "pods-summary.yaml")
# Written by the API server (or, for the hash and state label, each operator's bookkeeping).
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
SERVICE_ALLOCATED = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy")
# Lists of objects are keyed by the first of these fields their items have.
LIST_KEYS = ("name", "mountPath", "containerPort", "port")
# The node labels and annotations the labeller decides (the upgrade state is the upgrade flow's).
LABELLER_KEYS = (keys.GPU_PRESENT, keys.MIG_CONFIG, keys.UPGRADE_ENABLED)


@dataclass(frozen=True)
class Allowed:
    """A deliberate difference: `path` is `Kind/name:field.path` (a trailing `*` matches any
    rest), or `Kind/name` for an object only one side has."""

    state: str
    path: str
    reason: str

    def matches(self, state: str, path: str) -> bool:
        if state != self.state:
            return False
        if self.path.endswith("*"):
            return path.startswith(self.path[:-1])
        return path == self.path


TOOLKIT = "state-container-toolkit"
SCC_ANNOTATION = "metadata.annotations.openshift.io/scc"
ALLOWED: tuple[Allowed, ...] = (
    # OpenShift is out of scope: no SCCs, so no annotation naming one.
    *(
        Allowed(state, f"DaemonSet/{ds}:{SCC_ANNOTATION}",
                "OpenShift is out of scope (no SCCs); adoption keeps upstream's annotation")
        for state, ds in (
            (TOOLKIT, "nvidia-container-toolkit-daemonset"),
            ("state-dcgm-exporter", "nvidia-dcgm-exporter"),
            ("state-device-plugin", "nvidia-device-plugin-daemonset"),
            ("state-mps-control-daemon", "nvidia-device-plugin-mps-control-daemon"),
            ("state-driver", "nvidia-driver-daemonset"),
        )
    ),
    # RBAC: upstream's rules, plus what our node agents do, minus two over-grants.
    Allowed(TOOLKIT, "ClusterRole/nvidia-container-toolkit",
            "ours: the toolkit reads its Node to record config drift and restores as Events"),
    Allowed(TOOLKIT, "ClusterRoleBinding/nvidia-container-toolkit",
            "binds the ClusterRole above to the toolkit's account"),
    Allowed(TOOLKIT, "Role/nvidia-container-toolkit:rules[core/events].create",
            "ours: the toolkit's Node Events"),
    Allowed("state-device-plugin", "Role/nvidia-device-plugin:rules[core/events].create",
            "ours: device health and config-manager Events on the Node (also the MPS daemon's)"),
    Allowed("state-driver", "Role/nvidia-driver:rules[core/configmaps].*",
            "ours: the driver manager reads ConfigMaps in the operator namespace"),
    Allowed("state-driver", "Role/nvidia-driver:rules[core/secrets].*",
            "ours: the driver manager reads Secrets in the operator namespace"),
    Allowed("state-driver", "Role/nvidia-driver:rules[core/events].create",
            "ours: the driver manager records its decisions as Events on the Node"),
    Allowed("gpu-feature-discovery",
            "Role/nvidia-gpu-feature-discovery:rules[nfd.k8s-sigs.io/nodefeatures].*",
            "ours: GFD also patches and deletes its NodeFeature"),
    Allowed("gpu-feature-discovery", "Role/nvidia-gpu-feature-discovery:rules[core/events].create",
            "ours: the config manager's Events"),
    Allowed("state-mig-manager", "Role/nvidia-mig-manager:rules[core/configmaps].*",
            "ours: the manager also watches and deletes the `<node>-mig-config` it publishes"),
    Allowed("state-mig-manager", "Role/nvidia-mig-manager:rules[core/events].create",
            "ours: the MIG manager's Events"),
    Allowed("state-operator-validation",
            "ClusterRole/nvidia-operator-validator:rules[nvidia.com/*",
            "finalizers: `update` only, the one verb the API server checks (upstream: every verb)"),
)  # fmt: skip


# --- loading and rendering ---------------------------------------------------------------------


def load(name: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((REFERENCE / name).read_text()) if d]


def reference_nodes() -> list[Obj]:
    nodes = yaml.safe_load((REFERENCE / "nodes.yaml").read_text())
    return [
        {
            "metadata": {
                "name": name,
                "labels": dict(node.get("labels") or {}),
                "annotations": dict(node.get("annotations") or {}),
            }
        }
        for name, node in nodes.items()
    ]


def reference_objects() -> dict[str, Obj]:
    """The objects NVIDIA's operator wrote: those its ClusterPolicy controls, by `Kind/name`."""
    found = {}
    for path in sorted(REFERENCE.glob("*.yaml")):
        if path.name in NOT_OBJECTS:
            continue
        for obj in load(path.name):
            if any(
                o.get("kind") == "ClusterPolicy"
                for o in obj["metadata"].get("ownerReferences") or []
            ):
                found[f"{obj['kind']}/{obj['metadata']['name']}"] = obj
    return found


def image_of(objects: Mapping[str, Obj], ds: str, container: str) -> str:
    spec = objects[f"DaemonSet/{ds}"]["spec"]["template"]["spec"]
    return next(
        str(c["image"])
        for c in [*spec.get("initContainers", []), *spec["containers"]]
        if c["name"] == container
    )


def policy() -> api.ClusterPolicy:
    checked = api.check_document(load("clusterpolicy.yaml")[0])
    assert checked.ok, checked.errors
    assert isinstance(checked.obj, api.ClusterPolicy)
    return checked.obj


def rendered(theirs: Mapping[str, Obj]) -> dict[str, tuple[str, Obj]]:
    """Our objects for the reference policy and nodes, by `Kind/name`, with their state."""
    # As the reference operator ran: the chart's driver manager, the validator it was built as.
    manager = image_of(theirs, "nvidia-driver-daemonset", "k8s-driver-manager")
    validator = image_of(theirs, "nvidia-operator-validator", "nvidia-operator-validator")
    operator_env = {
        **DEFAULT_OPERATOR_ENV,
        "DRIVER_MANAGER_IMAGE": manager,
        "VALIDATOR_IMAGE": validator,
    }
    facts = facts_mod.from_nodes(
        reference_nodes(),
        namespace="gpu-operator",
        operator_env=operator_env,
        has_servicemonitor_crd=True,  # the reference cluster had the CRD: it holds monitors
        has_prometheusrule_crd=False,
    )
    found = {}
    for state in registry.render_all(policy(), facts):
        assert state.error is None, state.error
        for obj in state.objects:
            found[f"{obj['kind']}/{obj['metadata']['name']}"] = (state.name, obj)
    return found


# --- normalising and flattening ----------------------------------------------------------------


def as_stored(obj: Obj) -> Obj:
    """Our object as the API server stores it (its create defaults)."""
    stored = copy.deepcopy(obj)
    kind = next((rt for rt in resources.BUILTINS if rt.kind == obj["kind"]), None)
    if kind is not None:
        defaults.apply_create_defaults(kind, stored)
    if stored["kind"] == "Service":
        stored["spec"].setdefault("internalTrafficPolicy", "Cluster")
    return stored


def comparable(obj: Obj) -> Obj:
    """What is compared: no server-written fields, bookkeeping, ownership or status; ConfigMaps
    by their keys; RBAC rules as one entry per (group, resource, names) with its verbs."""
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    meta = obj["metadata"]
    for name in (*SERVER_FIELDS, "ownerReferences"):
        meta.pop(name, None)
    (meta.get("annotations") or {}).pop(keys.LAST_APPLIED_HASH, None)
    (meta.get("labels") or {}).pop(keys.OPERATOR_STATE_LABEL, None)
    for name in ("annotations", "labels"):
        if not meta.get(name):
            meta.pop(name, None)
    if obj["kind"] == "Service":
        for name in SERVICE_ALLOCATED:
            obj["spec"].pop(name, None)
    if obj["kind"] == "ConfigMap":
        obj["data"] = sorted([*(obj.get("data") or {}), *(obj.get("binaryData") or {})])
        obj.pop("binaryData", None)
    if "rules" in obj:
        obj["rules"] = rule_atoms(obj["rules"])
    return obj


def rule_atoms(rules: Iterable[Obj]) -> dict[str, dict[str, bool]]:
    """Rules as `[<group>/<resource>(<names>)] -> {verb: True}`, so the paths read
    `rules[apps/daemonsets].list` however either side groups its rules."""
    atoms: dict[str, dict[str, bool]] = {}
    for rule in rules:
        names = ",".join(sorted(rule.get("resourceNames") or []))
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                key = f"[{group or 'core'}/{resource}" + (f"({names})" if names else "") + "]"
                for verb in rule.get("verbs") or []:
                    atoms.setdefault(key, {})[verb] = True
    return atoms


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """`path -> leaf`; keyed lists become `[key]` items plus an `#order` entry (order matters:
    a reordered pod template is a different template)."""
    if isinstance(value, Mapping) and value:
        found: dict[str, Any] = {}
        for name, item in value.items():
            joined = f"{path}{name}" if str(name).startswith("[") else f"{path}.{name}"
            found.update(flatten(item, joined if path else str(name)))
        return found
    if isinstance(value, list) and value and all(isinstance(i, Mapping) for i in value):
        key = next((k for k in LIST_KEYS if all(k in i for i in value)), None)
        if key is not None:
            found = {f"{path}#order": [i[key] for i in value]}
            for item in value:
                found.update(flatten(item, f"{path}[{item[key]}]"))
            return found
    return {path: value}


def differences(
    ours: Mapping[str, tuple[str, Obj]], theirs: Mapping[str, Obj]
) -> list[tuple[str, str, str]]:
    """(state, path, what differs) for every difference between the two renders."""
    found = []
    for ref in sorted(set(ours) | set(theirs)):
        state = ours[ref][0] if ref in ours else "-"
        if ref not in theirs or ref not in ours:
            side = "ours only" if ref in ours else "upstream's only"
            found.append((state, ref, side))
            continue
        mine = flatten(comparable(as_stored(ours[ref][1])))
        other = flatten(comparable(theirs[ref]))
        for path in sorted(set(mine) | set(other)):
            a, b = mine.get(path, "<absent>"), other.get(path, "<absent>")
            if a != b:
                found.append(
                    (state, f"{ref}:{path}", f"ours {json.dumps(a)} upstream {json.dumps(b)}")
                )
    return found


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def found() -> list[tuple[str, str, str]]:
    theirs = reference_objects()
    return differences(rendered(theirs), theirs)


def test_every_difference_from_nvidias_render_is_deliberate(
    found: list[tuple[str, str, str]],
) -> None:
    unexpected = [
        f"{state} {path}: {what}"
        for state, path, what in found
        if not any(a.matches(state, path) for a in ALLOWED)
    ]
    assert not unexpected, "differences from NVIDIA's 26.7 render:\n" + "\n".join(unexpected)


def test_every_allowed_difference_still_occurs(found: list[tuple[str, str, str]]) -> None:
    stale = [
        f"{a.state} {a.path}"
        for a in ALLOWED
        if not any(a.matches(state, path) for state, path, _ in found)
    ]
    assert not stale, "allowed differences that no longer occur (remove them):\n" + "\n".join(stale)


def test_the_reference_objects_are_all_compared() -> None:
    # A guard against comparing nothing: every DaemonSet NVIDIA wrote is one we render.
    theirs = {r for r in reference_objects() if r.startswith("DaemonSet/")}
    assert len(theirs) == 8
    assert theirs <= set(rendered(reference_objects()))


def test_node_labels_our_labeller_sets_equal_nvidias() -> None:
    label_policy = labelling.LabelPolicy.from_policy(policy())
    for node in reference_nodes():
        labels, annotations = node["metadata"]["labels"], node["metadata"]["annotations"]

        def decided(items: Mapping[str, str]) -> dict[str, str]:
            return {
                k: v
                for k, v in items.items()
                if k.startswith(keys.DEPLOY_PREFIX) or k in LABELLER_KEYS
            }

        # The node before any operator touched it: what NFD (and GFD) put there.
        before = {k: v for k, v in labels.items() if k not in decided(labels)}
        before_annotations = {k: v for k, v in annotations.items() if k not in LABELLER_KEYS}
        plan = labelling.plan_node(before, before_annotations, label_policy)
        after = {**before, **plan.labels}
        after_annotations = {**before_annotations, **plan.annotations}
        name = node["metadata"]["name"]
        assert decided(after) == decided(labels), name
        assert decided(after_annotations) == decided(annotations), name
