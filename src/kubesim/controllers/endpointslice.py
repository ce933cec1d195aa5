"""EndpointSlice controller: discovery.k8s.io/v1 slices for each selector Service.

Endpoints with the same resolved ports share slices of at most 100 endpoints; a Service that
selects no pods keeps one empty placeholder slice, as upstream. Terminating pods stay in with
`ready: false` and `terminating: true`; `serving` follows pod readiness. Slices carry the
`kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by` labels and are owned by
the Service (the garbage collector removes them with it).

Syncs are incremental, as upstream's: a sync re-derives only the endpoints of the pods that
changed since the last one (or whose node changed zone: nodes are watched for their
`topology.kubernetes.io/zone`), and slices are kept stable as upstream's reconciler keeps them
(`plan_slices`): an endpoint stays in its slice until it goes or moves to other ports, so a sync
writes only the slices whose endpoints changed. Its own slice writes do not queue the Service
again; someone else's make the next sync start again from the stored slices.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

from kubesim import errors
from kubesim.controllers import endpoints as common
from kubesim.controllers import scheduling
from kubesim.store import Event, Stored, now

SERVICE_KEY = common.SERVICE_KEY
POD_KEY = common.POD_KEY
SLICE_KEY = ("discovery.k8s.io", "endpointslices")
NODE_KEY = ("", "nodes")
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
MAX_ENDPOINTS = 100
ZONE_LABEL = "topology.kubernetes.io/zone"

Ports = list[dict[str, Any]]
# (ports key, ports, endpoint, address sort key)
_Entry = tuple[str, Ports, dict[str, Any], tuple[int, ...]]


class _Slice:
    """One slice as this controller last wrote it: its ports and its endpoints by pod, in the
    order the slice lists them."""

    __slots__ = ("endpoints", "key", "name", "ports")

    def __init__(self, name: str, key: str, ports: Ports | None) -> None:
        self.name = name
        self.key = key
        self.ports = ports
        self.endpoints: dict[str, dict[str, Any]] = {}


class _State:
    """One Service's endpoints as last synced: per pod its entry (None: selected but no
    endpoint), the Service's slices by name, and which slice lists each pod."""

    __slots__ = ("entries", "service", "slices", "where")

    def __init__(self, service: dict[str, Any]) -> None:
        self.service = service
        self.entries: dict[str, _Entry | None] = {}
        self.slices: dict[str, _Slice] = {}
        self.where: dict[str, str] = {}


class _Plan(NamedTuple):
    update: list[str]  # names of slices to rewrite
    delete: list[str]  # names of slices to delete
    create: list[_Slice]  # new slices (no name yet)


