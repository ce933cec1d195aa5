"""NVIDIADriver pools (reference §2): which nodes each driver owns, its pools, their DaemonSets.

Pure: the NVIDIADriver objects, the GPU nodes' labels, the active ClusterPolicy and the cluster
facts in; per driver the DaemonSets it wants, the ones to leave alone, and what is wrong out. The
controller (controller/nvidiadriver.py) applies the plan and writes status.

- Ownership is nodes/ownership.py; a node belongs to at most one driver.
- A driver's nodes form pools by OS (`<ID><VERSION_ID>`, as the driver image tag) and, with
  precompiled drivers, by kernel; each pool gets one OnDelete DaemonSet that selects its nodes by
  the owner label plus the pool's NFD labels.
- A pool's DaemonSet is rendered by the ClusterPolicy's driver renderer (operands/driver.py) from
  a ClusterPolicy whose driver section is the NVIDIADriver's spec. A pool whose NVIDIADriver says
  what the ClusterPolicy said therefore gets the same pod, which is what lets the hand-over from
  the ClusterPolicy keep running driver pods (see `fingerprint`).
- Each pool's driver version is checked against its nodes' GPUs (operands/driver_support.py); a
  pool that fails keeps whatever runs there and gets no new or changed DaemonSet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_operator import api
from gpu_operator.api import clusterpolicy as cp_api
from gpu_operator.api import images, keys
from gpu_operator.api.core_types import Toleration
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec
from gpu_operator.nodes import labelling, ownership
from gpu_operator.operands import common, driver, driver_digest, driver_support, nvidiadriver_digest
from gpu_operator.operands.facts import ClusterFacts

Obj = dict[str, Any]

STATE = driver.NAME
COMPONENT = driver.COMPONENT
VGPU_MANAGER_COMPONENT = "nvidia-vgpu-manager"
GROUP_VERSION = "nvidia.com/v1alpha1"
KIND = "NVIDIADriver"
DEFAULT_PRIORITY_CLASS = "system-node-critical"
REVISION_HASH_LABEL = "controller-revision-hash"
TEMPLATE_GENERATION_LABEL = "pod-template-generation"
# One ServiceAccount and RBAC per driver type, shared by every pool of that type: the chart's
# least-privilege RBAC can only name fixed objects (upstream names them per NVIDIADriver and OS).
ACCOUNTS = {"gpu": "nvidia-gpu-driver", "vgpu": "nvidia-vgpu-driver"}
SUPPORTED_TYPES = tuple(ACCOUNTS)
# Pod fields that decide where and as whom a pod runs, not what runs: a driver pod that differs
# from a pool's template only here runs the same driver and needs no restart.
_PLACEMENT_FIELDS = frozenset({
    "nodeSelector", "affinity", "tolerations", "priorityClassName", "priority",
    "serviceAccountName", "serviceAccount", "schedulerName", "preemptionPolicy",
})  # fmt: skip
# User labels that carry selector or ownership meaning and are not copied onto driver pods.
_RESERVED_LABEL_PREFIX = "app.kubernetes.io/"

Mode = Literal["active", "disabled", "no-policy"]


# ----- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriverInput:
    """One NVIDIADriver object: its identity, its spec when it could be read, and its problems."""

    name: str
    uid: str
    spec: NVIDIADriverSpec | None
    problems: tuple[str, ...] = ()
    generation: int | None = None
    deleting: bool = False

    @property
    def valid(self) -> bool:
        return self.spec is not None and not self.problems

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> DriverInput:
        """Read and check an NVIDIADriver as the API returned it."""
        meta = obj.get("metadata") or {}
        checked = api.check_document(dict(obj))
        spec = checked.obj.spec if isinstance(checked.obj, api.NVIDIADriver) else None
        problems = [str(p) for p in checked.errors]
        if spec is not None and spec.driverType not in SUPPORTED_TYPES:
            problems.append(
                f"spec.driverType: {spec.driverType!r} is not supported by this operator yet "
                f"(supported: {', '.join(SUPPORTED_TYPES)})"
            )
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            spec=spec,
            problems=tuple(problems),
            generation=meta.get("generation"),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    def selector(self) -> ownership.DriverSelector:
        spec = self.spec
        policy = spec.upgradePolicy if spec else None
        return ownership.DriverSelector(
            name=self.name,
            default=bool(spec and spec.default),
            selector=dict(spec.nodeSelector or {}) if spec else None,
            # Upstream: a missing upgrade policy means auto-upgrade on.
            auto_upgrade=True if policy is None else bool(policy.autoUpgrade),
            valid=self.valid,
        )


def drivers_of(inputs: Iterable[DriverInput]) -> ownership.Drivers:
    """Ownership's view of the live drivers (those being deleted own nothing)."""
    return ownership.Drivers(tuple(d.selector() for d in inputs if not d.deleting))


