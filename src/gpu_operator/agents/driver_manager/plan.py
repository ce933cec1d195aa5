"""What the driver manager does on a node, as a plan: the node's labels, the host's state and the
settings in, the ordered steps out (and the steps that undo a failure). Pure.

Upstream's `uninstall_driver` flow (k8s-driver-manager), in four paths:
- preinstalled: the host itself answers `nvidia-smi`: label the node
  `nvidia.com/gpu.deploy.driver=pre-installed` (the driver DaemonSet then leaves it) and exit
  non-zero after a delay;
- no-driver: no `nvidia` module is loaded (a fresh node, a reboot): nothing holds a driver, so no
  operand is paused and no pod evicted; stale mounts and pid file go, vfio releases the GPUs, a
  cordon of ours is undone and a pause left by an interrupted run is restored;
- keep-driver: the loaded driver was installed with the same `DRIVER_CONFIG_DIGEST` (and
  `FORCE_REINSTALL` is off): operands are paused and restarted so they bind the new driver
  container's root, but the modules stay and GPU pods keep running;
- uninstall: pause the GPU operands, wait for their pods to leave, cordon and evict GPU pods
  (drain as the fallback with `ENABLE_AUTO_DRAIN`), unload the modules (drain and retry once with
  auto-drain), release vfio, wait for MOFED, uncordon, restore the labels.

The node annotation `nvidia.com/gpu-driver-upgrade-enabled=true` means the operator's upgrade
controller owns cordon, eviction and drain: the driver manager then does none of them.

Labels are paused and restored exactly (see `pause_value`, `restore_patch`): an absent label stays
absent, `false` and `""` stay, `true` becomes `paused-for-driver-upgrade`, any other value gets the
`_paused-for-driver-upgrade` suffix; restoring touches only labels still holding the value we
paused them to, so a value a person or another agent set meanwhile is never overwritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_operator.agents.driver_manager.settings import Settings
from gpu_operator.api import keys
from gpu_operator.upgrade import selectors as selector_mod

PAUSED = "paused-for-driver-upgrade"
PREINSTALLED = "pre-installed"
DRIVER_DEPLOY_LABEL = keys.DEPLOY_PREFIX + "driver"
# Upstream's record of the node's schedulability before its own cordon (only "false" is ours
# to undo); the same key, so a cordon recorded by either implementation is undone by the other.
INITIAL_STATE_ANNOTATION = "nvidia.com/driver-manager.node-initial-state.unschedulable"
CLIENT_LABEL = keys.DEPLOY_PREFIX + "client"
DRA_DRIVER_LABEL = keys.DEPLOY_PREFIX + "dra-driver"
DRA_PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"
# The operand deploy labels paused before the driver goes (upstream's list).
OPERAND_LABELS = tuple(
    keys.DEPLOY_PREFIX + name
    for name in (
        "operator-validator",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "mig-manager",
        "nvsm",
        "sandbox-validator",
        "sandbox-device-plugin",
        "vgpu-device-manager",
        "client",
        "dra-validator",
        "dcgm-dra",
        "dcgm-exporter-dra",
    )
)
# Pods (app label, operator namespace) always waited for. The MPS control daemon is ours: it
# holds the GPUs and goes with the device-plugin label, which upstream does not wait for.
ALWAYS_WAIT_APPS = (
    "nvidia-operator-validator",
    "nvidia-container-toolkit-daemonset",
    "nvidia-device-plugin-daemonset",
    "nvidia-device-plugin-mps-control-daemon",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter-dra",
    "nvidia-dcgm-dra",
)
# Pods waited for only when their operand's label is set on the node.
OPTIONAL_WAIT_APPS = (
    (keys.DEPLOY_PREFIX + "mig-manager", "nvidia-mig-manager"),
    (keys.DEPLOY_PREFIX + "sandbox-validator", "nvidia-sandbox-validator"),
    (keys.DEPLOY_PREFIX + "sandbox-device-plugin", "nvidia-sandbox-device-plugin-daemonset"),
    (keys.DEPLOY_PREFIX + "vgpu-device-manager", "nvidia-vgpu-device-manager"),
)
# Unload order: users of `nvidia` first. `nvidia_drm` is ours (upstream's list leaves it out,
# and a loaded nvidia_drm keeps nvidia_modeset, hence nvidia, in use).
UNLOAD_ORDER = (
    "nvidia_drm",
    "nvidia_modeset",
    "nvidia_uvm",
    "nvidia_peermem",
    "nvidia_fs",
    "nvidia_vgpu_vfio",
    "gdrdrv",
    "nvidia",
)
NVIDIA = "nvidia"
NOUVEAU = "nouveau"
VGPU_MODULE = "nvidia_vgpu_vfio"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_PAUSE_MARK = re.compile(re.escape(PAUSED) + "_?")

Route = Literal["preinstalled", "no-driver", "keep-driver", "uninstall"]


# ----- label rules ------------------------------------------------------------------------


def pause_value(value: str | None) -> str | None:
    """The value a deploy label is paused to (None: an absent label stays absent)."""
    if value is None or value in ("", "false"):
        return value
    if value == "true":
        return PAUSED
    if PAUSED in value:
        return value  # paused already (by an interrupted run)
    return f"{value}_{PAUSED}"


def unpause_value(value: str) -> str:
    """The value a paused label goes back to (`true` for a plain pause, the suffix removed)."""
    if value == PAUSED:
        return "true"
    return _PAUSE_MARK.sub("", value).strip("_")


def managed_labels(settings: Settings) -> tuple[str, ...]:
    """Every label the driver manager may pause, in a stable order."""
    extra = settings.node_label_for_gpu_pod_eviction
    found = [*OPERAND_LABELS, DRA_DRIVER_LABEL]
    if extra and extra not in found:
        found.append(extra)
    return tuple(found)


def paused_values(labels: Mapping[str, str], keys_: Iterable[str]) -> dict[str, str]:
    """For each of `keys_` on the node, the value it has once paused."""
    out: dict[str, str] = {}
    for key in keys_:
        value = pause_value(labels.get(key))
        if value is not None:
            out[key] = value
    return out


def pause_patch(labels: Mapping[str, str], keys_: Iterable[str]) -> dict[str, str]:
    """The label changes that pause `keys_` (labels already paused or `false` are left alone)."""
    return {k: v for k, v in paused_values(labels, keys_).items() if labels.get(k) != v}


@dataclass(frozen=True)
class Restore:
    """The patch that restores paused labels, and the labels left alone because they changed
    meanwhile (their value now; None: removed)."""

    patch: dict[str, str]
    changed_meanwhile: dict[str, str | None]


def restore_patch(paused: Mapping[str, str], current: Mapping[str, str]) -> Restore:
    """Restore each label still holding the value it was paused to; leave the others."""
    patch: dict[str, str] = {}
    changed: dict[str, str | None] = {}
    for key, value in paused.items():
        now = current.get(key)
        if now != value:
            if PAUSED in value and now != unpause_value(value):
                changed[key] = now
            continue
        target = unpause_value(value)
        if target != now:
            patch[key] = target
    return Restore(patch, changed)


def describe_changes(before: Mapping[str, str], patch: Mapping[str, str | None]) -> str:
    """`device-plugin true -> paused-for-driver-upgrade, ...` (deploy prefixes dropped)."""
    parts = []
    for key in sorted(patch):
        name = key.removeprefix(keys.DEPLOY_PREFIX)
        parts.append(f"{name} {before.get(key, '(none)')} -> {patch[key]}")
    return ", ".join(parts)


# ----- pods -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")), meta.get("uid") or "")


def gpu_resources(pod: Mapping[str, Any]) -> list[str]:
    """The NVIDIA GPU resources (`nvidia.com/gpu*`, `nvidia.com/mig-*`) a pod requests or limits."""
    found: set[str] = set()
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            for name in resources.get(kind) or {}:
                if str(name).startswith(GPU_RESOURCE_PREFIXES):
                    found.add(str(name))
    return sorted(found)


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _empty_dirs(pod: Mapping[str, Any]) -> list[str]:
    volumes = (pod.get("spec") or {}).get("volumes") or ()
    return [str(v.get("name")) for v in volumes if "emptyDir" in v]


@dataclass(frozen=True)
class Selection:
    """Pods to evict, pods already leaving, pods that cannot be evicted (why), pods ignored."""

    evict: tuple[PodRef, ...] = ()
    leaving: tuple[PodRef, ...] = ()
    blocked: tuple[tuple[PodRef, str], ...] = ()
    ignored: tuple[tuple[PodRef, str], ...] = ()

    @property
    def pods(self) -> tuple[PodRef, ...]:
        return self.evict + self.leaving


def _classify(
    wanted: Sequence[Mapping[str, Any]],
    *,
    force: bool,
    delete_emptydir: bool,
    drain: bool,
) -> Selection:
    """`kubectl drain`'s filters, in its order: DaemonSet, mirror, emptyDir, no controller."""
    evict: list[PodRef] = []
    leaving: list[PodRef] = []
    blocked: list[tuple[PodRef, str]] = []
    ignored: list[tuple[PodRef, str]] = []
    for pod in wanted:
        ref = pod_ref(pod)
        meta = pod.get("metadata") or {}
        owner = controller_of(pod)
        if owner is not None and owner.get("kind") == "DaemonSet":
            if drain:  # as `kubectl drain --ignore-daemonsets`
                ignored.append((ref, f"DaemonSet {owner.get('name')}"))
            else:
                blocked.append(
                    (
                        ref,
                        f"managed by DaemonSet {owner.get('name')}, which would bring it back; "
                        f"add {CLIENT_LABEL}=true to its nodeSelector so it is paused instead",
                    )
                )
            continue
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            if drain:
                ignored.append((ref, "static (mirror) pod"))
            else:
                blocked.append((ref, "a static pod: remove its manifest from the node"))
            continue
        if meta.get("deletionTimestamp"):
            leaving.append(ref)
            continue
        finished = _finished(pod)
        local = _empty_dirs(pod)
        if local and not finished and not delete_emptydir:
            blocked.append(
                (
                    ref,
                    f"emptyDir volume {', '.join(local)} would lose its data "
                    "(set DRAIN_DELETE_EMPTYDIR_DATA=true to accept that)",
                )
            )
            continue
        if owner is None and not finished and not force:
            blocked.append(
                (
                    ref,
                    "no controller would recreate it "
                    "(set DRAIN_USE_FORCE=true to delete it anyway)",
                )
            )
            continue
        evict.append(ref)
    return Selection(tuple(evict), tuple(leaving), tuple(blocked), tuple(ignored))


