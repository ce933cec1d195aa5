"""Node labelling: from a node's labels and the ClusterPolicy, the label changes for that node.

One node in, one patch out: the controller runs this per node as its own work item, so a label
change on one node never causes a pass over the whole cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.api import ClusterPolicy, enablement, keys
from gpu_operator.nodes import ledger

# Deploy labels (without the `nvidia.com/gpu.deploy.` prefix) per workload config (reference §4.3).
CONTAINER_OPERANDS = (
    "driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm",
    "dcgm-exporter", "node-status-exporter", "operator-validator", "client",
)  # fmt: skip
VM_PASSTHROUGH_OPERANDS = (
    "sandbox-device-plugin", "sandbox-validator", "vfio-manager", "kata-manager", "cc-manager",
    "client",
)  # fmt: skip
VM_VGPU_OPERANDS = (
    "sandbox-device-plugin", "vgpu-manager", "vgpu-device-manager", "sandbox-validator",
    "cc-manager", "client",
)  # fmt: skip
MIG_MANAGER = "mig-manager"
DEVICE_PLUGIN = "device-plugin"
# Node agents that pause other operands by rewriting their deploy labels, and restore them when
# done. A pause left by an agent the node no longer runs (its workload config changed while it
# was busy) would never end: such a value goes back to "true".
PAUSED_BY = {
    "paused-for-vgpu-change": "vgpu-device-manager",
    "paused-for-mig-change": MIG_MANAGER,
}
# Keys that belong to the operator whoever wrote them (upstream's contract: it always owns them).
ALWAYS_OURS = frozenset({keys.GPU_PRESENT, keys.DRIVER_OWNER})
_MIG_PRODUCT_HINTS = ("h100", "a100", "a30")


@dataclass(frozen=True)
class LabelPolicy:
    """What node labelling needs from a ClusterPolicy (None policy: the operator is idle)."""

    sandbox: bool = False
    default_workload: str = keys.WORKLOAD_CONTAINER
    kata: bool = False
    mig_manager: bool = True
    mig_default_config: str = "all-disabled"
    upgrade_annotation: bool = False
    # NVIDIADriver objects own the driver (spec.driver.useNvidiaDriverCRD): nodes get owner labels.
    driver_crd: bool = False
    # The operator installs drivers (spec.driver.enabled): a preinstalled one is then a conflict.
    driver: bool = True

    @classmethod
    def from_policy(cls, policy: ClusterPolicy) -> LabelPolicy:
        spec = policy.spec
        sandbox = spec.sandboxWorkloads
        upgrade = spec.driver.upgradePolicy
        mig_config = spec.migManager.config if spec.migManager else None
        return cls(
            sandbox=enablement.sandbox_enabled(spec),
            default_workload=sandbox.defaultWorkload if sandbox else keys.WORKLOAD_CONTAINER,
            kata=bool(sandbox and sandbox.mode == "kata"),
            mig_manager=enablement.is_enabled(spec, "migManager"),
            mig_default_config=mig_config.default if mig_config else "all-disabled",
            upgrade_annotation=(
                enablement.is_enabled(spec, "driver")
                and not spec.driver.useNvidiaDriverCRD
                and bool(upgrade and upgrade.autoUpgrade)
                and not enablement.sandbox_enabled(spec)
            ),
            driver_crd=bool(spec.driver.useNvidiaDriverCRD),
            driver=enablement.is_enabled(spec, "driver"),
        )


@dataclass(frozen=True)
class OwnerLabel:
    """The NVIDIADriver owner label a node should carry (see nodes/ownership.py).

    `value` None removes the label; `keep` leaves label and upgrade annotation as they are.
    `auto_upgrade` decides the upgrade annotation; None leaves that to the ClusterPolicy.
    """

    value: str | None
    keep: bool = False
    auto_upgrade: bool | None = None


@dataclass
class NodePlan:
    """Label and annotation changes for one node (None removes a key) and what was left alone."""

    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.labels and not self.annotations

    def merge_patch(self) -> dict[str, object]:
        """A JSON merge patch of the node's metadata with these changes."""
        metadata: dict[str, object] = {}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"metadata": metadata} if metadata else {}


def has_gpu(labels: Mapping[str, str]) -> bool:
    """A GPU node per NFD's PCI vendor labels (any of upstream's three spellings)."""
    return any(labels.get(key) == "true" for key in keys.NFD_GPU_LABELS)


def preinstalled_driver(labels: Mapping[str, str]) -> bool:
    """Whether k8s-driver-manager found a driver on the node's host (`gpu.deploy.driver` is
    `pre-installed`): the operator's driver must never run there, and the label stays as it is."""
    return labels.get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED


def preinstalled_conflict(labels: Mapping[str, str], policy: LabelPolicy | None) -> bool:
    """A GPU node with a preinstalled driver while the ClusterPolicy installs drivers."""
    return (
        policy is not None
        and policy.driver
        and labels.get(keys.GPU_PRESENT) == "true"
        and preinstalled_driver(labels)
    )


