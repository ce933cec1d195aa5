"""What the coexistence detector learns from outside the Node object: NFD's NodeFeatures (is the
`nvidia` kernel module loaded?) and DRA ResourceSlices (does NVIDIA's DRA driver publish the
node's GPUs?). Both APIs are optional: the NodeFeature cache starts when NFD's CRD appears, the
ResourceSlice cache when a probe at start finds `resource.k8s.io/v1` served and listable; without
them the detector works from node facts alone, as before, after one info line.

A change of either source re-plans the node it names (`node/<name>`). Until a source has listed
once, and for a bounded time while a new GPU node has no NodeFeature yet (nfd-master's GPU label
can reach us before the NodeFeature it came from), the labeller holds the node back rather than
deploy a driver next to a preinstalled one (`wait_reason`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gpu_operator.controller.runtime import CRDS, Reconciler, Request, Runtime, Watch
from gpu_operator.kube import probe, resources
from gpu_operator.kube.node_features import NODE_NAME_LABEL
from gpu_operator.nodes import coexist

log = logging.getLogger(__name__)

PREFIX = "coexist-sources"
NODE_FEATURES = "nodefeatures"
RESOURCE_SLICES = "resourceslices"
NODE_FEATURE_CRD = "nodefeatures.nfd.k8s-sigs.io"
# The longest a GPU node's labelling waits for a source (its first list, or the node's
# NodeFeature): NFD writes the NodeFeature before it labels the node, so this is rarely reached.
WAIT = 10.0
RETRY = 0.5


class FeatureView(NamedTuple):
    """A NodeFeature as the detector reads it: the node it describes, and whether it lists the
    `nvidia` module as loaded."""

    node: str
    nvidia: bool


class SliceView(NamedTuple):
    """A ResourceSlice as the detector reads it: its node (node-local slices only) and driver;
    the devices it publishes and its pool, for the readiness gate and the node verdicts."""

    node: str
    driver: str
    devices: int = 0
    pool: str = ""


def node_feature(obj: dict[str, Any]) -> FeatureView:
    """Cache transform: NFD names the node in a label (nfd-master ignores objects without it)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    features = (obj.get("spec") or {}).get("features")
    loaded = isinstance(features, Mapping) and coexist.nvidia_loaded(features)
    return FeatureView(sys.intern(str(labels.get(NODE_NAME_LABEL) or "")), loaded)


def resource_slice(obj: dict[str, Any]) -> SliceView:
    """Cache transform: slices published for all nodes or a node selector have no nodeName."""
    spec = obj.get("spec") or {}
    return SliceView(
        sys.intern(str(spec.get("nodeName") or "")), sys.intern(str(spec.get("driver") or "")),
        len(spec.get("devices") or ()), str((spec.get("pool") or {}).get("name") or ""),
    )  # fmt: skip


class _Index:
    """Per node name, the keys of the cached objects that count as evidence for it."""

    def __init__(self, counts: Callable[[Any], str]) -> None:
        self.node_of = counts  # the node an object is evidence for ("" if none)
        self.by_node: dict[str, set[str]] = {}

    def update(self, key: str, old: Any, new: Any) -> list[str]:
        before = self.node_of(old) if old is not None else ""
        after = self.node_of(new) if new is not None else ""
        if before == after:
            return []
        if before:
            keys = self.by_node.get(before, set())
            keys.discard(key)
            if not keys:
                self.by_node.pop(before, None)
        if after:
            self.by_node.setdefault(after, set()).add(key)
        return [n for n in (before, after) if n]

    def clear(self) -> list[str]:
        nodes = list(self.by_node)
        self.by_node.clear()
        return nodes