def plan_slices(
    state: _State, changes: dict[str, _Entry | None], relabel: set[str], limit: int = MAX_ENDPOINTS
) -> _Plan:
    """Apply pod endpoint changes to the Service's slices, as upstream's reconciler places them
    (pure: mutates only `state`). Unchanged endpoints stay where they are; a removed one leaves
    its slice and a changed one is updated in place; new ones first fill slices that are rewritten
    anyway (fullest first), then, when fewer than `limit` are left, the unchanged slice they fill
    closest to full, else new slices. A slice left empty is deleted. `relabel`: slices to rewrite
    regardless (their labels are stale)."""
    touched: set[str] = set(relabel)
    added: dict[str, list[tuple[tuple[int, ...], str, dict[str, Any]]]] = {}
    ports_of: dict[str, Ports] = {}
    for pod, entry in changes.items():
        at = state.where.get(pod)
        current = state.slices[at] if at is not None else None
        if current is not None and entry is not None and entry[0] == current.key:
            if current.endpoints[pod] != entry[2]:
                current.endpoints[pod] = entry[2]
                touched.add(current.name)
            continue
        if current is not None:
            del current.endpoints[pod]
            del state.where[pod]
            touched.add(current.name)
        if entry is not None:
            key, ports, endpoint, order = entry
            added.setdefault(key, []).append((order, pod, endpoint))
            ports_of[key] = ports
    update = {name for name in touched if state.slices[name].endpoints}
    delete = {name for name in touched if not state.slices[name].endpoints}
    create: list[_Slice] = []
    for key in sorted(added):
        pending = sorted(added[key], key=_sort_key)
        pending.reverse()  # popped from the end: address order

        rewritten = [state.slices[name] for name in update if state.slices[name].key == key]
        for slice_ in sorted(rewritten, key=lambda s: (-len(s.endpoints), s.name)):
            _fill(state, slice_, pending, limit)
        while pending:
            target: _Slice | None = None
            if len(pending) < limit:
                best = limit
                for slice_ in state.slices.values():
                    room = limit - len(slice_.endpoints) - len(pending)
                    if (
                        slice_.key == key
                        and slice_.endpoints
                        and slice_.name not in update
                        and 0 <= room < best
                    ):
                        best, target = room, slice_
            if target is None:
                target = _Slice("", key, ports_of[key] or None)
                create.append(target)
            else:
                update.add(target.name)
            _fill(state, target, pending, limit)
    if create or any(slice_.endpoints for slice_ in state.slices.values()):
        # Slices left without endpoints (the placeholder among them) go.
        for slice_ in state.slices.values():
            if not slice_.endpoints:
                delete.add(slice_.name)
                update.discard(slice_.name)
    else:
        # No endpoints at all: one placeholder slice keeps the Service visible to consumers
        # that watch slices. An up-to-date one stays as it is, else one is written.
        empty = list(state.slices.values())
        delete.update(slice_.name for slice_ in empty)
        update.clear()
        if len(empty) == 1 and empty[0].ports is None and empty[0].name not in relabel:
            delete.clear()
        else:
            create.append(_Slice("", "", None))
    return _Plan(sorted(update), sorted(delete), create)


def _fill(
    state: _State,
    slice_: _Slice,
    pending: list[tuple[tuple[int, ...], str, dict[str, Any]]],
    limit: int,
) -> None:
    """Move endpoints from the end of `pending` into the slice while it has room."""
    while pending and len(slice_.endpoints) < limit:
        _, pod, endpoint = pending.pop()
        slice_.endpoints[pod] = endpoint
        if slice_.name:
            state.where[pod] = slice_.name


def _sort_key(item: tuple[tuple[int, ...], str, dict[str, Any]]) -> tuple[tuple[int, ...], str]:
    return (item[0], item[1])