def select_gpu_pods(
    pods: Sequence[Mapping[str, Any]], *, force: bool, delete_emptydir: bool
) -> Selection:
    """The pods using NVIDIA GPU resources, and whether each can be evicted."""
    wanted = [p for p in pods if gpu_resources(p)]
    return _classify(wanted, force=force, delete_emptydir=delete_emptydir, drain=False)


def select_drain_pods(
    pods: Sequence[Mapping[str, Any]], *, selector: str, force: bool, delete_emptydir: bool
) -> Selection:
    """The pods a drain evicts (those matching `selector`; DaemonSet and static pods stay)."""
    matcher = selector_mod.parse(selector)
    wanted = [p for p in pods if matcher.matches((p.get("metadata") or {}).get("labels"))]
    return _classify(wanted, force=force, delete_emptydir=delete_emptydir, drain=True)


# ----- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """What the API says about the node when the driver manager starts."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False


@dataclass(frozen=True)
class HostFacts:
    """What the host says: a driver of its own, the loaded modules, the last install's digest."""

    host_driver_version: str | None = None
    loaded_modules: frozenset[str] = frozenset()
    stored_digest: str | None = None
    mellanox_present: bool = False


@dataclass(frozen=True)
class MarkPreinstalled:
    version: str


@dataclass(frozen=True)
class ExitAfter:
    seconds: float
    reason: str