def mode_of(policy_present: bool, policy: api.ClusterPolicy | None) -> Mode:
    """Whether NVIDIADriver objects are in charge of the driver."""
    if not policy_present:
        return "no-policy"
    if policy is not None and policy.spec.driver.useNvidiaDriverCRD:
        return "active"
    return "disabled"


DISABLED_MESSAGE = "useNvidiaDriverCRD is not enabled in ClusterPolicy"
NO_POLICY_MESSAGE = (
    "no ClusterPolicy: NVIDIADriver objects take effect through a ClusterPolicy with "
    "spec.driver.useNvidiaDriverCRD: true, which labels the GPU nodes"
)


def refused_policy_message(policy: str) -> str:
    """NVIDIADriver's status while the GPUCluster refuses the (newer) ClusterPolicy."""
    return (
        f"no ClusterPolicy in charge: ClusterPolicy {policy} is refused because an older "
        "GPUCluster runs the cluster (see its status); NVIDIADriver objects take effect through "
        "a ClusterPolicy in charge with spec.driver.useNvidiaDriverCRD: true"
    )


# ----- pools -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """Nodes of one driver that share an OS (and kernel, with precompiled drivers)."""

    os_id: str
    os_version_id: str
    os_tag: str
    selector: tuple[tuple[str, str], ...]
    kernel: str | None
    nodes: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.os_tag + (f"/{self.kernel}" if self.kernel else "")