class EndpointSliceController(common.ServiceController):
    """Keys are (namespace, name) of Services; `memo` holds each Service's `_State` (its slices
    as last written), `dirty` the pods whose endpoints changed since its last sync."""

    name = "endpointslice-controller"
    resources = (SERVICE_KEY, POD_KEY, SLICE_KEY, NODE_KEY)
    memo: dict[tuple[str, str], _State]

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        # True while this controller writes a slice: the store reports the write synchronously,
        # and what the controller wrote itself needs no sync.
        self._writing = False

    def on_event(self, event: Event) -> None:
        if event.key == NODE_KEY:
            self._node_event(event)
            return
        if event.key != SLICE_KEY:
            super().on_event(event)
            return
        if self._writing:
            return
        namespace = event.new.obj["metadata"]["namespace"]
        for version in (event.old, event.new):
            labels = (version.obj["metadata"].get("labels") or {}) if version is not None else {}
            if labels.get(MANAGED_BY) == CONTROLLER_NAME and labels.get(SERVICE_NAME):
                # Someone else's write (or deletion) of one of our slices: what this controller
                # knows of them is stale, so the next sync (batched like pod changes) starts
                # again from the stored slices.
                key = (namespace, labels[SERVICE_NAME])
                self.memo.pop(key, None)
                self.enqueue_batched(key)

    def _node_event(self, event: Event) -> None:
        """A node whose zone changed (or that went): its endpoints are derived again."""
        zone = (event.new.obj["metadata"].get("labels") or {}).get(ZONE_LABEL)
        if event.type == "DELETED":
            zone = None
        old = event.old.obj["metadata"] if event.old is not None else None
        if ((old.get("labels") or {}) if old is not None else {}).get(ZONE_LABEL) == zone:
            return
        node = event.new.obj["metadata"]["name"]
        for key, state in self.memo.items():
            for pod, entry in state.entries.items():
                if entry is not None and entry[2].get("nodeName") == node:
                    self.dirty.setdefault(key, set()).add(pod)
                    self.enqueue_batched(key)

    def _write(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        self._writing = True
        try:
            return call(*args, **kwargs)
        finally:
            self._writing = False

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(SERVICE_KEY, namespace, name)
        rt = self.rt("endpointslices.discovery.k8s.io")
        if (
            stored is None
            or stored.obj["metadata"].get("deletionTimestamp")
            or not common.managed(stored.obj)
        ):
            for slice_ in self._owned_slices(namespace, name):
                self._write(self.store.remove, rt, namespace, slice_.obj["metadata"]["name"])
            self.memo.pop(key, None)
            self.dirty.pop(key, None)
            return
        try:
            self._sync(key, stored.obj, rt)
        except BaseException:
            # What was written is unknown: the next sync starts again from the stored slices.
            self.memo.pop(key, None)
            raise

    def _sync(self, key: tuple[str, str], service: dict[str, Any], rt: Any) -> None:
        """Derive the changed pods' endpoints, place them (`plan_slices`) and write the slices
        that changed: all pods against the stored slices on the first sync, after the Service
        changed or when the slices were edited by someone else; else only the changed pods."""
        namespace, name = key
        labels = dict(service["metadata"].get("labels") or {})
        labels[SERVICE_NAME] = name
        labels[MANAGED_BY] = CONTROLLER_NAME
        if (service.get("spec") or {}).get("clusterIP") == "None":
            labels[common.HEADLESS_LABEL] = ""
        state = self.memo.get(key)
        members, changed = self.changed_pods(key, service, state)
        relabel: set[str] = set()
        if state is None or state.service is not service:
            state = self.memo[key] = self._load(namespace, name, service, labels, relabel)
            changed = set(members) | set(state.where)
        changes: dict[str, _Entry | None] = {}
        for pod in changed:
            member = members.get(pod)
            if member is None:
                state.entries.pop(pod, None)
                changes[pod] = None
            else:
                changes[pod] = state.entries[pod] = self._entry(service, member.obj)
        plan = plan_slices(state, changes, relabel)
        deletes = list(plan.delete)
        updates = list(plan.update)
        creates: list[_Slice] = []
        for slice_ in plan.create:
            if deletes:
                # As upstream, a slice that would be deleted is rewritten instead of creating one.
                slice_.name = deletes.pop(0)
                state.slices[slice_.name] = slice_
                updates.append(slice_.name)
                for pod in slice_.endpoints:
                    state.where[pod] = slice_.name
            else:
                creates.append(slice_)
        for slice_ in creates:
            created = self._write(
                self.store.insert,
                rt,
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "generateName": f"{name}-",
                        "namespace": namespace,
                        "labels": dict(labels),
                        "annotations": {common.TRIGGER_TIME: now()},
                        "ownerReferences": [_owner(service)],
                    },
                    "addressType": "IPv4",
                    "endpoints": list(slice_.endpoints.values()) or None,
                    "ports": slice_.ports,
                },
            )
            slice_.name = created.obj["metadata"]["name"]
            state.slices[slice_.name] = slice_
            for pod in slice_.endpoints:
                state.where[pod] = slice_.name
        for slice_name in updates:
            slice_ = state.slices[slice_name]
            current = self.store.peek(SLICE_KEY, namespace, slice_name)
            if current is None:
                raise LookupError(f"EndpointSlice {namespace}/{slice_name} went away")
            updated = current.copy()
            updated["endpoints"] = list(slice_.endpoints.values()) or None
            updated["ports"] = slice_.ports
            updated["metadata"]["labels"] = dict(labels)
            updated["metadata"].setdefault("annotations", {})[common.TRIGGER_TIME] = now()
            self._write(self.store.replace, rt, updated, namespace=namespace, name=slice_name)
        for slice_name in deletes:
            state.slices.pop(slice_name, None)
            with contextlib.suppress(errors.ApiError):
                self._write(self.store.remove, rt, namespace, slice_name)

    def _load(
        self,
        namespace: str,
        name: str,
        service: dict[str, Any],
        labels: dict[str, str],
        relabel: set[str],
    ) -> _State:
        """The Service's slices as stored (those being deleted left out, as upstream), with
        their endpoints by pod; slices whose labels are stale or that list an endpoint that is
        no pod's or a pod twice go into `relabel`, to be rewritten."""
        state = _State(service)
        for stored in self._owned_slices(namespace, name):
            obj = stored.obj
            if obj["metadata"].get("deletionTimestamp"):
                continue
            slice_ = state.slices[obj["metadata"]["name"]] = _Slice(
                obj["metadata"]["name"], _ports_key(obj.get("ports")), obj.get("ports") or None
            )
            if obj["metadata"].get("labels") != labels:
                relabel.add(slice_.name)
            for endpoint in obj.get("endpoints") or ():
                ref = endpoint.get("targetRef") or {}
                pod = ref.get("name") if ref.get("kind") == "Pod" else None
                if pod is None or pod in state.where:
                    relabel.add(slice_.name)
                    continue
                slice_.endpoints[pod] = endpoint
                state.where[pod] = slice_.name
        return state

    def _owned_slices(self, namespace: str, name: str) -> list[Stored]:
        result = []
        for slice_ in self.store.scan(SLICE_KEY, namespace):
            labels = slice_.obj["metadata"].get("labels") or {}
            if labels.get(SERVICE_NAME) == name and labels.get(MANAGED_BY) == CONTROLLER_NAME:
                result.append(slice_)
        return result

    def _entry(self, service: dict[str, Any], pod: dict[str, Any]) -> _Entry | None:
        """A pod's endpoint (zone filled from its node) with its ports and sort key, or None."""
        spec = service.get("spec") or {}
        publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
        service_ports = spec.get("ports") or []
        if not common.eligible(pod, include_terminating=True):
            return None
        ports: Ports = []
        for service_port in service_ports:
            number = common.resolve_port(pod, service_port)
            if number is None:
                continue
            port: dict[str, Any] = {
                "name": service_port.get("name", ""),
                "port": number,
                "protocol": service_port.get("protocol", "TCP"),
            }
            if service_port.get("appProtocol"):
                port["appProtocol"] = service_port["appProtocol"]
            ports.append(port)
        if service_ports and not ports:
            return None
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        serving = publish_not_ready or scheduling.pod_ready(pod)
        ip = common.pod_ip(pod)
        endpoint: dict[str, Any] = {
            "addresses": [ip],
            "conditions": {
                "ready": serving and not terminating,
                "serving": serving,
                "terminating": terminating,
            },
        }
        host = common.hostname(pod, service)
        if host:
            endpoint["hostname"] = host
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            endpoint["nodeName"] = node_name
            node = self.store.peek(NODE_KEY, "", node_name)
            zone = ((node.obj["metadata"].get("labels") or {}) if node else {}).get(ZONE_LABEL)
            if zone:
                endpoint["zone"] = zone
        endpoint["targetRef"] = common.target_ref(pod)
        return (_ports_key(ports), ports, endpoint, common.ip_sort_key(ip))


def _ports_key(ports: Ports | None) -> str:
    # Called per endpoint: a joined string is much cheaper than JSON.
    if ports and len(ports) > 1:
        ports = sorted(ports, key=lambda p: (p.get("name", ""), p.get("port", 0)))
    return "|".join(
        f"{p.get('name', '')}/{p.get('port', 0)}/{p.get('protocol', '')}/{p.get('appProtocol', '')}"
        for p in ports or ()
    )


def _owner(service: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "name": service["metadata"]["name"],
        "uid": service["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
