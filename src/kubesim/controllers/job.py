"""Job controller (batch/v1): pods to completion, with the status and conditions of 1.35.

Pods carry the `batch.kubernetes.io/job-tracking` finalizer until the controller has counted them
into `status.succeeded`/`failed`. A Job that meets its success criteria first gets
`SuccessCriteriaMet`, one that fails gets `FailureTarget` (and its running pods are deleted); the
terminal `Complete`/`Failed` condition follows once no pod is left running, as upstream does since
1.31. Deadlines use the cluster clock, so tests can jump past them.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from kubesim.clock import Clock
from kubesim.controllers import scheduling
from kubesim.controllers.base import ClockedController, controlled
from kubesim.store import Event, Store, Stored

log = logging.getLogger("kubesim.job")
JOB_KEY = ("batch", "jobs")
POD_KEY = ("", "pods")
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
COMPONENT = "job-controller"
SUCCESS_MESSAGE = "Reached expected number of succeeded pods"
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"
DEADLINE_MESSAGE = "Job was active longer than specified deadline"


def condition_true(job: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    """The Job's condition of a type when its status is True."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == ctype and condition.get("status") == "True":
            return dict(condition)
    return None


def finished(job: dict[str, Any]) -> str | None:
    """`Complete` or `Failed` when the Job has its terminal condition, else None."""
    for ctype in ("Complete", "Failed"):
        if condition_true(job, ctype):
            return ctype
    return None


def format_indexes(indexes: set[int]) -> str:
    """Indexes in the API's interval form: `0-2,4,6-7`."""
    parts: list[str] = []
    ordered = sorted(indexes)
    start = previous = None
    for index in [*ordered, None]:
        if index is not None and previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    return ",".join(parts)


def parse_indexes(text: str) -> set[int]:
    """The set of indexes written as `0-2,4`."""
    result: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        result.update(range(int(low), int(high or low) + 1))
    return result