@dataclass(frozen=True)
class PauseOperands:
    patch: Mapping[str, str]


@dataclass(frozen=True)
class WaitForPods:
    """Pods with label `app=<app>` in the operator namespace, on the node."""

    apps: tuple[str, ...]
    timeout: float


@dataclass(frozen=True)
class WaitForSelectorPods:
    """DaemonSet pods on the node whose nodeSelector has `key` (upstream: the client label)."""

    key: str
    timeout: float


@dataclass(frozen=True)
class KeepDriver:
    digest: str


@dataclass(frozen=True)
class Cordon:
    pass


@dataclass(frozen=True)
class EvictGpuPods:
    fallback_drain: bool


@dataclass(frozen=True)
class ReleaseVgpus:
    pass


@dataclass(frozen=True)
class UnloadDriver:
    modules: tuple[str, ...]
    drain_and_retry: bool


@dataclass(frozen=True)
class CleanupDriverRoot:
    pass


@dataclass(frozen=True)
class UnloadNouveau:
    pass


@dataclass(frozen=True)
class UnbindVfio:
    pass


@dataclass(frozen=True)
class WaitForMofed:
    use_host_mofed: bool
    timeout: float


@dataclass(frozen=True)
class Uncordon:
    pass


@dataclass(frozen=True)
class RestoreLabels:
    paused: Mapping[str, str]


