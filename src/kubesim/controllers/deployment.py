"""Deployment and ReplicaSet controllers (minimal but real); the scheduler is in scheduler.py."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any

from kubesim import errors
from kubesim.controllers import scheduling
from kubesim.controllers.base import ClockedController, Controller, controlled
from kubesim.store import Event, Store, Stored, parse_time

DEPLOY_KEY = ("apps", "deployments")
RS_KEY = ("apps", "replicasets")
POD_KEY = ("", "pods")
COMPONENT = "deployment-controller"
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
# Deployment annotations a new ReplicaSet does not inherit.
_NOT_COPIED = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        REVISION,
        REVISION_HISTORY,
        DESIRED_REPLICAS,
        MAX_REPLICAS,
        "deprecated.deployment.rollback.to",
    }
)


def _owner_ref(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned(controller: Controller, owner: dict[str, Any], key: tuple[str, str]) -> list[Stored]:
    return controlled(controller.store, owner["metadata"]["uid"], key)


def _owner_keys(event: Event, kind: str) -> list[tuple[str, str]]:
    meta = event.new.obj["metadata"]
    return [
        (meta.get("namespace", ""), r.get("name"))
        for r in meta.get("ownerReferences") or ()
        if r.get("kind") == kind and r.get("controller")
    ]


class DeploymentController(ClockedController):
    """Rolls Deployments out through ReplicaSets as upstream does: surge/unavailable-bounded
    rolling updates or Recreate, revisions, pause, proportional scaling, history cleanup,
    progress deadlines and the `ScalingReplicaSet` events."""

    name = COMPONENT
    # Pods: only their deletions (a Recreate rollout waits for the old pods to be gone).
    resources = (DEPLOY_KEY, RS_KEY)
    deleted_resources = (POD_KEY,)

    def initial_keys(self) -> list[Any]:
        return self.keys_of(DEPLOY_KEY)

    def on_event(self, event: Event) -> None:
        if event.key == DEPLOY_KEY:
            meta = event.new.obj["metadata"]
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == RS_KEY:
            for key in _owner_keys(event, "Deployment"):
                self.enqueue(key)
        elif event.key == POD_KEY and event.type == "DELETED":
            # Recreate waits for the old pods to be gone.
            for rs_key in _owner_keys(event, "ReplicaSet"):
                rs = self.store.peek(RS_KEY, *rs_key)
                if rs is not None:
                    for key in _owner_keys_of(rs.obj, "Deployment"):
                        self.enqueue(key)

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(DEPLOY_KEY, *key)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        _DeploymentSync(self, stored).run()


class _DeploymentSync:
    """One pass over one Deployment, following the upstream controller's sync steps."""

    def __init__(self, controller: DeploymentController, stored: Stored) -> None:
        self.c = controller
        self.store = controller.store
        self.d = stored.copy()
        self.meta = self.d["metadata"]
        self.namespace = self.meta["namespace"]
        self.name = self.meta["name"]
        self.spec = self.d.get("spec") or {}
        self.replicas = int(self.spec.get("replicas", 1))
        self.template = copy.deepcopy(self.spec.get("template") or {})
        self.hash = scheduling.template_hash(self.template)
        strategy = self.spec.get("strategy") or {}
        self.recreate = strategy.get("type") == "Recreate"
        rolling = strategy.get("rollingUpdate") or {}
        surge = scheduling.scaled_value(rolling.get("maxSurge", "25%"), self.replicas, True)
        unavailable = scheduling.scaled_value(
            rolling.get("maxUnavailable", "25%"), self.replicas, False
        )
        if surge == 0 and unavailable == 0:
            unavailable = 1
        self.max_surge = 0 if self.recreate else surge
        self.max_unavailable = (
            0 if self.recreate or self.replicas == 0 else min(unavailable, self.replicas)
        )
        self.now = controller.clock.stamp()
        self.status_dirty = False
        self.deadline = self.spec.get("progressDeadlineSeconds")
        # The upstream "no deadline" value is MaxInt32.
        if self.deadline is not None and int(self.deadline) >= 2**31 - 1:
            self.deadline = None

    # ----- the pass -----------------------------------------------------------------------------

    def run(self) -> None:
        self._paused_condition()
        rs_list = [s.copy() for s in _owned(self.c, self.d, RS_KEY)]
        if self.spec.get("paused"):
            self._sync(rs_list)
            return
        if self._scaling_event(rs_list):
            self._sync(rs_list)
            return
        if self.recreate:
            self._rollout_recreate(rs_list)
        else:
            self._rollout_rolling(rs_list)

    def _sync(self, rs_list: list[dict[str, Any]]) -> None:
        """Scale only (paused Deployments and scaling events), then report status."""
        new_rs, old = self._new_and_old(rs_list, create=False)
        self._scale(new_rs, old)
        if self.spec.get("paused"):
            self._cleanup(old)
        all_rs = [*old, *([new_rs] if new_rs else [])]
        self._write_status(self._calculate_status(all_rs, new_rs))

    def _rollout_rolling(self, rs_list: list[dict[str, Any]]) -> None:
        new_rs, old = self._new_and_old(rs_list, create=True)
        assert new_rs is not None
        all_rs = [*old, new_rs]
        if self._reconcile_new(all_rs, new_rs):
            self._sync_rollout_status(all_rs, new_rs)
            return
        if self._reconcile_old(all_rs, old, new_rs):
            self._sync_rollout_status([*old, new_rs], new_rs)
            return
        status = self._calculate_status(all_rs, new_rs)
        if self._complete(status):
            self._cleanup(old)
        self._sync_rollout_status(all_rs, new_rs)

    def _rollout_recreate(self, rs_list: list[dict[str, Any]]) -> None:
        new_rs, old = self._new_and_old(rs_list, create=False)
        all_rs = [*old, *([new_rs] if new_rs else [])]
        scaled = False
        for rs in _active(old):
            scaled = self._scale_rs(rs, 0) or scaled
        if scaled or self._old_pods_running(old):
            self._sync_rollout_status(all_rs, new_rs)
            return
        if new_rs is None:
            new_rs, old = self._new_and_old(rs_list, create=True)
            assert new_rs is not None
            all_rs = [*old, new_rs]
        self._scale_rs(new_rs, self.replicas)
        status = self._calculate_status(all_rs, new_rs)
        if self._complete(status):
            self._cleanup(old)
        self._sync_rollout_status(all_rs, new_rs)

    # ----- ReplicaSets --------------------------------------------------------------------------

    def _new_and_old(
        self, rs_list: list[dict[str, Any]], *, create: bool
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The ReplicaSet running the current template (made or re-revisioned) and the others."""
        new_rs = next((rs for rs in rs_list if _same_template(rs, self.template, self.hash)), None)
        old = [rs for rs in rs_list if rs is not new_rs]
        revision = str(1 + max((_revision(rs) for rs in old), default=0))
        if new_rs is not None:
            updated = copy.deepcopy(new_rs)
            self._new_rs_annotations(updated, revision, exists=True)
            min_ready = self.spec.get("minReadySeconds")
            if (updated.get("spec") or {}).get("minReadySeconds") != min_ready:
                if min_ready is None:
                    updated["spec"].pop("minReadySeconds", None)
                else:
                    updated["spec"]["minReadySeconds"] = min_ready
            if updated != new_rs:
                new_rs = self._update_rs(updated)
            self._set_revision(_annotations(new_rs).get(REVISION, revision))
            if self.deadline is not None and _condition(self.d, "Progressing") is None:
                self._set_condition(
                    "Progressing",
                    "True",
                    "FoundNewReplicaSet",
                    f'Found new replica set "{new_rs["metadata"]["name"]}"',
                )
            return new_rs, old
        if not create:
            return None, old
        labels = {**((self.template.get("metadata") or {}).get("labels") or {})}
        labels[HASH_LABEL] = self.hash
        template = copy.deepcopy(self.template)
        template.setdefault("metadata", {})["labels"] = labels
        selector = copy.deepcopy(self.spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = self.hash
        rs: dict[str, Any] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{self.name}-{self.hash}",
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [_owner_ref(self.d, "Deployment")],
            },
            "spec": {
                "replicas": 0,
                "selector": selector,
                "template": template,
            },
        }
        if self.spec.get("minReadySeconds") is not None:
            rs["spec"]["minReadySeconds"] = self.spec["minReadySeconds"]
        self._new_rs_annotations(rs, revision, exists=False)
        replicas = self._new_rs_replicas(old, None)
        rs["spec"]["replicas"] = replicas
        created = self.store.insert(self.c.rt("replicasets.apps"), rs).obj
        created = copy.deepcopy(created)
        if replicas > 0:
            self._event(f"Scaled up replica set {created['metadata']['name']} from 0 to {replicas}")
        self._set_revision(revision)
        if self.deadline is not None:
            self._set_condition(
                "Progressing",
                "True",
                "NewReplicaSetCreated",
                f'Created new replica set "{created["metadata"]["name"]}"',
            )
        return created, old

    def _new_rs_annotations(self, rs: dict[str, Any], revision: str, *, exists: bool) -> None:
        annotations = rs["metadata"].setdefault("annotations", {})
        for key, value in (self.meta.get("annotations") or {}).items():
            if key not in _NOT_COPIED:
                annotations[key] = value
        old_revision = annotations.get(REVISION)
        if _int(old_revision) < int(revision):
            annotations[REVISION] = revision
            if old_revision:
                # Rolling back to this ReplicaSet: keep the revisions it had before.
                history = annotations.get(REVISION_HISTORY)
                annotations[REVISION_HISTORY] = (
                    f"{history},{old_revision}" if history else old_revision
                )
        if not exists:
            self._replica_annotations(rs)

    def _replica_annotations(self, rs: dict[str, Any]) -> bool:
        annotations = rs["metadata"].setdefault("annotations", {})
        wanted = {
            DESIRED_REPLICAS: str(self.replicas),
            MAX_REPLICAS: str(self.replicas + self.max_surge),
        }
        changed = any(annotations.get(k) != v for k, v in wanted.items())
        annotations.update(wanted)
        return changed

    def _update_rs(self, rs: dict[str, Any]) -> dict[str, Any]:
        meta = rs["metadata"]
        stored = self.store.replace(
            self.c.rt("replicasets.apps"), rs, namespace=meta["namespace"], name=meta["name"]
        )
        return copy.deepcopy(stored.obj)

    def _scale_rs(self, rs: dict[str, Any], replicas: int, direction: str = "") -> bool:
        """Set a ReplicaSet's replicas (and replica annotations); True when the size changed."""
        current = int((rs.get("spec") or {}).get("replicas", 0))
        updated = copy.deepcopy(rs)
        annotations_changed = self._replica_annotations(updated)
        if current == replicas and not annotations_changed:
            return False
        updated["spec"]["replicas"] = replicas
        result = self._update_rs(updated)
        rs.clear()
        rs.update(result)
        if current != replicas:
            direction = direction or ("up" if replicas > current else "down")
            self._event(
                f"Scaled {direction} replica set {rs['metadata']['name']} "
                f"from {current} to {replicas}"
            )
        return current != replicas

    def _new_rs_replicas(self, all_rs: list[dict[str, Any]], new_rs: dict[str, Any] | None) -> int:
        """How big the new ReplicaSet may be now (the surge bound of a rolling update)."""
        if self.recreate:
            return self.replicas
        current_new = int((new_rs or {}).get("spec", {}).get("replicas", 0))
        total = sum(_replicas(rs) for rs in all_rs)
        max_total = self.replicas + self.max_surge
        if total >= max_total:
            return current_new
        scale_up = min(max_total - total, self.replicas - current_new)
        return current_new + scale_up

    def _reconcile_new(self, all_rs: list[dict[str, Any]], new_rs: dict[str, Any]) -> bool:
        current = _replicas(new_rs)
        if current == self.replicas:
            return False
        if current > self.replicas:
            return self._scale_rs(new_rs, self.replicas)
        return self._scale_rs(new_rs, self._new_rs_replicas(all_rs, new_rs))

    def _reconcile_old(
        self, all_rs: list[dict[str, Any]], old: list[dict[str, Any]], new_rs: dict[str, Any]
    ) -> bool:
        if sum(_replicas(rs) for rs in old) == 0:
            return False
        all_pods = sum(_replicas(rs) for rs in all_rs)
        min_available = self.replicas - self.max_unavailable
        new_unavailable = _replicas(new_rs) - _available(new_rs)
        max_scaled_down = all_pods - min_available - new_unavailable
        if max_scaled_down <= 0:
            return False
        ordered = sorted(old, key=_created)
        cleaned = 0
        # First scale down old ReplicaSets' unhealthy pods: they add nothing to availability.
        for rs in ordered:
            if cleaned >= max_scaled_down:
                break
            size, available = _replicas(rs), _available(rs)
            if size == 0 or size == available:
                continue
            count = min(max_scaled_down - cleaned, size - available)
            self._scale_rs(rs, size - count)
            cleaned += count
        available_pods = sum(_available(rs) for rs in [*old, new_rs])
        scaled = 0
        if available_pods > min_available:
            budget = available_pods - min_available
            for rs in ordered:
                if scaled >= budget:
                    break
                size = _replicas(rs)
                if size == 0:
                    continue
                count = min(size, budget - scaled)
                self._scale_rs(rs, size - count)
                scaled += count
        return cleaned + scaled > 0

    def _scaling_event(self, rs_list: list[dict[str, Any]]) -> bool:
        new_rs, old = self._new_and_old(rs_list, create=False)
        for rs in _active([*old, *([new_rs] if new_rs else [])]):
            desired = _annotations(rs).get(DESIRED_REPLICAS)
            if desired is not None and _int(desired) != self.replicas:
                return True
        return False

    def _scale(self, new_rs: dict[str, Any] | None, old: list[dict[str, Any]]) -> None:
        """Scale for a changed replica count: one active set takes it all, else proportionally."""
        everything = [*old, *([new_rs] if new_rs else [])]
        active = _active(everything)
        target: dict[str, Any] | None = None
        if len(active) == 1:
            target = active[0]
        elif not active and everything:
            target = new_rs or max(old, key=_created)
        if target is not None:
            if _replicas(target) != self.replicas:
                self._scale_rs(target, self.replicas)
            return
        if (
            new_rs is not None
            and _annotations(new_rs).get(DESIRED_REPLICAS) == str(self.replicas)
            and _replicas(new_rs) == self.replicas
            and _available(new_rs) == self.replicas
        ):
            for rs in _active(old):
                self._scale_rs(rs, 0)
            return
        if self.recreate:
            return
        allowed = self.replicas + self.max_surge if self.replicas > 0 else 0
        to_add = allowed - sum(_replicas(rs) for rs in active)
        if to_add > 0:
            active.sort(key=lambda rs: (-_replicas(rs), _negated_created(rs)))
            direction = "up"
        elif to_add < 0:
            active.sort(key=lambda rs: (-_replicas(rs), _created(rs)))
            direction = "down"
        else:
            direction = ""
        added = 0
        sizes: dict[str, int] = {}
        for rs in active:
            if to_add != 0:
                share = self._proportion(rs, to_add, added)
                sizes[rs["metadata"]["name"]] = _replicas(rs) + share
                added += share
            else:
                sizes[rs["metadata"]["name"]] = _replicas(rs)
        for index, rs in enumerate(active):
            name = rs["metadata"]["name"]
            if index == 0 and to_add != 0:
                sizes[name] = max(0, sizes[name] + to_add - added)
            self._scale_rs(rs, sizes[name], direction)

    def _proportion(self, rs: dict[str, Any], to_add: int, added: int) -> int:
        if _replicas(rs) == 0 or to_add == added:
            return 0
        if self.replicas == 0:
            fraction = -_replicas(rs)
        else:
            total = self.replicas + self.max_surge
            annotated = _int(_annotations(rs).get(MAX_REPLICAS)) or int(
                (self.d.get("status") or {}).get("replicas") or 0
            )
            fraction = round(_replicas(rs) * total / annotated) - _replicas(rs) if annotated else 0
        allowed = to_add - added
        return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)

    def _old_pods_running(self, old: list[dict[str, Any]]) -> bool:
        for rs in old:
            for pod in _owned(self.c, rs, POD_KEY):
                if (pod.obj.get("status") or {}).get("phase") not in ("Failed", "Succeeded"):
                    return True
        return False

    def _cleanup(self, old: list[dict[str, Any]]) -> None:
        """Delete the oldest unused ReplicaSets beyond revisionHistoryLimit."""
        limit = self.spec.get("revisionHistoryLimit")
        if limit is None:
            return
        alive = [rs for rs in old if not rs["metadata"].get("deletionTimestamp")]
        extra = len(alive) - int(limit)
        if extra <= 0:
            return
        alive.sort(key=lambda rs: (_revision(rs), _created(rs)))
        for rs in alive[:extra]:
            status = rs.get("status") or {}
            if _replicas(rs) != 0 or int(status.get("replicas") or 0) != 0:
                continue
            if int(rs["metadata"].get("generation", 1)) > int(status.get("observedGeneration", 0)):
                continue
            with contextlib.suppress(errors.ApiError):
                self.store.remove(
                    self.c.rt("replicasets.apps"), self.namespace, rs["metadata"]["name"]
                )

    # ----- status and conditions ----------------------------------------------------------------

    def _calculate_status(
        self, all_rs: list[dict[str, Any]], new_rs: dict[str, Any] | None
    ) -> dict[str, Any]:
        available = sum(_available(rs) for rs in all_rs)
        total = sum(_replicas(rs) for rs in all_rs)
        old_status = self.d.get("status") or {}
        status: dict[str, Any] = {"observedGeneration": self.meta.get("generation", 1)}
        for field, value in (
            ("replicas", sum(int((rs.get("status") or {}).get("replicas") or 0) for rs in all_rs)),
            ("updatedReplicas", int(((new_rs or {}).get("status") or {}).get("replicas") or 0)),
            (
                "readyReplicas",
                sum(int((rs.get("status") or {}).get("readyReplicas") or 0) for rs in all_rs),
            ),
            ("availableReplicas", available),
            ("unavailableReplicas", max(0, total - available)),
        ):
            if value:
                status[field] = value
        if "collisionCount" in old_status:
            status["collisionCount"] = old_status["collisionCount"]
        status["conditions"] = copy.deepcopy(old_status.get("conditions") or [])
        if available >= self.replicas - self.max_unavailable:
            _set_condition(
                status,
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
                self.now,
            )
        else:
            _set_condition(
                status,
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
                self.now,
            )
        return status

    def _complete(self, status: dict[str, Any]) -> bool:
        return (
            int(status.get("updatedReplicas") or 0) == self.replicas
            and int(status.get("replicas") or 0) == self.replicas
            and int(status.get("availableReplicas") or 0) == self.replicas
            and int(status.get("observedGeneration") or 0) >= int(self.meta.get("generation", 1))
        )

    def _sync_rollout_status(
        self, all_rs: list[dict[str, Any]], new_rs: dict[str, Any] | None
    ) -> None:
        status = self._calculate_status(all_rs, new_rs)
        current = _find(status, "Progressing")
        complete_already = (
            int(status.get("replicas") or 0) == int(status.get("updatedReplicas") or 0)
            and current is not None
            and current.get("reason") == "NewReplicaSetAvailable"
        )
        rs_name = new_rs["metadata"]["name"] if new_rs else None
        if self.deadline is not None and not complete_already:
            if self._complete(status):
                message = (
                    f'ReplicaSet "{rs_name}" has successfully progressed.'
                    if rs_name
                    else f'Deployment "{self.name}" has successfully progressed.'
                )
                _set_condition(
                    status, "Progressing", "True", "NewReplicaSetAvailable", message, self.now
                )
            elif self._progressing(status):
                message = (
                    f'ReplicaSet "{rs_name}" is progressing.'
                    if rs_name
                    else f'Deployment "{self.name}" is progressing.'
                )
                transition = (
                    current.get("lastTransitionTime")
                    if current is not None and current.get("status") == "True"
                    else self.now
                )
                status["conditions"] = [
                    c for c in status["conditions"] if c.get("type") != "Progressing"
                ]
                status["conditions"].append(
                    {
                        "type": "Progressing",
                        "status": "True",
                        "lastUpdateTime": self.now,
                        "lastTransitionTime": transition,
                        "reason": "ReplicaSetUpdated",
                        "message": message,
                    }
                )
            elif self._timed_out(current):
                message = (
                    f'ReplicaSet "{rs_name}" has timed out progressing.'
                    if rs_name
                    else f'Deployment "{self.name}" has timed out progressing.'
                )
                _set_condition(
                    status, "Progressing", "False", "ProgressDeadlineExceeded", message, self.now
                )
        self._write_status(status)
        self._requeue_stuck(status)

    def _progressing(self, status: dict[str, Any]) -> bool:
        old = self.d.get("status") or {}

        def count(source: dict[str, Any], field: str) -> int:
            return int(source.get(field) or 0)

        old_old = count(old, "replicas") - count(old, "updatedReplicas")
        new_old = count(status, "replicas") - count(status, "updatedReplicas")
        return (
            count(status, "updatedReplicas") > count(old, "updatedReplicas")
            or new_old < old_old
            or count(status, "readyReplicas") > count(old, "readyReplicas")
            or count(status, "availableReplicas") > count(old, "availableReplicas")
        )

    def _timed_out(self, current: dict[str, Any] | None) -> bool:
        if current is None or self.deadline is None:
            return False
        if current.get("reason") == "NewReplicaSetAvailable":
            return False
        if current.get("reason") == "ProgressDeadlineExceeded":
            return True
        since = current.get("lastUpdateTime")
        if not since:
            return False
        return self.c.clock.seconds_until(str(since)) + int(self.deadline) < 0

    def _requeue_stuck(self, status: dict[str, Any]) -> None:
        current = _find(status, "Progressing")
        if self.deadline is None or current is None or not current.get("lastUpdateTime"):
            return
        if self._complete(status) or current.get("reason") == "ProgressDeadlineExceeded":
            return
        after = self.c.clock.seconds_until(current["lastUpdateTime"]) + int(self.deadline)
        self.c.enqueue_after((self.namespace, self.name), max(after, 0) + 1.0)

    def _paused_condition(self) -> None:
        if self.deadline is None:
            return
        current = _condition(self.d, "Progressing")
        if current is not None and current.get("reason") == "ProgressDeadlineExceeded":
            return
        paused_recorded = current is not None and current.get("reason") == "DeploymentPaused"
        if self.spec.get("paused") and not paused_recorded:
            self._set_condition(
                "Progressing", "Unknown", "DeploymentPaused", "Deployment is paused"
            )
        elif not self.spec.get("paused") and paused_recorded:
            self._set_condition(
                "Progressing", "Unknown", "DeploymentResumed", "Deployment is resumed"
            )

    def _set_condition(self, ctype: str, status: str, reason: str, message: str) -> None:
        """Record a condition right away (as upstream's separate status updates do)."""
        current = self.d.setdefault("status", {})
        if _set_condition(current, ctype, status, reason, message, self.now):
            self._write_status(current)

    def _set_revision(self, revision: str) -> None:
        annotations = self.meta.get("annotations") or {}
        if annotations.get(REVISION) == revision:
            return
        stored = self.store.peek(DEPLOY_KEY, self.namespace, self.name)
        if stored is None:
            return
        obj = stored.copy()
        obj["metadata"].setdefault("annotations", {})[REVISION] = revision
        result = self.store.replace(
            self.c.rt("deployments.apps"), obj, namespace=self.namespace, name=self.name
        )
        self.meta["annotations"] = dict(result.obj["metadata"].get("annotations") or {})
        self.meta["resourceVersion"] = result.obj["metadata"]["resourceVersion"]

    def _write_status(self, status: dict[str, Any]) -> None:
        stored = self.store.peek(DEPLOY_KEY, self.namespace, self.name)
        if stored is None:
            return
        if (stored.obj.get("status") or {}) == status:
            self.d["status"] = copy.deepcopy(status)
            return
        obj = stored.copy()
        obj["status"] = copy.deepcopy(status)
        self.store.replace(
            self.c.rt("deployments.apps"),
            obj,
            namespace=self.namespace,
            name=self.name,
            subresource="status",
        )
        self.d["status"] = copy.deepcopy(status)

    def _event(self, message: str) -> None:
        self.c.events.record(self.d, "Normal", "ScalingReplicaSet", message, component=COMPONENT)