class JobController(ClockedController):
    """Keys are ("job", namespace, name) and ("pod", namespace, name) for orphaned pods."""

    name = COMPONENT
    resources = (JOB_KEY, POD_KEY)

    def __init__(self, store: Store, clock: Clock | None = None) -> None:
        super().__init__(store, clock)
        # Pods this controller deleted on purpose (suspend, lower parallelism, a finished Job):
        # they do not count as failures.
        self._deleted: set[str] = set()

    def clock_keys(self) -> list[Any]:
        return [
            ("job", s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(JOB_KEY)
            if not finished(s.obj)
        ]

    def initial_keys(self) -> list[Any]:
        return [
            ("job", s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(JOB_KEY)
        ]

    def on_event(self, event: Event) -> None:
        if event.key == JOB_KEY:
            meta = event.new.obj["metadata"]
            self.enqueue(("job", meta["namespace"], meta["name"]))
        elif event.key == POD_KEY:
            meta = event.new.obj["metadata"]
            owner = _job_owner(event.new.obj)
            if owner is None:
                return
            if event.type == "DELETED":
                self._deleted.discard(meta.get("uid", ""))
            job = self.store.peek(JOB_KEY, meta["namespace"], owner.get("name", ""))
            if job is not None and job.obj["metadata"]["uid"] == owner.get("uid"):
                self.enqueue(("job", meta["namespace"], owner["name"]))
            elif event.type != "DELETED" and TRACKING_FINALIZER in (meta.get("finalizers") or ()):
                self.enqueue(("pod", meta["namespace"], meta["name"]))

    def reconcile(self, key: Any) -> None:
        kind, namespace, name = key
        if kind == "pod":
            stored = self.store.peek(POD_KEY, namespace, name)
            if stored is not None:
                self._release(stored.obj)
            return
        stored = self.store.peek(JOB_KEY, namespace, name)
        if stored is None:
            return
        _JobSync(self, stored).run()

    # ----- helpers used by the sync ------------------------------------------------------------

    def _release(self, pod: dict[str, Any]) -> None:
        """Drop the tracking finalizer from a pod (it has been counted, or its Job is gone)."""
        finalizers = pod["metadata"].get("finalizers") or []
        if TRACKING_FINALIZER not in finalizers:
            return
        current = self.store.peek(POD_KEY, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None:
            return
        obj = current.copy()
        remaining = [f for f in obj["metadata"].get("finalizers") or [] if f != TRACKING_FINALIZER]
        if remaining:
            obj["metadata"]["finalizers"] = remaining
        else:
            obj["metadata"].pop("finalizers", None)
        self.store.replace(
            self.rt("pods"),
            obj,
            namespace=obj["metadata"]["namespace"],
            name=obj["metadata"]["name"],
        )


def _job_owner(pod: dict[str, Any]) -> dict[str, Any] | None:
    for ref in pod["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == "Job" and ref.get("controller"):
            return dict(ref)
    return None


class _JobSync:
    """One pass over one Job: count finished pods, decide, create/delete pods, write status."""

    def __init__(self, controller: JobController, stored: Stored) -> None:
        self.c = controller
        self.store = controller.store
        self.job = stored.obj
        self.stored = stored
        self.meta = self.job["metadata"]
        self.namespace = self.meta["namespace"]
        self.spec = self.job.get("spec") or {}
        self.old_status = self.job.get("status") or {}
        self.status: dict[str, Any] = copy.deepcopy(self.old_status)
        self.conditions: list[dict[str, Any]] = list(self.status.get("conditions") or [])
        self.indexed = self.spec.get("completionMode", "NonIndexed") == "Indexed"
        completions = self.spec.get("completions")
        self.completions: int | None = None if completions is None else int(completions)
        self.parallelism = int(self.spec.get("parallelism", 1))
        self.backoff_limit = int(self.spec.get("backoffLimit", 6))
        self.stamp = controller.clock.stamp()

    # ----- the pass -----------------------------------------------------------------------------

    def run(self) -> None:
        pods = self._pods()
        if finished(self.job) or self.meta.get("deletionTimestamp"):
            # Nothing left to count: let finished and deleted pods go (a Job being deleted
            # in the foreground waits for them).
            for pod in pods:
                if _terminal(pod) or pod["metadata"].get("deletionTimestamp"):
                    self.c._release(pod)
            return
        new_failures = self._count(pods)
        active = [
            p for p in pods if not _terminal(p) and not p["metadata"].get("deletionTimestamp")
        ]
        terminating = [
            p for p in pods if not _terminal(p) and p["metadata"].get("deletionTimestamp")
        ]
        suspended = bool(self.spec.get("suspend"))
        self._suspension(suspended)
        if not suspended and not self.status.get("startTime"):
            self.status["startTime"] = self.stamp
        failure = self._failure_target()
        if failure is None:
            failure = self._check_failures(new_failures, active)
        success = self._success_target(active)
        if failure is not None or success or suspended:
            for pod in active:
                self._delete(pod)
            active = []
        else:
            active = self._scale(active, terminating)
        terminating = [
            p for p in self._pods() if not _terminal(p) and p["metadata"].get("deletionTimestamp")
        ]
        if not active and not terminating:
            if failure is not None:
                self._set_condition("Failed", failure[0], failure[1])
                self.c.events.record(
                    self.job, "Warning", failure[0], failure[1], component=COMPONENT
                )
            elif success:
                self._set_condition("Complete", success[0], success[1])
                self.status["completionTime"] = self.stamp
                self.c.events.record(
                    self.job, "Normal", "Completed", "Job completed", component=COMPONENT
                )
        self._write_status(active, terminating)
        self._requeue_deadline()

    # ----- pods ---------------------------------------------------------------------------------

    def _pods(self) -> list[dict[str, Any]]:
        return [s.obj for s in controlled(self.store, self.meta["uid"], POD_KEY)]

    def _count(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Count finished pods that still hold the finalizer; returns the newly failed ones."""
        succeeded = int(self.status.get("succeeded") or 0)
        failed = int(self.status.get("failed") or 0)
        completed = parse_indexes(self.status.get("completedIndexes", ""))
        newly_failed = []
        for pod in pods:
            if TRACKING_FINALIZER not in (pod["metadata"].get("finalizers") or ()):
                continue
            phase = (pod.get("status") or {}).get("phase")
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            if phase == "Succeeded":
                if self.indexed:
                    index = _index_of(pod)
                    if index is not None and index not in completed:
                        completed.add(index)
                        succeeded += 1
                else:
                    succeeded += 1
            elif phase == "Failed" or (deleting and _gone(pod)):
                if pod["metadata"].get("uid") in self.c._deleted:
                    pass
                elif self._ignored_failure(pod):
                    pass
                else:
                    failed += 1
                    newly_failed.append(pod)
            else:
                continue
            self.c._release(pod)
        if succeeded:
            self.status["succeeded"] = succeeded
        if failed:
            self.status["failed"] = failed
        if self.indexed and completed:
            self.status["completedIndexes"] = format_indexes(completed)
        return newly_failed

    def _scale(
        self, active: list[dict[str, Any]], terminating: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Create or delete pods so the right number run; returns the pods left running."""
        replacement = self.spec.get("podReplacementPolicy") or (
            "Failed" if self.spec.get("podFailurePolicy") else "TerminatingOrFailed"
        )
        # With `Failed`, a replacement waits until the terminating pod has fully failed.
        busy = len(active) + (len(terminating) if replacement == "Failed" else 0)
        succeeded = int(self.status.get("succeeded") or 0)
        if self.indexed:
            completions = self.completions or 0
            done = parse_indexes(self.status.get("completedIndexes", ""))
            running = {_index_of(p) for p in active} | (
                {_index_of(p) for p in terminating} if replacement == "Failed" else set()
            )
            missing = [i for i in range(completions) if i not in done and i not in running]
            room = max(0, self.parallelism - busy)
            for index in missing[:room]:
                active.append(self._create(index))
            return active
        if self.completions is None:
            want = 0 if succeeded else self.parallelism
        else:
            want = max(0, min(self.parallelism, self.completions - succeeded))
        if busy < want:
            for _ in range(want - busy):
                active.append(self._create(None))
        elif len(active) > want:
            active.sort(
                key=lambda p: (
                    bool((p.get("spec") or {}).get("nodeName")),
                    scheduling.pod_ready(p),
                    p["metadata"].get("creationTimestamp", ""),
                )
            )
            for pod in active[: len(active) - want]:
                self._delete(pod)
            active = active[len(active) - want :]
        return active

    def _create(self, index: int | None) -> dict[str, Any]:
        template = self.spec.get("template") or {}
        template_meta = template.get("metadata") or {}
        name = self.meta["name"]
        labels = dict(template_meta.get("labels") or {})
        annotations = dict(template_meta.get("annotations") or {})
        spec = copy.deepcopy(template.get("spec") or {})
        if index is not None:
            labels[COMPLETION_INDEX] = str(index)
            annotations[COMPLETION_INDEX] = str(index)
            # Indexed pods get a stable hostname and their index in the environment.
            spec["hostname"] = f"{name}-{index}"
            for key in ("initContainers", "containers"):
                for container in spec.get(key) or []:
                    env = container.setdefault("env", [])
                    if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                        env.append(
                            {
                                "name": "JOB_COMPLETION_INDEX",
                                "valueFrom": {
                                    "fieldRef": {
                                        "apiVersion": "v1",
                                        "fieldPath": (
                                            f"metadata.annotations['{COMPLETION_INDEX}']"
                                        ),
                                    }
                                },
                            }
                        )
        metadata: dict[str, Any] = {
            "generateName": f"{name}-{index}-" if index is not None else f"{name}-",
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": self.meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": [TRACKING_FINALIZER],
        }
        if annotations:
            metadata["annotations"] = annotations
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        created = self.store.insert(self.c.rt("pods"), pod).obj
        self.c.events.record(
            self.job,
            "Normal",
            "SuccessfulCreate",
            f"Created pod: {created['metadata']['name']}",
            component=COMPONENT,
        )
        return created

    def _delete(self, pod: dict[str, Any]) -> None:
        if not pod["metadata"].get("deletionTimestamp"):
            self.c._deleted.add(pod["metadata"].get("uid", ""))
        self.c.delete_pod(self.job, pod)

    # ----- decisions ----------------------------------------------------------------------------

    def _suspension(self, suspended: bool) -> None:
        current = next((c for c in self.conditions if c.get("type") == "Suspended"), None)
        if suspended and (current is None or current.get("status") != "True"):
            self._set_condition("Suspended", "JobSuspended", "Job suspended")
            # A suspended Job's deadline stops; resuming starts the clock again.
            self.status.pop("startTime", None)
            self.c.events.record(
                self.job, "Normal", "Suspended", "Job suspended", component=COMPONENT
            )
        elif not suspended and current is not None and current.get("status") == "True":
            self._set_condition("Suspended", "JobResumed", "Job resumed", status="False")
            self.status["startTime"] = self.stamp
            self.c.events.record(self.job, "Normal", "Resumed", "Job resumed", component=COMPONENT)

    def _failure_target(self) -> tuple[str, str] | None:
        found = next(
            (
                c
                for c in self.conditions
                if c.get("type") == "FailureTarget" and c.get("status") == "True"
            ),
            None,
        )
        if found is None:
            return None
        return str(found.get("reason", "")), str(found.get("message", ""))

    def _check_failures(
        self, new_failures: list[dict[str, Any]], active: list[dict[str, Any]]
    ) -> tuple[str, str] | None:
        reason: tuple[str, str] | None = None
        for pod in new_failures:
            matched = self._policy_match(pod)
            if matched is not None and matched[0] == "FailJob":
                reason = ("PodFailurePolicy", matched[1])
                break
        if reason is None:
            failed = int(self.status.get("failed") or 0)
            restart_policy = ((self.spec.get("template") or {}).get("spec") or {}).get(
                "restartPolicy"
            )
            if restart_policy == "OnFailure":
                restarts = sum(
                    int(s.get("restartCount") or 0)
                    for p in active
                    for s in (
                        *((p.get("status") or {}).get("containerStatuses") or []),
                        *((p.get("status") or {}).get("initContainerStatuses") or []),
                    )
                )
                failed += restarts
            if failed > self.backoff_limit:
                reason = ("BackoffLimitExceeded", BACKOFF_MESSAGE)
        if reason is None:
            deadline = self.spec.get("activeDeadlineSeconds")
            start = self.status.get("startTime")
            if (
                deadline is not None
                and start
                and not self.spec.get("suspend")
                and self.c.clock.seconds_until(start) + int(deadline) <= 0
            ):
                reason = ("DeadlineExceeded", DEADLINE_MESSAGE)
        if reason is not None:
            self._set_condition("FailureTarget", *reason)
        return reason

    def _success_target(self, active: list[dict[str, Any]]) -> tuple[str, str] | None:
        met = next(
            (
                c
                for c in self.conditions
                if c.get("type") == "SuccessCriteriaMet" and c.get("status") == "True"
            ),
            None,
        )
        if met is not None:
            return str(met.get("reason", "")), str(met.get("message", ""))
        succeeded = int(self.status.get("succeeded") or 0)
        result: tuple[str, str] | None = None
        if self.indexed:
            done = parse_indexes(self.status.get("completedIndexes", ""))
            rule = self._success_policy_rule(done)
            if rule is not None:
                result = ("SuccessPolicy", f"Matched rules at index {rule}")
            elif self.completions is not None and len(done) >= self.completions:
                result = ("CompletionsReached", SUCCESS_MESSAGE)
        elif self.completions is None:
            if succeeded and not active:
                result = ("CompletionsReached", SUCCESS_MESSAGE)
        elif succeeded >= self.completions:
            result = ("CompletionsReached", SUCCESS_MESSAGE)
        if result is not None:
            self._set_condition("SuccessCriteriaMet", *result)
        return result

    def _success_policy_rule(self, done: set[int]) -> int | None:
        for position, rule in enumerate((self.spec.get("successPolicy") or {}).get("rules") or []):
            wanted = rule.get("succeededIndexes")
            pool = done & parse_indexes(wanted) if wanted else done
            if wanted and not parse_indexes(wanted) <= done and rule.get("succeededCount") is None:
                continue
            count = rule.get("succeededCount")
            if count is not None and len(pool) < int(count):
                continue
            return position
        return None

    def _policy_match(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        """The action of the first podFailurePolicy rule a failed pod matches, with a message."""
        rules = (self.spec.get("podFailurePolicy") or {}).get("rules") or []
        meta = pod["metadata"]
        status = pod.get("status") or {}
        for position, rule in enumerate(rules):
            action = str(rule.get("action", ""))
            exit_codes = rule.get("onExitCodes")
            if exit_codes:
                values = {int(v) for v in exit_codes.get("values") or []}
                wanted_container = exit_codes.get("containerName")
                for container in status.get("containerStatuses") or []:
                    if wanted_container and container.get("name") != wanted_container:
                        continue
                    terminated = (container.get("state") or {}).get("terminated") or {}
                    code = terminated.get("exitCode")
                    if code is None or code == 0:
                        continue
                    inside = int(code) in values
                    if inside == (exit_codes.get("operator", "In") == "In"):
                        return action, (
                            f"Container {container.get('name')} for pod "
                            f"{meta['namespace']}/{meta['name']} failed with exit code {code} "
                            f"matching {action} rule at index {position}"
                        )
            for pattern in rule.get("onPodConditions") or []:
                for condition in status.get("conditions") or []:
                    if condition.get("type") == pattern.get("type") and condition.get(
                        "status"
                    ) == pattern.get("status", "True"):
                        return action, (
                            f"Pod {meta['namespace']}/{meta['name']} has condition "
                            f"{condition.get('type')} matching {action} rule at index {position}"
                        )
        return None

    def _ignored_failure(self, pod: dict[str, Any]) -> bool:
        matched = self._policy_match(pod)
        return matched is not None and matched[0] == "Ignore"

    # ----- status -------------------------------------------------------------------------------

    def _set_condition(self, ctype: str, reason: str, message: str, status: str = "True") -> None:
        for condition in self.conditions:
            if condition.get("type") == ctype:
                if condition.get("status") != status or condition.get("reason") != reason:
                    condition.update(
                        status=status,
                        reason=reason,
                        message=message,
                        lastProbeTime=self.stamp,
                        lastTransitionTime=self.stamp,
                    )
                return
        self.conditions.append(
            {
                "type": ctype,
                "status": status,
                "lastProbeTime": self.stamp,
                "lastTransitionTime": self.stamp,
                "reason": reason,
                "message": message,
            }
        )

    def _write_status(
        self, active: list[dict[str, Any]], terminating: list[dict[str, Any]]
    ) -> None:
        status = self.status
        for field, value in (("active", len(active)),):
            if value:
                status[field] = value
            else:
                status.pop(field, None)
        status["ready"] = sum(1 for p in active if scheduling.pod_ready(p))
        status["terminating"] = len(terminating)
        status["uncountedTerminatedPods"] = {}
        if self.conditions:
            status["conditions"] = self.conditions
        if status == self.old_status:
            return
        current = self.store.peek(JOB_KEY, self.namespace, self.meta["name"])
        if current is None:
            return
        obj = current.copy()
        obj["status"] = status
        self.store.replace(
            self.c.rt("jobs.batch"),
            obj,
            namespace=self.namespace,
            name=self.meta["name"],
            subresource="status",
        )

    def _requeue_deadline(self) -> None:
        deadline = self.spec.get("activeDeadlineSeconds")
        start = self.status.get("startTime")
        if deadline is None or not start or finished({"status": self.status}):
            return
        remaining = self.c.clock.seconds_until(start) + int(deadline)
        if remaining > 0:
            self.c.enqueue_after(("job", self.namespace, self.meta["name"]), remaining + 0.01)


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _gone(pod: dict[str, Any]) -> bool:
    """A deleted pod the kubelet will never report on (not bound to a node)."""
    return not (pod.get("spec") or {}).get("nodeName")


def _index_of(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX) or (
        pod["metadata"].get("labels") or {}
    ).get(COMPLETION_INDEX)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