Step = (
    MarkPreinstalled | ExitAfter | PauseOperands | WaitForPods | WaitForSelectorPods | KeepDriver
    | Cordon | EvictGpuPods | ReleaseVgpus | UnloadDriver | CleanupDriverRoot | UnloadNouveau
    | UnbindVfio | WaitForMofed | Uncordon | RestoreLabels
)  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """The steps in order, the steps that undo a failure, and the decisions worth a log line."""

    route: Route
    steps: tuple[Step, ...]
    on_failure: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()
    # Said when the driver cannot be unloaded because pods still use it.
    in_use_hint: str = ""


def upgrade_policy_owns_drain(node: NodeFacts) -> bool:
    """The operator's upgrade controller cordons, evicts and drains (auto-upgrade is on)."""
    return node.annotations.get(keys.UPGRADE_ENABLED) == "true"


def _in_use_hint(settings: Settings, policy: bool) -> str:
    node = settings.node_name
    if policy:
        return (
            "the operator's driver upgrade policy owns GPU pod eviction on this node: stop the "
            f"GPU workloads on {node}, or let the upgrade controller evict them "
            f"(kubectl label node {node} {keys.UPGRADE_STATE}=upgrade-required --overwrite), "
            "or turn driver.upgradePolicy.autoUpgrade off so the driver manager evicts them"
        )
    if not (settings.enable_gpu_pod_eviction or settings.enable_auto_drain):
        return (
            "GPU pod eviction and auto-drain are both off: stop the GPU workloads on "
            f"{node}, or set ENABLE_GPU_POD_EVICTION=true (and optionally ENABLE_AUTO_DRAIN=true) "
            "in driver.manager.env"
        )
    return f"stop the GPU workloads on {node}, or let them finish"


def _waits(labels: Mapping[str, str], settings: Settings) -> list[Step]:
    timeout = settings.operand_wait_timeout
    apps = list(ALWAYS_WAIT_APPS)
    apps += [app for key, app in OPTIONAL_WAIT_APPS if labels.get(key)]
    steps: list[Step] = [WaitForPods(tuple(apps), timeout)]
    custom = settings.node_label_for_gpu_pod_eviction
    for key in (CLIENT_LABEL, custom):
        if key and labels.get(key):
            steps.append(WaitForSelectorPods(key, timeout))
    return steps