class CoexistSources(Reconciler):
    """Feeds nodes/coexist.py from NodeFeatures and ResourceSlices; its one work key probes the
    ResourceSlice API at start."""

    prefix = PREFIX

    def __init__(self, rt: Runtime, relabel: Callable[[str], str]) -> None:
        self.rt = rt
        self.relabel = relabel  # node name -> the labeller's work key
        # Nodes with a NodeFeature at all, and those whose NodeFeature lists `nvidia`.
        self.features = _Index(lambda v: v.node)
        self.loaded = _Index(lambda v: v.node if v.nvidia else "")
        self.slices = _Index(lambda v: v.node if v.driver == coexist.DRA_DRIVER else "")
        # None until the probe answered; then whether ResourceSlices are watched.
        self.slices_served: bool | None = None
        self._watching_features = False
        self.waiting_since: dict[str, float] = {}
        self._gave_up: set[str] = set()

    # ----- wiring ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        return [Watch(CRDS, self._on_crd)]

    def initial(self) -> list[Request]:
        return [Request(PREFIX)]

    def _on_crd(self, key: str, old: Any, new: Any) -> list[Request]:
        if key != NODE_FEATURE_CRD:
            return []
        caches = self.rt.caches
        if new is not None and NODE_FEATURES not in caches:
            caches.add(
                NODE_FEATURES, resources.NODE_FEATURE, namespace=resources.ALL_NAMESPACES,
                transform=node_feature,
            )  # fmt: skip
            if not self._watching_features:  # the CRD may come back after a removal
                self._watching_features = True
                self.rt.watch(NODE_FEATURES, self._on_feature)
            log.info("watching NFD NodeFeatures (their CRD appeared) for loaded nvidia modules")
        elif new is None and NODE_FEATURES in caches:
            # NFD uninstalled: its objects are gone with the CRD; a list would only fail now.
            caches.informers.pop(NODE_FEATURES).stop()  # its run loop ends at the next error
            log.info("NFD's NodeFeature CRD was removed: no longer watching NodeFeatures")
            nodes = {*self.features.clear(), *self.loaded.clear()}
            return [Request(self.relabel(n)) for n in nodes]
        return []

    def _on_feature(self, key: str, old: Any, new: Any) -> list[Request]:
        nodes = {*self.features.update(key, old, new), *self.loaded.update(key, old, new)}
        return [Request(self.relabel(n)) for n in nodes]

    def _on_slice(self, key: str, old: Any, new: Any) -> list[Request]:
        nodes = self.slices.update(key, old, new)
        if not nodes and old is not None and new is not None and old.devices != new.devices:
            # Same node, more or fewer devices: the readiness gate counts them.
            nodes = [n for n in (self.slices.node_of(new),) if n]
        return [Request(self.relabel(n)) for n in nodes]

    async def reconcile(self, key: str) -> None:
        """Probe `resource.k8s.io/v1` ResourceSlices once; watch them when they can be listed."""
        if self.slices_served is not None:
            return
        why = await probe.unavailable(self.rt.client, resources.RESOURCE_SLICE)
        if why is not None:
            self.slices_served = False
            log.info("%s: the DRA coexistence check is off (nothing publishes DRA devices here)",
                     why)  # fmt: skip
            return
        self.rt.caches.add(RESOURCE_SLICES, resources.RESOURCE_SLICE, transform=resource_slice)
        self.rt.watch(RESOURCE_SLICES, self._on_slice)
        self.slices_served = True
        log.info("watching resource.k8s.io/v1 ResourceSlices of the DRA driver %s",
                 coexist.DRA_DRIVER)  # fmt: skip

    # ----- what the labeller reads -------------------------------------------------------------

    def driver_loaded(self, node: str) -> str:
        """Where NFD saw `nvidia` loaded on the node ("" if nowhere)."""
        keys = self.loaded.by_node.get(node)
        return f"NodeFeature {sorted(keys)[0]}" if keys else ""

    def has_features(self, node: str) -> bool | None:
        """Whether NFD published a NodeFeature for the node; None when NodeFeatures are not
        watched (no NFD CRD) or not listed yet."""
        informer = self.rt.caches.informers.get(NODE_FEATURES)
        if informer is None or not informer.synced.is_set():
            return None
        return node in self.features.by_node

    def dra_slices(self, node: str) -> tuple[str, ...]:
        return tuple(sorted(self.slices.by_node.get(node, ())))

    def dra_slice_views(self, node: str) -> tuple[tuple[str, SliceView], ...] | None:
        """The node's gpu.nvidia.com slices (name, view), sorted by name; None while
        ResourceSlices are not watched (the API is not served, or not probed or listed yet)."""
        informer = self.rt.caches.informers.get(RESOURCE_SLICES)
        if not self.slices_served or informer is None or not informer.synced.is_set():
            return None
        found = ((k, informer.objects.get(k)) for k in sorted(self.slices.by_node.get(node, ())))
        return tuple((k, v) for k, v in found if v is not None)

    def dra_slice_objects(self, node: str) -> tuple[dict[str, Any], ...] | None:
        """The node's gpu.nvidia.com slices as the node chain reads them (name, driver, node,
        pool and as many device entries as published; the cache keeps no device details)."""
        views = self.dra_slice_views(node)
        if views is None:
            return None
        return tuple(
            {"metadata": {"name": name}, "spec": {
                "driver": v.driver, "nodeName": v.node, "pool": {"name": v.pool},
                "devices": [{} for _ in range(v.devices)]}}
            for name, v in views
        )  # fmt: skip

    def dra_devices(self, node: str) -> int | None:
        """The devices the node's gpu.nvidia.com slices publish (None: slices not watched)."""
        views = self.dra_slice_views(node)
        return None if views is None else sum(v.devices for _, v in views)

    def _syncing(self) -> str:
        """The sources that exist but have not listed yet ("" when none)."""
        pending = []
        if self.slices_served is None:
            pending.append("the ResourceSlice API probe")
        for name in (NODE_FEATURES, RESOURCE_SLICES):
            informer = self.rt.caches.informers.get(name)
            if informer is not None and not informer.synced.is_set():
                pending.append(f"the first list of {informer.kind}s")
        return " and ".join(pending)

    def wait_reason(self, node: str, new_gpu_node: bool) -> str:
        """Why the labeller should hold this GPU node back a moment ("" to go ahead): a source
        still listing, or (for a node the operator has not deployed a driver on) no NodeFeature
        yet while NFD's API exists. Bounded by WAIT per node; then the node goes ahead."""
        reason = self._syncing()
        if not reason and new_gpu_node and self.has_features(node) is False:
            reason = f"NFD's NodeFeature for {node}"
        if not reason:
            self.waiting_since.pop(node, None)
            return ""
        now = time.monotonic()
        since = self.waiting_since.setdefault(node, now)
        if now - since < WAIT:
            return reason
        if node not in self._gave_up:
            self._gave_up.add(node)
            log.info("node %s: labelled without %s after waiting %.0fs", node, reason, WAIT)
        return ""

    def forget(self, node: str) -> None:
        self.waiting_since.pop(node, None)
        self._gave_up.discard(node)
