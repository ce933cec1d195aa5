"""Cluster facts for the renderers, folded from the node cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from gpu_operator.api import keys
from gpu_operator.nodes import labelling
from gpu_operator.operands import config_manager
from gpu_operator.operands.facts import ClusterFacts, Runtime
from gpu_operator.upgrade import states as upgrade_states


def runtime_of(node: Mapping[str, Any]) -> Runtime | None:
    version = str(
        ((node.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion", "")
    )
    for runtime in ("containerd", "cri-o", "docker"):
        if version.startswith(runtime):
            return "crio" if runtime == "cri-o" else runtime  # type: ignore[return-value]
    return None


T = TypeVar("T")


class PerNode(Generic[T]):
    """`read(node)` for each node, computed once per node object: the node cache replaces a
    node's object on every change and never edits one in place, so an object seen by the last
    call gives what it gave then. Only the last call's objects are kept (each checked by
    identity: an id reused by a new object is not taken for the old one), so a pass over 5,000
    nodes of which a few changed reads only those few."""

    def __init__(self, read: Callable[[Mapping[str, Any]], T]) -> None:
        self._read = read
        self._seen: dict[int, tuple[Mapping[str, Any], T]] = {}

    def __call__(self, nodes: Iterable[Mapping[str, Any]]) -> list[T]:
        seen = self._seen
        kept: dict[int, tuple[Mapping[str, Any], T]] = {}
        out: list[T] = []
        for node in nodes:
            key = id(node)
            hit = seen.get(key)
            if hit is None or hit[0] is not node:
                hit = (node, self._read(node))
            kept[key] = hit
            out.append(hit[1])
        self._seen = kept
        return out


class _NodeFacts(NamedTuple):
    """What one node adds to the cluster facts."""

    nfd: bool
    gpu: bool
    os: tuple[str, str] | None
    runtime: Runtime | None
    kernel: str | None
    plugin_config: str | None


def _node_facts(node: Mapping[str, Any]) -> _NodeFacts:
    labels = (node.get("metadata") or {}).get("labels") or {}
    # Stripped nodes carry the NFD verdict; full node objects are checked directly.
    nfd = bool(node.get("nfd")) or labelling.has_nfd(labels)
    if labels.get(keys.GPU_PRESENT) != "true":
        return _NodeFacts(nfd, False, None, None, None, None)
    os_id, version = labels.get(keys.NFD_OS_ID), labels.get(keys.NFD_OS_VERSION_ID)
    return _NodeFacts(
        nfd,
        True,
        (os_id, version) if os_id and version else None,
        runtime_of(node),
        labels.get(keys.NFD_KERNEL_FULL) or None,
        labels.get(config_manager.NODE_LABEL) or None,
    )


# The operator's status passes fold every node of its node cache, many times a minute.
_node_facts_of = PerNode(_node_facts)


class Folded(Generic[T]):
    """`read(node)` for each node of the node cache, kept from the cache's events (`changed`,
    as the informer calls its handlers: old None for an addition, new None for a deletion), so
    that a status pass reads what it folds instead of walking every node (`PerNode` still
    looked at each node of the cache on each call: thousands, several times a pass).

    Subclasses keep their aggregates up to date in `_add` and `_drop`. `sync(objects)` rebuilds
    everything when the cache was filled without events (set up by hand: the sizes differ)."""

    def __init__(self, read: Callable[[Mapping[str, Any]], T]) -> None:
        self._read = read
        self.values: dict[str, T] = {}

    def __len__(self) -> int:
        return len(self.values)

    def changed(
        self, key: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        before = self.values.pop(key, None) if new is None else self.values.get(key)
        if before is not None:
            self._drop(before)
        if new is not None:
            after = self._read(new)
            self.values[key] = after
            self._add(after)

    def sync(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
        """Rebuild from the whole cache unless the events kept this in step with it."""
        if len(self.values) == len(objects):
            return
        self.values = {}
        self._clear()
        for key, obj in objects.items():
            self.changed(key, None, obj)

    def _add(self, value: T) -> None:
        """`value` joined."""

    def _drop(self, value: T) -> None:
        """`value` left."""

    def _clear(self) -> None:
        """Nothing is held."""


def _count(counter: Counter[Any], value: Any, by: int) -> None:
    left = counter[value] + by
    if left > 0:
        counter[value] = left
    else:
        del counter[value]


class FactsFold(Folded[_NodeFacts]):
    """What `from_nodes` counts over the node cache, kept from its events (`from_fold`)."""

    def __init__(self) -> None:
        super().__init__(_node_facts)
        self._clear()

    def _clear(self) -> None:
        self.nfd = 0
        self.gpu_nodes = 0
        self.os_seen: Counter[tuple[str, str]] = Counter()
        self.runtimes: Counter[str] = Counter()
        self.kernels: Counter[str] = Counter()
        self.plugin_configs: Counter[str] = Counter()

    def _add(self, value: _NodeFacts) -> None:
        self._apply(value, 1)

    def _drop(self, value: _NodeFacts) -> None:
        self._apply(value, -1)

    def _apply(self, node: _NodeFacts, by: int) -> None:
        self.nfd += by if node.nfd else 0
        if not node.gpu:
            return
        self.gpu_nodes += by
        for counter, value in (
            (self.os_seen, node.os),
            (self.runtimes, node.runtime),
            (self.kernels, node.kernel),
            (self.plugin_configs, node.plugin_config),
        ):
            if value:
                _count(counter, value, by)


class LabelFacts(NamedTuple):
    """What the ClusterPolicy's status reads of a node's labels besides the facts: whether NFD
    found an NVIDIA GPU on it (`labelling.has_gpu`), and whether it is a GPU node whose host
    runs its own driver (`gpu.present` and a `pre-installed` driver label)."""

    name: str
    nfd_gpu: bool
    preinstalled: bool


def label_facts(node: Mapping[str, Any]) -> LabelFacts:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    return LabelFacts(
        str(meta.get("name")),
        labelling.has_gpu(labels),
        labels.get(keys.GPU_PRESENT) == "true" and labelling.preinstalled_driver(labels),
    )


class PickedFold(Folded[T]):
    """A fold that also keeps apart, by key, the values `pick` selects (`picked`): a handful of
    the fleet, which a pass then reads instead of every node."""

    def __init__(self, read: Callable[[Mapping[str, Any]], T], pick: Callable[[T], bool]) -> None:
        super().__init__(read)
        self._pick = pick
        self.picked: dict[str, T] = {}

    def changed(
        self, key: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        self.picked.pop(key, None)
        super().changed(key, old, new)
        value = self.values.get(key)
        if value is not None and self._pick(value):
            self.picked[key] = value

    def _clear(self) -> None:
        self.picked = {}


class LabelFold(PickedFold[LabelFacts]):
    """Each node's `label_facts`, with apart the nodes with a preinstalled driver (`picked`): a
    handful, where a pass used to read every node's labels for them."""

    def __init__(self) -> None:
        super().__init__(label_facts, lambda value: value.preinstalled)