def make_plan(node: NodeFacts, host: HostFacts, settings: Settings) -> Plan:
    """The driver manager's steps on this node (see the module doc for the four paths)."""
    if host.host_driver_version is not None:
        exit_after = ExitAfter(
            settings.preinstalled_exit_delay, "the NVIDIA driver is pre-installed on the host"
        )
        return Plan("preinstalled", (MarkPreinstalled(host.host_driver_version), exit_after))
    labels = node.labels
    policy = upgrade_policy_owns_drain(node)
    notes: list[str] = []
    if policy:
        notes.append(
            f"{keys.UPGRADE_ENABLED}=true: the operator's upgrade controller cordons and evicts, "
            "so GPU pod eviction and auto-drain by the driver manager are off"
        )
    evict = not policy and settings.enable_gpu_pod_eviction
    auto_drain = not policy and settings.enable_auto_drain
    dra = bool(labels.get(DRA_DRIVER_LABEL))
    managed = managed_labels(settings)
    paused = paused_values(labels, managed)
    may_cordon = evict or auto_drain
    on_failure: tuple[Step, ...] = (
        *((Uncordon(),) if may_cordon else ()),
        RestoreLabels(paused),
    )
    dra_steps: list[Step] = []
    if dra:
        dra_steps = [
            PauseOperands(pause_patch(labels, (DRA_DRIVER_LABEL,))),
            WaitForPods((DRA_PLUGIN_APP,), settings.operand_wait_timeout),
        ]
    rdma: list[Step] = []
    if settings.gpu_direct_rdma_enabled and host.mellanox_present:
        rdma = [WaitForMofed(settings.use_host_mofed, settings.mofed_wait_timeout)]
    nouveau: list[Step] = [UnloadNouveau()] if NOUVEAU in host.loaded_modules else []
    uncordon: list[Step] = [Uncordon()] if may_cordon else []
    hint = _in_use_hint(settings, policy)

    if NVIDIA not in host.loaded_modules:
        steps: list[Step] = [
            *dra_steps,
            CleanupDriverRoot(),
            *nouveau,
            UnbindVfio(),
            *rdma,
            *uncordon,
            RestoreLabels(paused),
        ]
        return Plan("no-driver", tuple(steps), on_failure, tuple(notes), hint)

    operands = [k for k in managed if k != DRA_DRIVER_LABEL]
    pause: list[Step] = [PauseOperands(pause_patch(labels, operands)), *_waits(labels, settings)]
    digest = settings.driver_config_digest
    if settings.force_reinstall:
        notes.append("FORCE_REINSTALL=true: the driver is reinstalled whatever its digest")
    elif digest and host.stored_digest == digest:
        steps = [
            *pause,
            KeepDriver(digest),
            *dra_steps,
            CleanupDriverRoot(),
            RestoreLabels(paused),
        ]
        return Plan("keep-driver", tuple(steps), on_failure, tuple(notes), hint)
    elif not digest:
        notes.append("DRIVER_CONFIG_DIGEST is not set: the driver is reinstalled")
    steps = [*pause]
    if evict or (dra and auto_drain):
        steps += [Cordon(), EvictGpuPods(fallback_drain=auto_drain)]
    steps += dra_steps
    if VGPU_MODULE in host.loaded_modules:
        steps.append(ReleaseVgpus())
    steps += [
        UnloadDriver(UNLOAD_ORDER, drain_and_retry=auto_drain),
        UnbindVfio(),
        *rdma,
        *uncordon,
        RestoreLabels(paused),
        *nouveau,
    ]
    return Plan("uninstall", tuple(steps), on_failure, tuple(notes), hint)


def title(step: Step) -> str:
    """A few words naming the step (for the plan's log line)."""
    match step:
        case MarkPreinstalled():
            return f"label the node {DRIVER_DEPLOY_LABEL}={PREINSTALLED}"
        case ExitAfter(seconds=seconds):
            return f"exit with an error after {seconds:g}s"
        case PauseOperands(patch=patch):
            return f"pause {len(patch)} GPU operand(s)" if patch else "nothing to pause"
        case WaitForPods(apps=apps):
            return (
                "wait for the DRA kubelet plugin to leave"
                if apps == (DRA_PLUGIN_APP,)
                else ("wait for the operand pods to leave")
            )
        case WaitForSelectorPods(key=key):
            return f"wait for DaemonSet pods selecting {key} to leave"
        case KeepDriver():
            return "keep the loaded driver (same config digest)"
        case Cordon():
            return "cordon"
        case EvictGpuPods(fallback_drain=drain):
            return "evict GPU pods" + (" (drain if that fails)" if drain else "")
        case ReleaseVgpus():
            return "delete vGPUs"
        case UnloadDriver(drain_and_retry=drain):
            return "unload the driver" + (" (drain and retry if in use)" if drain else "")
        case CleanupDriverRoot():
            return "unmount the old driver root"
        case UnloadNouveau():
            return "unload nouveau"
        case UnbindVfio():
            return "release GPUs from vfio"
        case WaitForMofed():
            return "wait for MOFED"
        case Uncordon():
            return "uncordon (if we cordoned)"
        case RestoreLabels():
            return "restore the operand labels"
    raise AssertionError(step)