def pools_of(
    nodes: Iterable[tuple[str, Mapping[str, str]]], *, precompiled: bool
) -> tuple[list[Pool], list[str]]:
    """A driver's nodes grouped into pools, and the nodes that lack the NFD labels to place them."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    meta: dict[tuple[Any, ...], tuple[str, str, str, dict[str, str]]] = {}
    skipped: list[str] = []
    for name, labels in nodes:
        os_id = labels.get(keys.NFD_OS_ID)
        version = labels.get(keys.NFD_OS_VERSION_ID)
        kernel = labels.get(keys.NFD_KERNEL_FULL) if precompiled else None
        if not os_id or not version or (precompiled and not kernel):
            skipped.append(name)
            continue
        tag = images.os_tag(os_id, version)
        selector = {keys.NFD_OS_ID: os_id}
        if tag == f"{os_id}{version}":
            selector[keys.NFD_OS_VERSION_ID] = version
        else:
            # The tag keeps the major version only (rhel9): so does the pool's selector, on
            # NFD's major-version label.
            major = labels.get(keys.NFD_OS_VERSION_MAJOR)
            if major != version.split(".")[0]:
                skipped.append(name)
                continue
            selector[keys.NFD_OS_VERSION_MAJOR] = major
        if kernel:
            selector[keys.NFD_KERNEL_FULL] = kernel
        key = (tag, kernel)
        groups.setdefault(key, []).append(name)
        meta.setdefault(key, (os_id, version, tag, selector))
    pools = []
    for key in sorted(groups, key=lambda k: (k[0], k[1] or "")):
        os_id, version, tag, selector = meta[key]
        pools.append(
            Pool(
                os_id=os_id,
                os_version_id=version,
                os_tag=tag,
                selector=tuple(sorted(selector.items())),
                kernel=key[1],
                nodes=tuple(sorted(groups[key])),
            )
        )
    return pools, sorted(skipped)


def daemonset_name(driver_type: str, uid: str, pool: Pool) -> str:
    """`nvidia-<type>-driver-<os>-<hash>` as upstream, the hash over the driver's uid (and the
    kernel for precompiled pools), at most 63 characters."""
    seed = uid + (f"-{pool.kernel}" if pool.kernel else "")
    digest = hashlib.sha256(seed.encode()).hexdigest()[:8]
    prefix = f"nvidia-{driver_type}-driver-{pool.os_tag}"
    return f"{prefix[: 63 - 9].rstrip('-.')}-{digest}"


# ----- rendering -------------------------------------------------------------------------------


def image_path(spec: NVIDIADriverSpec) -> str:
    """The driver image from the NVIDIADriver alone (upstream takes no env fallback here)."""
    image = spec.image
    if not spec.version:
        return image  # a full reference; validation rejects a bare name without a version
    separator = "@" if spec.version.startswith("sha256:") else ":"
    base = f"{spec.repository.rstrip('/')}/{image}" if spec.repository else image
    return f"{base}{separator}{spec.version}"


def kernel_module_type(spec: NVIDIADriverSpec) -> str:
    return "open" if spec.useOpenKernelModules else spec.kernelModuleType


def _gpu_toleration() -> Toleration:
    return Toleration.model_validate(dict(common.GPU_TOLERATION))


def as_policy(policy: api.ClusterPolicy, spec: NVIDIADriverSpec) -> api.ClusterPolicy:
    """The ClusterPolicy the driver renderer should see for this NVIDIADriver: its driver, GDS and
    GDRCopy sections and its pod settings replace the policy's; host paths stay the policy's."""

    def dump(value: Any) -> Any:
        return value.to_dict() if value is not None else None

    driver_fields: dict[str, Any] = {
        "enabled": True,
        "usePrecompiled": spec.usePrecompiled,
        "useOpenKernelModules": spec.useOpenKernelModules,
        "kernelModuleType": spec.kernelModuleType,
        "startupProbe": dump(spec.startupProbe),
        "livenessProbe": dump(spec.livenessProbe),
        "readinessProbe": dump(spec.readinessProbe),
        "rdma": dump(spec.rdma),
        "manager": dump(spec.manager),
        "imagePullPolicy": spec.imagePullPolicy,
        "imagePullSecrets": spec.imagePullSecrets,
        "resources": dump(spec.resources),
        "args": spec.args,
        "env": [e.to_dict() for e in spec.env] if spec.env else None,
        "secretEnv": spec.secretEnv,
    }
    if spec.repoConfig and spec.repoConfig.name:
        driver_fields["repoConfig"] = {"configMapName": spec.repoConfig.name}
    if spec.certConfig and spec.certConfig.name:
        driver_fields["certConfig"] = {"name": spec.certConfig.name}
    if spec.kernelModuleConfig and spec.kernelModuleConfig.name:
        driver_fields["kernelModuleConfig"] = {"name": spec.kernelModuleConfig.name}
    if spec.virtualTopologyConfig and spec.virtualTopologyConfig.name:
        driver_fields["virtualTopology"] = {"config": spec.virtualTopologyConfig.name}
    licensing = spec.licensingConfig
    if licensing and (licensing.secretName or licensing.name):
        driver_fields["licensingConfig"] = {
            "secretName": licensing.secretName,
            "configMapName": None if licensing.secretName else licensing.name,
            # Upstream: unset means NLS on for NVIDIADriver (off for ClusterPolicy).
            "nlsEnabled": True if licensing.nlsEnabled is None else licensing.nlsEnabled,
        }
    new_driver = cp_api.DriverSpec.model_validate(
        {k: v for k, v in driver_fields.items() if v is not None}
    )
    user_labels = {
        k: v
        for k, v in (spec.labels or {}).items()
        if k != "app" and not k.startswith(_RESERVED_LABEL_PREFIX)
    }
    daemonsets = cp_api.DaemonsetsSpec(
        labels=user_labels or None,
        annotations=dict(spec.annotations) if spec.annotations else None,
        tolerations=[_gpu_toleration(), *(spec.tolerations or [])],
        priorityClassName=spec.priorityClassName or DEFAULT_PRIORITY_CLASS,
        podSecurityContext=spec.podSecurityContext,
        updateStrategy="OnDelete",
    )
    new_spec = policy.spec.model_copy(
        update={
            "driver": new_driver,
            "gds": spec.gds,
            "gdrcopy": spec.gdrcopy,
            "daemonsets": daemonsets,
        }
    )
    return policy.model_copy(update={"spec": new_spec})


def _owner_reference(item: DriverInput, *, controller: bool) -> Obj:
    ref: Obj = {"apiVersion": GROUP_VERSION, "kind": KIND, "name": item.name, "uid": item.uid}
    if controller:
        ref["controller"] = True
        ref["blockOwnerDeletion"] = True
    return ref


def render_pool(
    item: DriverInput, pool: Pool, policy: api.ClusterPolicy, facts: ClusterFacts
) -> Obj:
    """The DaemonSet of one pool (raises RenderError or ImageError when it cannot be rendered)."""
    spec = item.spec
    assert spec is not None
    name = daemonset_name(spec.driverType, item.uid, pool)
    pool_facts = dataclasses.replace(
        facts,
        os_id=pool.os_id,
        os_version_id=pool.os_version_id,
        kernels=(pool.kernel,) if pool.kernel else (),
    )
    path = image_path(spec)
    if pool.kernel:
        image = images.precompiled_driver_image(path, pool.kernel, pool.os_tag)
    else:
        image = images.driver_image(path, pool.os_tag)
    labels = {
        driver.COMPONENT_LABEL: COMPONENT,
        keys.NODE_OS_VERSION: pool.os_tag,
        keys.PRECOMPILED: "true" if pool.kernel else "false",
    }
    if pool.kernel:
        labels[f"{keys.PRECOMPILED}.kernel-version"] = driver.sanitize_kernel(pool.kernel)
    selector = {keys.DRIVER_OWNER: item.name, **dict(pool.selector)}
    ds = driver.daemonset(
        as_policy(policy, spec),
        pool_facts,
        name=name,
        image=image,
        precompiled=bool(pool.kernel),
        extra_selector=selector,
        labels=labels,
        service_account=ACCOUNTS[spec.driverType],
    )
    pod = common.pod_spec(ds)
    # Driver pods are replaced node by node through the upgrade flow, never rolled.
    ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    # A new driver pod must not start beside one that still runs (an orphan of the ClusterPolicy,
    # or another pool's): upstream's anti-affinity on the driver and vGPU manager components.
    pod["affinity"] = driver.anti_affinity([COMPONENT, VGPU_MANAGER_COMPONENT])
    if spec.hostNetwork:
        common.set_host_network(ds)
    ds["metadata"]["ownerReferences"] = [_owner_reference(item, controller=True)]
    _stamp_digest(ds, spec, pool, policy, facts)
    return ds


def _stamp_digest(
    ds: Obj, spec: NVIDIADriverSpec, pool: Pool, policy: api.ClusterPolicy, facts: ClusterFacts
) -> None:
    """Replace the ClusterPolicy-style digest with the one upstream gives NVIDIADriver pools
    (from the spec, not the pod), so that its pods and ours agree on the same driver."""
    configs = nvidiadriver_digest.pool_configs(
        spec,
        os_id=pool.os_id,
        precompiled=bool(pool.kernel),
        runtime=facts.runtime,
        config_map_keys=facts.config_map_keys,
    )
    host_paths = policy.spec.hostPaths
    state = nvidiadriver_digest.install_state(
        spec,
        common.pod_spec(ds),
        kernel=pool.kernel,
        host_root=host_paths.rootFS if host_paths is not None else "/",
        configs=configs,
    )
    digest = state.digest()
    for name in (driver.MANAGER_CTR, driver.DRIVER_CTR):
        target = common.find_container(ds, name)
        if target is not None:
            common.set_env(target, driver_digest.ENV_NAME, digest)


def render_accounts(drivers: Sequence[DriverInput], facts: ClusterFacts) -> list[Obj]:
    """The ServiceAccount and RBAC of each driver type in use, owned by every driver of that
    type (the garbage collector removes them with the last one)."""
    objects: list[Obj] = []
    for driver_type, account in ACCOUNTS.items():
        owners = [d for d in drivers if d.spec is not None and d.spec.driverType == driver_type]
        if not owners:
            continue
        refs = [_owner_reference(d, controller=False) for d in sorted(owners, key=lambda d: d.name)]
        for obj in driver.rbac(facts, account, STATE):
            obj["metadata"]["ownerReferences"] = refs
            objects.append(obj)
    owners = [d for d in drivers if d.spec is not None]
    if owners:
        # One startup probe script for every pool's driver container, as with a ClusterPolicy.
        probe = driver.startup_probe_config_map(facts, STATE)
        probe["metadata"]["ownerReferences"] = [
            _owner_reference(d, controller=False) for d in sorted(owners, key=lambda d: d.name)
        ]
        objects.append(probe)
    return objects


# ----- the hand-over from the ClusterPolicy ---------------------------------------------------


def fingerprint(template: Mapping[str, Any]) -> str:
    """What a pod of this template runs (its placement and identity left out), as a short hash.

    Two templates with the same fingerprint start the same containers with the same volumes, so a
    pod of one can be adopted by the other's DaemonSet without restarting the driver.
    `DRIVER_CONFIG_DIGEST` is left out: upstream computes it differently for ClusterPolicy and
    NVIDIADriver pods (from the pod, from the spec), so the same driver carries two numbers.
    """
    spec = template.get("spec") or {}
    content = {k: v for k, v in spec.items() if k not in _PLACEMENT_FIELDS}
    for key in ("initContainers", "containers"):
        if content.get(key):
            content[key] = [_without_digest(c) for c in content[key]]
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _without_digest(ctr: Mapping[str, Any]) -> dict[str, Any]:
    env = [e for e in ctr.get("env") or () if e.get("name") != driver_digest.ENV_NAME]
    return {**ctr, "env": env} if "env" in ctr else dict(ctr)


@dataclass(frozen=True)
class DriverPod:
    """A driver pod in the operator namespace, as the hand-over needs it."""

    name: str
    node: str
    app: str | None
    revision_hash: str | None
    owned: bool


@dataclass(frozen=True)
class Revision:
    """A ControllerRevision of a driver DaemonSet: its `app` label, hash, number and fingerprint."""

    app: str | None
    hash: str | None
    number: int
    fingerprint: str | None
    owner_uid: str | None


@dataclass(frozen=True)
class LivePool:
    """A pool's DaemonSet as it exists: name, uid, generation, template labels and newest
    revision (None until the DaemonSet controller has written one)."""

    name: str
    uid: str
    generation: int
    template_labels: Mapping[str, str]
    revision: Revision | None


@dataclass(frozen=True)
class Adoption:
    """Take over a running driver pod: the merge patch that makes it the pool DaemonSet's."""

    pod: str
    node: str
    daemonset: str
    patch: Obj