class UpgradeFacts(NamedTuple):
    """What the ClusterPolicy's and NVIDIADrivers' upgrade views read of one node."""

    name: str
    owner: str | None
    skip: bool
    state: str
    failure: str


def upgrade_facts(node: Mapping[str, Any]) -> UpgradeFacts:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    state = str(labels.get(keys.UPGRADE_STATE) or "")
    failure = ""
    if state == upgrade_states.UPGRADE_FAILED:
        failure = str((meta.get("annotations") or {}).get(upgrade_states.FAILURE, ""))
    return UpgradeFacts(
        str(meta.get("name")),
        labels.get(keys.DRIVER_OWNER) or None,
        labels.get(keys.UPGRADE_SKIP) == "true",
        state,
        failure,
    )


class UpgradeFold(PickedFold[UpgradeFacts]):
    """Each node's `upgrade_facts`, with apart the nodes an upgrade view counts (`picked`: in
    the upgrade state machine or labelled to skip it): outside an upgrade, none."""

    def __init__(self) -> None:
        super().__init__(upgrade_facts, lambda value: value.skip or bool(value.state))


def from_nodes(
    nodes: Iterable[Mapping[str, Any]],
    *,
    namespace: str,
    operator_env: Mapping[str, str],
    has_servicemonitor_crd: bool,
    has_prometheusrule_crd: bool,
    config_map_keys: Mapping[str, tuple[str, ...]] | None = None,
    kubernetes_version: str = "1.35.0",
    config_map_data: Mapping[str, Mapping[str, str]] | None = None,
    startup_toleration: Mapping[str, str] | None = None,
    cached: bool = False,
) -> ClusterFacts:
    """Facts from every node: GPU count, NFD presence, OS of one GPU node, runtime, kernels, and
    the device-plugin config labels of GPU nodes. `cached`: the nodes are a node cache's
    objects, replaced on change and never edited in place (`PerNode`): each is read once."""
    fold = FactsFold()
    for node in _node_facts_of(nodes) if cached else map(_node_facts, nodes):
        fold._add(node)
    return from_fold(
        fold, namespace=namespace, operator_env=operator_env,
        has_servicemonitor_crd=has_servicemonitor_crd,
        has_prometheusrule_crd=has_prometheusrule_crd, config_map_keys=config_map_keys,
        kubernetes_version=kubernetes_version, config_map_data=config_map_data,
        startup_toleration=startup_toleration,
    )  # fmt: skip


def from_fold(
    fold: FactsFold,
    *,
    namespace: str,
    operator_env: Mapping[str, str],
    has_servicemonitor_crd: bool,
    has_prometheusrule_crd: bool,
    config_map_keys: Mapping[str, tuple[str, ...]] | None = None,
    kubernetes_version: str = "1.35.0",
    config_map_data: Mapping[str, Mapping[str, str]] | None = None,
    startup_toleration: Mapping[str, str] | None = None,
) -> ClusterFacts:
    """`from_nodes` from what a `FactsFold` counted (the node cache's, kept from its events)."""
    # Upstream reads the OS of "one GPU node"; the most common one is the stable choice (on a
    # tie, the first by name: the same answer whatever order the nodes came in).
    os_id, os_version = (
        min(fold.os_seen.items(), key=lambda seen: (-seen[1], seen[0]))[0]
        if fold.os_seen
        else (None, None)
    )
    runtimes = fold.runtimes
    runtime: Runtime = "containerd"
    if "containerd" not in runtimes and runtimes:
        runtime = "crio" if "crio" in runtimes else "docker"
    return ClusterFacts(
        namespace=namespace,
        gpu_node_count=fold.gpu_nodes,
        has_nfd=fold.nfd > 0,
        os_id=os_id,
        os_version_id=os_version,
        runtime=runtime,
        kernels=tuple(sorted(fold.kernels)),
        kubernetes_version=kubernetes_version,
        has_servicemonitor_crd=has_servicemonitor_crd,
        has_prometheusrule_crd=has_prometheusrule_crd,
        operator_env=dict(operator_env),
        config_map_keys=dict(config_map_keys or {}),
        config_map_data=dict(config_map_data or {}),
        startup_toleration=startup_toleration,
        plugin_config_labels=dict(fold.plugin_configs),
    )