def _set_condition(
    status: dict[str, Any], ctype: str, value: str, reason: str, message: str, stamp: str
) -> bool:
    """Upstream's SetDeploymentCondition: same status and reason is a no-op; otherwise the
    condition moves to the end, keeping its transition time when the status is unchanged."""
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    current = next((c for c in conditions if c.get("type") == ctype), None)
    if current is not None and current.get("status") == value and current.get("reason") == reason:
        return False
    transition = (
        current.get("lastTransitionTime", stamp)
        if current is not None and current.get("status") == value
        else stamp
    )
    status["conditions"] = [c for c in conditions if c.get("type") != ctype]
    status["conditions"].append(
        {
            "type": ctype,
            "status": value,
            "lastUpdateTime": stamp,
            "lastTransitionTime": transition,
            "reason": reason,
            "message": message,
        }
    )
    return True


def _find(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), None)


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return _find(obj.get("status") or {}, ctype)


def _same_template(rs: dict[str, Any], template: dict[str, Any], template_hash: str) -> bool:
    """Whether a ReplicaSet runs this template (its hash label, or equal ignoring the label)."""
    labels = rs["metadata"].get("labels") or {}
    if labels.get(HASH_LABEL) == template_hash:
        return True
    rs_template = copy.deepcopy((rs.get("spec") or {}).get("template") or {})
    rs_labels = (rs_template.get("metadata") or {}).get("labels") or {}
    rs_labels.pop(HASH_LABEL, None)
    if "metadata" in rs_template and not rs_labels and "labels" in rs_template["metadata"]:
        rs_template["metadata"].pop("labels")
    return bool(rs_template == template)