@dataclass(frozen=True)
class HandOver:
    """What to do with each node's orphaned driver pod."""

    adopt: list[Adoption] = field(default_factory=list)
    replace: list[str] = field(default_factory=list)  # nodes whose driver must be upgraded
    waiting: list[str] = field(default_factory=list)  # nodes whose pool DaemonSet is not ready


def plan_hand_over(
    orphans: Iterable[DriverPod],
    pool_of_node: Mapping[str, LivePool | None],
    revisions: Iterable[Revision],
) -> HandOver:
    """Per orphaned driver pod on a node that now belongs to a pool: adopt it when the pod it runs
    is the pool's pod (same fingerprint), else leave it to the upgrade flow to replace.

    The orphan's revision is found by its `app` label and revision hash among the revisions left
    behind by the ClusterPolicy's DaemonSet.
    """
    by_label: dict[tuple[str | None, str | None], Revision] = {
        (r.app, r.hash): r for r in revisions if r.hash
    }
    out = HandOver()
    for pod in sorted(orphans, key=lambda p: p.node):
        if pod.owned or not pod.node or pod.node not in pool_of_node:
            continue
        live = pool_of_node[pod.node]
        if live is None or live.revision is None or live.revision.fingerprint is None:
            out.waiting.append(pod.node)
            continue
        old = by_label.get((pod.app, pod.revision_hash))
        if old is None or old.fingerprint != live.revision.fingerprint:
            out.replace.append(pod.node)
            continue
        labels = {
            **dict(live.template_labels),
            REVISION_HASH_LABEL: str(live.revision.hash),
            TEMPLATE_GENERATION_LABEL: str(live.generation),
        }
        reference = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": live.name,
            "uid": live.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        patch = {"metadata": {"labels": labels, "ownerReferences": [reference]}}
        out.adopt.append(Adoption(pod.name, pod.node, live.name, patch))
    return out


