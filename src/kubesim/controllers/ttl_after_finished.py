"""TTL-after-finished controller: deletes a finished Job `ttlSecondsAfterFinished` after it ended.

The Job's end is its `completionTime`, or for a failed Job the `Failed` condition's transition
time; the deletion cascades in the foreground, as upstream. Time is the cluster clock.
"""

from __future__ import annotations

from typing import Any

from kubesim import errors
from kubesim.controllers import job as jobs
from kubesim.controllers.base import ClockedController
from kubesim.store import Event


class TTLAfterFinishedController(ClockedController):
    """Keys are (namespace, name) of Jobs with a TTL."""

    name = "ttl-after-finished-controller"
    resources = (jobs.JOB_KEY,)

    def initial_keys(self) -> list[Any]:
        return [
            (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(jobs.JOB_KEY)
            if (s.obj.get("spec") or {}).get("ttlSecondsAfterFinished") is not None
        ]

    def on_event(self, event: Event) -> None:
        if event.key != jobs.JOB_KEY or event.type == "DELETED":
            return
        job = event.new.obj
        if (job.get("spec") or {}).get("ttlSecondsAfterFinished") is not None:
            self.enqueue((job["metadata"]["namespace"], job["metadata"]["name"]))

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(jobs.JOB_KEY, namespace, name)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        job = stored.obj
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        outcome = jobs.finished(job)
        if ttl is None or outcome is None:
            return
        if outcome == "Complete":
            ended = (job.get("status") or {}).get("completionTime")
        else:
            ended = (jobs.condition_true(job, "Failed") or {}).get("lastTransitionTime")
        if not ended:
            return
        remaining = self.clock.seconds_until(ended) + int(ttl)
        if remaining > 0:
            self.enqueue_after(key, remaining + 0.01)
            return
        try:
            self.store.remove(
                self.rt("jobs.batch"),
                namespace,
                name,
                propagation="Foreground",
                preconditions={"uid": job["metadata"]["uid"]},
            )
        except errors.ApiError as exc:
            if exc.code not in (404, 409):
                raise