def dra_node(labels: Mapping[str, str]) -> bool:
    """A node moved to DRA (`nvidia.com/dra-kubelet-plugin=true`): a DRA kubelet plugin serves
    its GPUs, so the operator's device plugin must not (never both on one GPU)."""
    return labels.get(keys.DRA_NODE) == "true"


def has_nfd(labels: Mapping[str, str]) -> bool:
    return any(key.startswith(keys.NFD_LABEL_PREFIX) for key in labels)


def mig_capable(labels: Mapping[str, str]) -> bool:
    """MIG capable per GFD's label, else guessed from the product name; never for vGPU guests."""
    if labels.get(keys.VGPU_HOST_DRIVER_VERSION):
        return False
    if keys.MIG_CAPABLE in labels:
        return labels[keys.MIG_CAPABLE] == "true"
    product = labels.get(keys.GPU_PRODUCT, "").lower()
    return any(hint in product for hint in _MIG_PRODUCT_HINTS)


def workload_config(labels: Mapping[str, str], policy: LabelPolicy) -> str:
    """container without sandbox workloads; else the node's valid label or the default."""
    if not policy.sandbox:
        return keys.WORKLOAD_CONTAINER
    value = labels.get(keys.GPU_WORKLOAD_CONFIG, "")
    return value if value in keys.WORKLOADS else policy.default_workload


def deploy_operands(labels: Mapping[str, str], policy: LabelPolicy) -> tuple[str, ...]:
    """The operands that should run on a GPU node, as deploy-label suffixes."""
    config = workload_config(labels, policy)
    if config == keys.WORKLOAD_CONTAINER:
        operands = CONTAINER_OPERANDS
        return (*operands, MIG_MANAGER) if mig_capable(labels) else operands
    if config == keys.WORKLOAD_VM_VGPU:
        return VM_VGPU_OPERANDS
    if policy.kata:
        return tuple(
            "kata-sandbox-device-plugin" if op == "sandbox-device-plugin" else op
            for op in VM_PASSTHROUGH_OPERANDS
        )
    return VM_PASSTHROUGH_OPERANDS


