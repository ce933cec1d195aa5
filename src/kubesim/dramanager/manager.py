"""One node's DRA manager: the kubelet side of Dynamic Resource Allocation.

Before a pod's sandbox is created the kubelet prepares the pod's ResourceClaims: it reads each
claim, checks that it may use it (kubesim.dramanager.claims), records the pod as a user of the
claim in its checkpoint, and calls NodePrepareResources once per driver with all of the pod's
claims that driver has to prepare and that are not prepared yet. The CDI device ids the drivers
answer go to the containers that list the claim in `resources.claims`. When the last pod using a
claim on the node is gone (finished or deleted) the kubelet calls NodeUnprepareResources and
forgets the claim; the pod object is removed only after that worked. Errors are returned with
the kubelet's wording, to be shown in `FailedPrepareDynamicResources` Events; the kubelet tries
again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import kubeletapi
from kubeletapi.dra.v1 import api_pb2 as dra
from kubesim import errors
from kubesim.controllers.volumes import resolve_within
from kubesim.dramanager import checkpoint
from kubesim.dramanager.claims import (
    ClaimError,
    ClaimInfo,
    PreparedDevice,
    check_claim,
    claim_name,
    container_cdi_devices,
    container_claim_requests,
    pod_claim_names,
)
from kubesim.dramanager.plugins import (
    DRAPlugin,
    PluginCallError,
    PluginStore,
    PluginWatcher,
    RegistrationError,
)
from kubesim.node_managers import node_pods
from kubesim.store import Store

log = logging.getLogger("kubesim.dramanager")
CLAIMS = "resourceclaims.resource.k8s.io"
SLICES = "resourceslices.resource.k8s.io"


class PrepareError(Exception):
    """Preparing a pod's claims failed; `message` is the kubelet's error text."""

    def __init__(self, detail: str) -> None:
        self.message = f"prepare dynamic resources: {detail}"
        super().__init__(self.message)


class UnprepareError(Exception):
    """Unpreparing a pod's claims failed; `message` is the kubelet's error text."""

    def __init__(self, detail: str) -> None:
        self.message = f"unprepare dynamic resources: {detail}"
        super().__init__(self.message)


class DRAManager:
    """The DRA manager of one node's kubelet (see the module docstring)."""

    def __init__(
        self,
        node: str,
        root: Path,
        store: Store,
        *,
        watch_interval: float = 0.05,
        registration_retry: float = 0.5,
        call_timeout: float = kubeletapi.DRA_CALL_TIMEOUT,
        wiping_delay: float = 30.0,
    ) -> None:
        self.node = node
        self.root = root
        self.store = store
        self.wiping_delay = wiping_delay
        self.checkpoint_path = resolve_within(root, kubeletapi.DRA_CHECKPOINT_FILE)
        self.plugins = PluginStore()
        self.watcher = PluginWatcher(
            root,
            self.plugins,
            interval=watch_interval,
            retry=registration_retry,
            call_timeout=call_timeout,
            on_change=self._plugins_changed,
        )
        # (namespace, claim name) -> what the kubelet knows of the claim.
        self.claims: dict[tuple[str, str], ClaimInfo] = {}
        self._wipes: dict[str, asyncio.TimerHandle] = {}
        self._stopping = False
        self._started = False
        # Claim UID -> set when a NodePrepareResources call for it (by another pod) ends.
        self._preparing: dict[str, asyncio.Event] = {}
        # NodePrepareResources / NodeUnprepareResources calls made (driver, claim names).
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []

    # ----- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the checkpoint and start watching the registration directory."""
        try:
            for info in checkpoint.read(self.checkpoint_path):
                self.claims[info.key] = info
        except checkpoint.CheckpointError as exc:
            log.error("continuing without the DRA checkpoint of %s: %s", self.node, exc)
        self.watcher.start()
        self._started = True

    async def stop(self) -> None:
        self._stopping = True
        for handle in self._wipes.values():
            handle.cancel()
        self._wipes.clear()
        await self.watcher.stop()

    # ----- plugins and their ResourceSlices -----------------------------------------------------

    def _plugins_changed(self, driver: str) -> None:
        """A plugin of `driver` registered or went away: the driver's ResourceSlices of this
        node are deleted once it has had no plugin for the wiping delay."""
        if self._stopping:
            return
        handle = self._wipes.pop(driver, None)
        if driver in self.plugins.plugins:
            if handle is not None:
                handle.cancel()
            return
        if handle is not None:
            self._wipes[driver] = handle  # already counting down
            return
        self._wipes[driver] = asyncio.get_running_loop().call_later(
            self.wiping_delay, self._wipe, driver
        )

    def _wipe(self, driver: str) -> None:
        self._wipes.pop(driver, None)
        if self._stopping or driver in self.plugins.plugins:
            return
        self.wipe_slices(driver)

    def wipe_slices(self, driver: str | None) -> int:
        """Delete this node's ResourceSlices (of one driver, or all); returns how many."""
        try:
            rt = self.store.registry.resolve(SLICES)
        except errors.ApiError:
            return 0
        fields = f"spec.nodeName={self.node}"
        names = [
            stored.obj["metadata"]["name"]
            for stored in self.store.scan(rt.key)
            if (stored.obj.get("spec") or {}).get("nodeName") == self.node
            and (driver is None or (stored.obj.get("spec") or {}).get("driver") == driver)
        ]
        for name in names:
            with contextlib.suppress(errors.ApiError):
                self.store.remove(rt, "", name)
        if names:
            log.info("deleted %d ResourceSlices (%s, driver %s)", len(names), fields, driver)
        return len(names)

    # ----- prepare ------------------------------------------------------------------------------

    def _get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            rt = self.store.registry.resolve(CLAIMS)
        except errors.ApiError:
            rt = None
        stored = self.store.peek(rt.key, namespace, name) if rt is not None else None
        if stored is None:
            raise ClaimError(
                f'fetch ResourceClaim {name}: resourceclaims.resource.k8s.io "{name}" not found'
            )
        return stored.obj

    async def prepare(self, pod: dict[str, Any]) -> None:
        """Prepare the claims of a pod about to start (raises PrepareError)."""
        try:
            await self._prepare(pod)
        except (ClaimError, RegistrationError, PluginCallError) as exc:
            raise PrepareError(str(exc)) from None

    async def _prepare(self, pod: dict[str, Any]) -> None:
        # A claim another pod's worker is preparing right now is waited for, not prepared twice.
        while True:
            waiting = [
                self._preparing[info.uid]
                for name in pod_claim_names(pod)
                if (info := self.claims.get((str(pod["metadata"].get("namespace", "")), name)))
                is not None
                and info.uid in self._preparing
            ]
            if not waiting:
                break
            for event in waiting:
                await event.wait()
        events: dict[str, asyncio.Event] = {}
        try:
            await self._prepare_once(pod, events)
        finally:
            for claim_uid, event in events.items():
                event.set()
                if self._preparing.get(claim_uid) is event:
                    del self._preparing[claim_uid]

    async def _prepare_once(self, pod: dict[str, Any], events: dict[str, asyncio.Event]) -> None:
        meta = pod["metadata"]
        namespace, uid = str(meta.get("namespace", "")), str(meta["uid"])
        # First a pass that changes nothing, so that a pod which cannot be prepared (no
        # driver on the node, say) can be deleted without the kubelet having to unprepare.
        checked: list[tuple[dict[str, Any], dict[str, DRAPlugin]]] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            name, must_own = claim_name(pod, entry)
            if name is None:
                continue
            claim = self._get_claim(namespace, name)
            drivers = check_claim(pod, claim, must_own)
            checked.append((claim, {d: self.plugins.get(d) for d in drivers}))
        # Record the pod as a user of each claim (checkpointed before any driver is called).
        batches: dict[int, tuple[DRAPlugin, list[dra.Claim]]] = {}
        pending: dict[str, ClaimInfo] = {}
        for claim, plugins in checked:
            claim_meta = claim["metadata"]
            key = (namespace, str(claim_meta["name"]))
            info = self.claims.get(key)
            if info is None:
                info = ClaimInfo(
                    uid=str(claim_meta.get("uid", "")),
                    name=key[1],
                    namespace=namespace,
                    drivers={driver: [] for driver in plugins},
                )
                self.claims[key] = info
            elif info.uid != claim_meta.get("uid"):
                raise ClaimError(
                    f"old ResourceClaim with same name {key[1]} and different UID {info.uid} "
                    "still exists (previous pod force-deleted?!)"
                )
            info.pod_uids.add(uid)
            if info.prepared or info.uid in pending:
                continue
            pending[info.uid] = info
            events[info.uid] = self._preparing[info.uid] = asyncio.Event()
            request = dra.Claim(namespace=namespace, uid=info.uid, name=info.name)
            for plugin in plugins.values():
                batches.setdefault(id(plugin), (plugin, []))[1].append(request)
        self._write_checkpoint()
        prepared: dict[str, dict[str, list[PreparedDevice]]] = {}
        for plugin, claims in batches.values():
            self.calls.append(("prepare", plugin.driver, tuple(c.name for c in claims)))
            try:
                response = await plugin.prepare(claims)
            except PluginCallError as exc:
                raise PluginCallError(f"NodePrepareResources: {exc}") from None
            by_uid = {c.uid: c for c in claims}
            for claim_uid, result in response.claims.items():
                requested = by_uid.get(claim_uid)
                if requested is None:
                    raise ClaimError(
                        f"NodePrepareResources returned result for unknown claim UID {claim_uid}"
                    )
                if result.error:
                    raise ClaimError(
                        f"NodePrepareResources failed for ResourceClaim {requested.name}: "
                        f"{result.error}"
                    )
                prepared.setdefault(claim_uid, {})[plugin.driver] = [
                    PreparedDevice(
                        pool=d.pool_name,
                        device=d.device_name,
                        request_names=list(d.request_names),
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                    for d in result.devices
                ]
            skipped = len(claims) - len(response.claims)
            if skipped:
                raise ClaimError(f"NodePrepareResources skipped {skipped} ResourceClaims")
        for claim_uid, info in pending.items():
            if self.claims.get(info.key) is not info:
                continue  # unprepared meanwhile
            for driver, devices in prepared.get(claim_uid, {}).items():
                info.drivers[driver] = devices
            info.prepared = True
        self._write_checkpoint()

    def container_cdi_devices(
        self, pod: dict[str, Any], container: dict[str, Any]
    ) -> tuple[str, ...]:
        """The CDI device ids of a container's claims (raises ClaimError)."""
        return container_cdi_devices(pod, container, self.claims)

    def container_devices(
        self, pod: dict[str, Any], container: dict[str, Any]
    ) -> list[tuple[ClaimInfo, list[tuple[str, PreparedDevice]]]]:
        """Per prepared claim a container lists, the (driver, device) pairs serving it (for an
        entry naming a request, that request's devices): what the pod-resources API reports."""
        namespace = str(pod["metadata"].get("namespace", ""))
        result: list[tuple[ClaimInfo, list[tuple[str, PreparedDevice]]]] = []
        for name, request in container_claim_requests(pod, container):
            info = self.claims.get((namespace, name))
            if info is None or not info.prepared:
                continue
            devices = [
                (driver, device)
                for driver in sorted(info.drivers)
                for device in info.drivers[driver]
                if not request or not device.request_names or request in device.request_names
            ]
            result.append((info, devices))
        return result

    def pod_claims(self, uid: str) -> list[ClaimInfo]:
        """The claims a pod uses on this node, as recorded."""
        return [info for info in self.claims.values() if uid in info.pod_uids]

    # ----- unprepare ----------------------------------------------------------------------------

    def might_need_unprepare(self, uid: str) -> bool:
        """Whether some claim still lists the pod (its object must wait for the unprepare)."""
        return any(uid in info.pod_uids for info in self.claims.values())

    async def unprepare(self, pod: dict[str, Any]) -> None:
        """Release a finished or deleted pod's claims; claims no other pod uses are
        unprepared by their drivers (raises UnprepareError; calling again is safe)."""
        meta = pod["metadata"]
        uid = str(meta["uid"])
        names = [info.name for info in self.pod_claims(uid)] or pod_claim_names(pod)
        try:
            await self.unprepare_claims(uid, str(meta.get("namespace", "")), names)
        except (ClaimError, RegistrationError, PluginCallError) as exc:
            raise UnprepareError(str(exc)) from None

    async def unprepare_claims(self, uid: str, namespace: str, names: list[str]) -> None:
        batches: dict[str, list[dra.Claim]] = {}
        last: list[ClaimInfo] = []
        for name in names:
            info = self.claims.get((namespace, name))
            if info is None:
                continue
            if len(info.pod_uids - {uid}) > 0:
                info.pod_uids.discard(uid)  # checkpointed with the next change
                continue
            last.append(info)
            request = dra.Claim(namespace=namespace, uid=info.uid, name=info.name)
            for driver in sorted(info.drivers):
                batches.setdefault(driver, []).append(request)
        for driver, claims in batches.items():
            plugin = self.plugins.get(driver)
            self.calls.append(("unprepare", driver, tuple(c.name for c in claims)))
            try:
                response = await plugin.unprepare(claims)
            except PluginCallError as exc:
                raise PluginCallError(f"NodeUnprepareResources: {exc}") from None
            by_uid = {c.uid: c for c in claims}
            for claim_uid, result in response.claims.items():
                requested = by_uid.get(claim_uid)
                if requested is None:
                    raise ClaimError(
                        f"NodeUnprepareResources returned result for unknown claim UID {claim_uid}"
                    )
                if result.error:
                    raise ClaimError(
                        f"NodeUnprepareResources failed for ResourceClaim {requested.name}: "
                        f"{result.error}"
                    )
            skipped = len(claims) - len(response.claims)
            if skipped:
                raise ClaimError(f"NodeUnprepareResources skipped {skipped} ResourceClaims")
        for info in last:
            if self.claims.get(info.key) is info:
                del self.claims[info.key]
        self._write_checkpoint()

    async def reconcile(self) -> None:
        """Unprepare the claims of pods no longer active on the node (deleted while the
        kubelet was down, say), as the kubelet's periodic DRA reconcile does."""
        active = {str(p["metadata"].get("uid")) for p in self.pods(active_only=True)}
        stale: dict[str, tuple[str, list[str]]] = {}
        for info in list(self.claims.values()):
            for uid in info.pod_uids - active:
                stale.setdefault(uid, (info.namespace, []))[1].append(info.name)
        for uid, (namespace, names) in stale.items():
            try:
                await self.unprepare_claims(uid, namespace, names)
            except (ClaimError, RegistrationError, PluginCallError) as exc:
                log.info("unpreparing claims of gone pod %s failed, will retry: %s", uid, exc)

    # ----- pods and checkpoint ------------------------------------------------------------------

    def pods(self, *, active_only: bool = False) -> list[dict[str, Any]]:
        """The pods bound to this node (active: not Succeeded or Failed)."""
        return node_pods(self.store, self.node, active_only=active_only)

    def _write_checkpoint(self) -> None:
        if not self._started:
            return
        try:
            checkpoint.write(self.checkpoint_path, list(self.claims.values()))
        except OSError as exc:
            log.error("DRA checkpoint of %s not written: %s", self.node, exc)