# ----- the plan --------------------------------------------------------------------------------


@dataclass
class PoolPlan:
    """One pool: its DaemonSet name, nodes, and why it is held back (None: rolled out)."""

    pool: Pool
    daemonset: str
    blocked: str | None = None
    unchecked: int = 0


@dataclass
class DriverPlan:
    """What one NVIDIADriver wants and what is wrong with it.

    `problems` are (reason, message) pairs, most important first; `keep` names live DaemonSets to
    leave exactly as they are (a pool held back, a driver that cannot be read).
    """

    name: str
    uid: str
    generation: int | None
    nodes: list[str] = field(default_factory=list)
    pools: list[PoolPlan] = field(default_factory=list)
    daemonsets: list[Obj] = field(default_factory=list)
    keep_all: bool = False
    keep: set[str] = field(default_factory=set)
    problems: list[tuple[str, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """The whole NVIDIADriver picture for one pass."""

    mode: Mode
    drivers: dict[str, DriverPlan] = field(default_factory=dict)
    accounts: list[Obj] = field(default_factory=list)
    owners: dict[str, str | None] = field(default_factory=dict)


# Condition reasons (upstream's spellings, plus ours for what upstream does not check).
RECONCILE_FAILED = "ReconcileFailed"
CONFLICTING_NODE_SELECTOR = "ConflictingNodeSelector"
VERSION_UNSUPPORTED = "DriverVersionUnsupported"
INVALID_SPEC = "InvalidSpec"


def plan(
    mode: Mode,
    items: Sequence[DriverInput],
    nodes: Sequence[tuple[str, Mapping[str, str]]],
    policy: api.ClusterPolicy | None,
    facts: ClusterFacts,
) -> Plan:
    """Ownership, pools, version checks and DaemonSets for every live NVIDIADriver."""
    live = [d for d in items if not d.deleting]
    result = Plan(mode=mode)
    for item in live:
        result.drivers[item.name] = DriverPlan(item.name, item.uid, item.generation)
    if mode != "active" or policy is None:
        return result
    drivers = drivers_of(live)
    for name, message in drivers.problems().items():
        result.drivers[name].problems.append((RECONCILE_FAILED, message))
    owned: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
    for name, labels in nodes:
        if not labelling.has_gpu(labels):
            continue
        decision = ownership.owner_of(labels, drivers)
        result.owners[name] = decision.owner
        if decision.conflict:
            for candidate in decision.candidates:
                result.drivers[candidate].conflicts.append(name)
        if decision.owner in result.drivers:
            owned.setdefault(decision.owner, []).append((name, labels))
    for item in live:
        entry = result.drivers[item.name]
        entry.nodes = sorted(n for n, _ in owned.get(item.name, []))
        if entry.conflicts:
            shown = ", ".join(sorted(entry.conflicts)[:5])
            more = len(entry.conflicts) - 5
            entry.problems.append(
                (
                    CONFLICTING_NODE_SELECTOR,
                    f"{len(entry.conflicts)} node(s) selected by more than one NVIDIADriver get "
                    f"no new driver from any of them: {shown}"
                    + (f" and {more} more" if more > 0 else ""),
                )
            )
        if not item.valid:
            entry.keep_all = True
            entry.problems.insert(0, (INVALID_SPEC, "; ".join(item.problems) or "unreadable"))
            continue
        _plan_pools(entry, item, owned.get(item.name, []), policy, facts)
    result.accounts = render_accounts([d for d in live if d.valid], facts)
    return result


def _plan_pools(
    entry: DriverPlan,
    item: DriverInput,
    nodes: list[tuple[str, Mapping[str, str]]],
    policy: api.ClusterPolicy,
    facts: ClusterFacts,
) -> None:
    spec = item.spec
    assert spec is not None
    pools, entry.skipped = pools_of(nodes, precompiled=bool(spec.usePrecompiled))
    labels_of = dict(nodes)
    flavor = kernel_module_type(spec)
    for pool in pools:
        name = daemonset_name(spec.driverType, item.uid, pool)
        report = driver_support.check(
            spec.version,
            flavor,
            (driver_support.NodeGpus.from_labels(n, labels_of[n]) for n in pool.nodes),
        )
        pool_plan = PoolPlan(pool, name, unchecked=len(report.unchecked))
        entry.pools.append(pool_plan)
        if not report.ok:
            pool_plan.blocked = "; ".join(report.problems)
            entry.keep.add(name)
            entry.problems.append(
                (
                    VERSION_UNSUPPORTED,
                    f"pool {pool.label}: not rolled out: {pool_plan.blocked}",
                )
            )
            continue
        try:
            entry.daemonsets.append(render_pool(item, pool, policy, facts))
        except (common.RenderError, images.ImageError) as err:
            pool_plan.blocked = str(err)
            entry.keep.add(name)
            entry.problems.append((RECONCILE_FAILED, f"pool {pool.label}: {err}"))