class _Writer:
    """Accumulates changes while enforcing the ownership rules."""

    def __init__(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        self.labels = labels
        self.owned = ledger.read(annotations)
        self.plan = NodePlan()

    def _ours(self, key: str, current: str | None) -> bool:
        return key in ALWAYS_OURS or ledger.owns(self.owned, key, current)

    def owns(self, key: str) -> bool:
        """Whether the operator wrote the key's current value (per the ledger)."""
        return key in self.owned and ledger.owns(self.owned, key, self.labels.get(key))

    def set(self, key: str, value: str, *, keep_non_empty: bool = False) -> None:
        current = self.labels.get(key)
        if current == value:
            return
        if current and (keep_non_empty or not self._ours(key, current)):
            if not self._ours(key, current) and not current.startswith(ledger.PAUSE_PREFIX):
                self.plan.conflicts.append(
                    f"{key}={current} was not set by the operator; left as is (wanted {value})"
                )
            return
        self.plan.labels[key] = value
        self.owned[key] = value

    def remove(self, key: str) -> None:
        current = self.labels.get(key)
        if current is None:
            return
        if self._ours(key, current):
            self.plan.labels[key] = None
            self.owned.pop(key, None)
        elif key in self.owned:
            # Someone changed our value: it is theirs now, and we forget it.
            self.owned.pop(key, None)
        else:
            self.plan.conflicts.append(
                f"{key}={current} was not set by the operator; left in place"
            )

    def finish(self, annotations: Mapping[str, str]) -> NodePlan:
        encoded = ledger.encode(self.owned)
        if annotations.get(ledger.ANNOTATION) != encoded:
            self.plan.annotations[ledger.ANNOTATION] = encoded
        return self.plan


def _set_annotation(
    plan: NodePlan, annotations: Mapping[str, str], key: str, value: str | None
) -> None:
    if annotations.get(key) != value:
        plan.annotations[key] = value


def plan_node(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    policy: LabelPolicy,
    owner: OwnerLabel | None = None,
    coexist: Mapping[str, str] | None = None,
    refuse: bool = False,
) -> NodePlan:
    """The label changes that bring one node in line with the ClusterPolicy (and, in NVIDIADriver
    mode, with the owner label `owner` asks for). `coexist` (deploy-label suffix -> value) and
    `refuse` are the coexistence detector's answer for the node (nodes/coexist.py)."""
    writer = _Writer(labels, annotations)
    overrides = dict(coexist or {})
    dra = dra_node(labels)
    if dra:
        # The admin's choice, whatever the detector saw: DRA serves this node's GPUs.
        overrides[DEVICE_PLUGIN] = "false"
    deploy_keys = [k for k in labels if k.startswith(keys.DEPLOY_PREFIX)]
    # k8s-driver-manager's `pre-installed` describes the host, not a wish: never overwritten or
    # removed (upstream only ever adds missing deploy labels, so it keeps it too), and not a
    # conflict either (the ClusterPolicy status and an Event report it).
    deploy_keys = [
        k
        for k in deploy_keys
        if k != keys.DEPLOY_OPERANDS
        and not (k == keys.DEPLOY_DRIVER and preinstalled_driver(labels))
    ]
    gpu = has_gpu(labels)
    if gpu:
        writer.set(keys.GPU_PRESENT, "true")
    elif keys.GPU_PRESENT in labels:
        writer.set(keys.GPU_PRESENT, "false")
    if not gpu or labels.get(keys.DEPLOY_OPERANDS) == "false" or refuse:
        for key in deploy_keys:
            writer.remove(key)
    else:
        wanted = {keys.DEPLOY_PREFIX + op for op in deploy_operands(labels, policy)}
        container = workload_config(labels, policy) == keys.WORKLOAD_CONTAINER
        # The MIG manager's label stays on container nodes whatever the operator wants (a
        # MIG-capable GPU may not be recognised from labels alone).
        kept = set(wanted)
        if container:
            kept.add(keys.DEPLOY_PREFIX + MIG_MANAGER)
        for key in deploy_keys:
            if key not in kept:
                writer.remove(key)
        for key in sorted(wanted):
            override = overrides.get(key.removeprefix(keys.DEPLOY_PREFIX))
            if key == keys.DEPLOY_DRIVER and preinstalled_driver(labels):
                if coexist is not None and override is None and writer.owns(key):
                    # The detector's own `pre-installed`, no longer warranted: a stale one would
                    # block the driver for good (GO#504). The driver manager's stays.
                    writer.set(key, "true")
                continue
            if override is not None:
                writer.set(key, override)
                continue
            if (
                (coexist is not None or key == keys.DEPLOY_PREFIX + DEVICE_PLUGIN)
                and labels.get(key) == "false"
                and writer.owns(key)
            ):
                # The operator's own `false` (the detector's, or a DRA node's), no longer
                # warranted: the DRA driver or the other device plugin went away, or the node
                # left DRA (its `nvidia.com/dra-kubelet-plugin` label was removed).
                writer.set(key, "true")
                continue
            pauser = PAUSED_BY.get(labels.get(key, ""))
            if pauser is not None and keys.DEPLOY_PREFIX + pauser not in kept:
                writer.set(key, "true")  # a stale pause (see PAUSED_BY)
                continue
            # Non-empty values set by others (pause values, a human's "false") are kept.
            writer.set(key, "true", keep_non_empty=True)
        if (
            container
            and policy.mig_manager
            and mig_capable(labels)
            # As upstream: an empty value counts as none (the MIG manager ignores it).
            and not labels.get(keys.MIG_CONFIG)
            and policy.mig_default_config == "all-disabled"
        ):
            writer.set(keys.MIG_CONFIG, "all-disabled")
    upgrade = gpu and policy.upgrade_annotation
    if owner is not None and not owner.keep:
        if owner.value:
            writer.set(keys.DRIVER_OWNER, owner.value)
        else:
            writer.remove(keys.DRIVER_OWNER)
    if owner is not None and owner.auto_upgrade is not None:
        upgrade = gpu and owner.value is not None and owner.auto_upgrade
    plan = writer.finish(annotations)
    if owner is None or not owner.keep:
        _set_annotation(plan, annotations, keys.UPGRADE_ENABLED, "true" if upgrade else None)
    return plan


def plan_cleanup(labels: Mapping[str, str], annotations: Mapping[str, str]) -> NodePlan:
    """Leave a node as the operator found it: remove only the labels it still owns."""
    writer = _Writer(labels, annotations)
    for key in list(writer.owned):
        writer.remove(key)
    writer.plan.conflicts.clear()  # on uninstall, others' labels are simply not ours to touch
    plan = writer.finish(annotations)
    _set_annotation(plan, annotations, keys.UPGRADE_ENABLED, None)
    return plan


def pending_message(gpu_nodes: Sequence[str], other_nodes: Sequence[str], shown: int = 3) -> str:
    """What the node-labelling state says while nodes wait for their labels: GPU nodes are being
    labelled; a node where NFD reports no NVIDIA GPU only gets checked (labels the operator left
    there are removed), so it is counted and never said to be labelled."""
    parts = []
    if gpu_nodes:
        parts.append(f"labelling {_counted(gpu_nodes, 'GPU node', shown)}")
    if other_nodes:
        parts.append(f"checking {_counted(other_nodes, 'node without an NFD GPU label', shown)}")
    return "; ".join(parts)


def _counted(names: Sequence[str], noun: str, shown: int) -> str:
    """`2 GPU nodes (a, b)`, `5 GPU nodes (a, b, c and 2 more)`."""
    listed = ", ".join(names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    plural = noun.replace("node", "nodes", 1) if len(names) != 1 else noun
    return f"{len(names)} {plural} ({listed})"