def _annotations(rs: dict[str, Any]) -> dict[str, str]:
    return dict(rs["metadata"].get("annotations") or {})


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _revision(rs: dict[str, Any]) -> int:
    return _int(_annotations(rs).get(REVISION))


def _replicas(rs: dict[str, Any]) -> int:
    return int((rs.get("spec") or {}).get("replicas", 0))


def _available(rs: dict[str, Any]) -> int:
    return int((rs.get("status") or {}).get("availableReplicas") or 0)


def _created(rs: dict[str, Any]) -> tuple[str, str]:
    return (rs["metadata"].get("creationTimestamp", ""), rs["metadata"]["name"])


def _negated_created(rs: dict[str, Any]) -> tuple[float, str]:
    stamp = rs["metadata"].get("creationTimestamp")
    seconds = parse_time(stamp).timestamp() if stamp else 0.0
    return (-seconds, rs["metadata"]["name"])


def _active(rs_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rs for rs in rs_list if _replicas(rs) > 0]


def _owner_keys_of(obj: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    meta = obj["metadata"]
    return [
        (meta.get("namespace", ""), r.get("name"))
        for r in meta.get("ownerReferences") or ()
        if r.get("kind") == kind and r.get("controller")
    ]


@dataclasses.dataclass
class _Owned:
    """One ReplicaSet's pods as its controller counts them (kept from pod events): the work per
    change is the changed pod, not every pod the ReplicaSet owns."""

    # Pod name -> (live: not terminating nor finished, ready, finished and not yet deleted).
    pods: dict[str, tuple[bool, bool, bool]] = dataclasses.field(default_factory=dict)
    live: int = 0
    ready: int = 0
    finished: set[str] = dataclasses.field(default_factory=set)

    def put(self, name: str, facts: tuple[bool, bool, bool] | None) -> None:
        old = self.pods.pop(name, None)
        if old is not None:
            self.live -= old[0]
            self.ready -= old[1]
            self.finished.discard(name)
        if facts is None:
            return
        self.pods[name] = facts
        self.live += facts[0]
        self.ready += facts[1]
        if facts[2]:
            self.finished.add(name)


def _pod_facts(pod: dict[str, Any]) -> tuple[bool, bool, bool]:
    deleting = bool(pod["metadata"].get("deletionTimestamp"))
    finished = (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")
    live = not deleting and not finished
    return live, live and scheduling.pod_ready(pod), finished and not deleting


def _rs_controller_ref(pod: dict[str, Any]) -> dict[str, Any] | None:
    for ref in pod["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return ref if ref.get("kind") == "ReplicaSet" else None
    return None


class ReplicaSetController(Controller):
    """Keeps `replicas` pods per ReplicaSet and reports ready/available counts."""

    name = "replicaset-controller"
    resources = (RS_KEY, POD_KEY)

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        # The pod index by controlling ReplicaSet uid (the real controller's owner index), and
        # which ReplicaSet each indexed pod counts for.
        self.owned: dict[str, _Owned] = {}
        self._owner_of: dict[tuple[str, str], str] = {}

    def initial_keys(self) -> list[Any]:
        for stored in self.store.scan(POD_KEY):
            self._index(stored.obj, deleted=False)
        return self.keys_of(RS_KEY)

    def _index(self, pod: dict[str, Any], *, deleted: bool) -> tuple[str, str] | None:
        """File a pod under its ReplicaSet; the (namespace, name) of that ReplicaSet."""
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        key = (namespace, meta["name"])
        ref = None if deleted else _rs_controller_ref(pod)
        uid = (ref or {}).get("uid") or ""
        before = self._owner_of.get(key)
        if before is not None and before != uid:
            owned = self.owned.get(before)
            if owned is not None:
                owned.put(meta["name"], None)
                if not owned.pods:
                    del self.owned[before]
            del self._owner_of[key]
        if ref is None or not uid:
            return None
        self._owner_of[key] = uid
        self.owned.setdefault(uid, _Owned()).put(meta["name"], _pod_facts(pod))
        return namespace, str(ref.get("name"))

    def on_event(self, event: Event) -> None:
        if event.key == RS_KEY:
            meta = event.new.obj["metadata"]
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == POD_KEY:
            rs_key = self._index(event.new.obj, deleted=event.type == "DELETED")
            if rs_key is not None:
                self.enqueue(rs_key)
            if event.type == "MODIFIED" and event.old is not None:
                # Orphaned or adopted by another: the ReplicaSet it left counts again.
                old_ref = _rs_controller_ref(event.old.obj)
                if old_ref is not None and old_ref.get("uid") != (
                    _rs_controller_ref(event.new.obj) or {}
                ).get("uid"):
                    meta = event.old.obj["metadata"]
                    self.enqueue((meta.get("namespace", ""), old_ref.get("name")))

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(RS_KEY, *key)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        rs = stored.obj
        spec = rs.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        owned = self.owned.get(rs["metadata"]["uid"]) or _Owned()
        pods_rt = self.rt("pods")
        for name in sorted(owned.finished):
            self.store.remove(pods_rt, key[0], name)
        # Store writes reach on_event synchronously: `owned` follows every create and delete.
        owned = self.owned.get(rs["metadata"]["uid"]) or owned
        template = spec.get("template") or {}
        for _ in range(replicas - owned.live):
            pod: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": f"{rs['metadata']['name']}-",
                    "namespace": key[0],
                    "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                    "ownerReferences": [_owner_ref(rs, "ReplicaSet")],
                },
                "spec": copy.deepcopy(template.get("spec") or {}),
            }
            if (template.get("metadata") or {}).get("annotations"):
                pod["metadata"]["annotations"] = dict(template["metadata"]["annotations"])
            created = self.store.insert(pods_rt, pod).obj
            self.events.record(
                rs,
                "Normal",
                "SuccessfulCreate",
                f"Created pod: {created['metadata']['name']}",
                component="replicaset-controller",
            )
        owned = self.owned.get(rs["metadata"]["uid"]) or owned
        if owned.live > replicas:
            live = [
                found.obj
                for name, facts in owned.pods.items()
                if facts[0] and (found := self.store.peek(POD_KEY, key[0], name)) is not None
            ]
            # Delete the least useful pods first: unscheduled, then not ready, then newest.
            live.sort(
                key=lambda p: (
                    bool((p.get("spec") or {}).get("nodeName")),
                    scheduling.pod_ready(p),
                    p["metadata"].get("creationTimestamp", ""),
                )
            )
            for pod in live[: len(live) - replicas]:
                self.delete_pod(rs, pod)
        live_count, ready = owned.live, owned.ready
        min_ready = int(spec.get("minReadySeconds") or 0)
        available = ready
        if min_ready > 0 and ready:
            # Only a ReplicaSet with minReadySeconds reads its ready pods' transition times.
            waits = [
                scheduling.ready_for(found.obj, min_ready)
                for name, facts in owned.pods.items()
                if facts[1] and (found := self.store.peek(POD_KEY, key[0], name)) is not None
            ]
            available = sum(1 for w in waits if w == 0)
            pending = [w for w in waits if w > 0]
            if pending:
                self.enqueue_after(key, min(pending) + 0.01)
        status: dict[str, Any] = {
            "replicas": live_count,
            "observedGeneration": rs["metadata"].get("generation", 1),
        }
        if live_count:
            status["fullyLabeledReplicas"] = live_count
        if ready:
            status["readyReplicas"] = ready
        if available:
            status["availableReplicas"] = available
        if rs.get("status") != status:
            obj = stored.copy()
            obj["status"] = status
            self.store.replace(
                self.rt("replicasets.apps"),
                obj,
                namespace=key[0],
                name=key[1],
                subresource="status",
            )
