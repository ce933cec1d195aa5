"""CronJob controller: Jobs on a cron schedule, driven by the cluster clock.

Each firing creates Job `<cronjob>-<scheduled time in minutes since the epoch>` annotated with
`batch.kubernetes.io/cronjob-scheduled-timestamp`. Only the most recent missed firing runs (a
firing older than `startingDeadlineSeconds` is a `MissSchedule` instead), `concurrencyPolicy`
Forbid skips while a Job is active and Replace deletes the active ones first, and finished Jobs
beyond the history limits are deleted oldest first.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from kubesim import cron, errors
from kubesim.controllers import job as jobs
from kubesim.controllers import scheduling
from kubesim.controllers.base import ClockedController, controlled
from kubesim.store import Event, Stored, parse_time

CRONJOB_KEY = ("batch", "cronjobs")
SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
COMPONENT = "cronjob-controller"


def job_name(cronjob: str, scheduled: dt.datetime) -> str:
    """The Job name for one firing: the CronJob name and the scheduled minute since the epoch."""
    return f"{cronjob}-{int(scheduled.timestamp()) // 60}"


def rfc3339(moment: dt.datetime) -> str:
    """RFC 3339 with seconds and the zone offset (`Z` for UTC), as Go formats it."""
    text = moment.replace(microsecond=0).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class CronJobController(ClockedController):
    """Keys are (namespace, name) of CronJobs; Job changes requeue their CronJob."""

    name = COMPONENT
    resources = (CRONJOB_KEY, jobs.JOB_KEY)

    def initial_keys(self) -> list[Any]:
        return self.keys_of(CRONJOB_KEY)

    def on_event(self, event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.key == CRONJOB_KEY:
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == jobs.JOB_KEY:
            for ref in meta.get("ownerReferences") or ():
                if ref.get("kind") == "CronJob" and ref.get("controller"):
                    self.enqueue((meta["namespace"], ref.get("name")))

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(CRONJOB_KEY, namespace, name)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        cronjob = stored.obj
        status: dict[str, Any] = copy.deepcopy(cronjob.get("status") or {})
        children = self._jobs(cronjob)
        self._sync_active(cronjob, status, children)
        self._cleanup(cronjob, children)
        try:
            self._schedule(stored, status)
        finally:
            self._write_status(stored, status)

    # ----- active list and history --------------------------------------------------------------

    def _jobs(self, cronjob: dict[str, Any]) -> list[dict[str, Any]]:
        return [s.obj for s in controlled(self.store, cronjob["metadata"]["uid"], jobs.JOB_KEY)]

    def _sync_active(
        self, cronjob: dict[str, Any], status: dict[str, Any], children: list[dict[str, Any]]
    ) -> None:
        active = list(status.get("active") or [])
        active_uids = {ref.get("uid") for ref in active}
        for child in children:
            uid = child["metadata"]["uid"]
            outcome = jobs.finished(child)
            if uid not in active_uids and outcome is None:
                self.events.record(
                    cronjob,
                    "Warning",
                    "UnexpectedJob",
                    f"Saw a job that the controller did not create or forgot: "
                    f"{child['metadata']['name']}",
                    component=COMPONENT,
                )
            elif uid in active_uids and outcome is not None:
                active = [ref for ref in active if ref.get("uid") != uid]
                self.events.record(
                    cronjob,
                    "Normal",
                    "SawCompletedJob",
                    f"Saw completed job: {child['metadata']['name']}, condition: {outcome}",
                    component=COMPONENT,
                )
            if outcome == "Complete":
                completed = (child.get("status") or {}).get("completionTime")
                last = status.get("lastSuccessfulTime")
                if completed and (not last or parse_time(completed) > parse_time(last)):
                    status["lastSuccessfulTime"] = completed
        present = {c["metadata"]["uid"] for c in children}
        for ref in list(active):
            if ref.get("uid") not in present:
                active.remove(ref)
                self.events.record(
                    cronjob,
                    "Normal",
                    "MissingJob",
                    f"Active job went missing: {ref.get('name')}",
                    component=COMPONENT,
                )
        if active:
            status["active"] = active
        else:
            status.pop("active", None)

    def _cleanup(self, cronjob: dict[str, Any], children: list[dict[str, Any]]) -> None:
        spec = cronjob.get("spec") or {}
        for outcome, field, default in (
            ("Complete", "successfulJobsHistoryLimit", 3),
            ("Failed", "failedJobsHistoryLimit", 1),
        ):
            limit = spec.get(field, default)
            if limit is None:
                continue
            done = [
                c
                for c in children
                if jobs.finished(c) == outcome and not c["metadata"].get("deletionTimestamp")
            ]
            if len(done) <= int(limit):
                continue
            done.sort(
                key=lambda c: (
                    (c.get("status") or {}).get("startTime") is not None,
                    (c.get("status") or {}).get("startTime") or "",
                    c["metadata"].get("creationTimestamp", ""),
                )
            )
            for child in done[: len(done) - int(limit)]:
                self._delete_job(cronjob, child)

    def _delete_job(self, cronjob: dict[str, Any], child: dict[str, Any]) -> bool:
        meta = child["metadata"]
        try:
            self.store.remove(
                self.rt("jobs.batch"), meta["namespace"], meta["name"], propagation="Background"
            )
        except errors.ApiError as exc:
            if exc.code == 404:
                return False
            raise
        self.events.record(
            cronjob,
            "Normal",
            "SuccessfulDelete",
            f"Deleted job {meta['name']}",
            component=COMPONENT,
        )
        return True

    # ----- scheduling ---------------------------------------------------------------------------

    def _schedule(self, stored: Stored, status: dict[str, Any]) -> None:
        cronjob = stored.obj
        meta = cronjob["metadata"]
        spec = cronjob.get("spec") or {}
        key = (meta["namespace"], meta["name"])
        if spec.get("suspend"):
            return
        try:
            tz = cron.time_zone(spec.get("timeZone"))
        except cron.ScheduleError as exc:
            self.events.record(
                cronjob,
                "Warning",
                "UnknownTimeZone",
                f"invalid timeZone: {_go_quote(str(spec.get('timeZone')))}: {exc}",
                component=COMPONENT,
            )
            return
        try:
            schedule = cron.parse(str(spec.get("schedule", "")))
        except cron.ScheduleError as exc:
            self.events.record(
                cronjob,
                "Warning",
                "UnparseableSchedule",
                f"unparseable schedule: {_go_quote(str(spec.get('schedule', '')))} : {exc}",
                component=COMPONENT,
            )
            return
        now = self.clock.now()
        last = status.get("lastScheduleTime")
        earliest = parse_time(last) if last else parse_time(meta["creationTimestamp"])
        deadline = spec.get("startingDeadlineSeconds")
        if deadline is not None:
            earliest = max(earliest, now - dt.timedelta(seconds=int(deadline)))
        scheduled, missed = schedule.most_recent(earliest, now, tz)
        self._requeue_next(key, schedule, now, tz)
        if scheduled is None:
            return
        if deadline is not None and scheduled + dt.timedelta(seconds=int(deadline)) < now:
            self.events.record(
                cronjob,
                "Warning",
                "MissSchedule",
                "Missed scheduled time to start a job: "
                + scheduled.strftime("%a, %d %b %Y %H:%M:%S +0000"),
                component=COMPONENT,
            )
            return
        if missed > 100:
            self.events.record(
                cronjob,
                "Warning",
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease "
                ".spec.startingDeadlineSeconds or check clock skew",
                component=COMPONENT,
            )
        name = job_name(meta["name"], scheduled)
        active = list(status.get("active") or [])
        if any(ref.get("name") == name for ref in active) or (
            last and parse_time(last) >= scheduled
        ):
            return
        policy = spec.get("concurrencyPolicy") or "Allow"
        if active and policy == "Forbid":
            self.events.record(
                cronjob,
                "Normal",
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy "
                "is Forbid",
                component=COMPONENT,
            )
            return
        if active and policy == "Replace":
            for ref in active:
                child = self.store.peek(jobs.JOB_KEY, meta["namespace"], str(ref.get("name")))
                if child is not None:
                    self._delete_job(cronjob, child.obj)
            active = []
            status.pop("active", None)
        created = self._create_job(cronjob, name, scheduled, tz)
        if created is None:
            return
        active.append(
            {
                "kind": "Job",
                "namespace": meta["namespace"],
                "name": created["metadata"]["name"],
                "uid": created["metadata"]["uid"],
                "apiVersion": "batch/v1",
                "resourceVersion": created["metadata"]["resourceVersion"],
            }
        )
        status["active"] = active
        status["lastScheduleTime"] = rfc3339(scheduled.astimezone(dt.UTC))

    def _create_job(
        self, cronjob: dict[str, Any], name: str, scheduled: dt.datetime, tz: dt.tzinfo
    ) -> dict[str, Any] | None:
        meta = cronjob["metadata"]
        template = (cronjob.get("spec") or {}).get("jobTemplate") or {}
        template_meta = template.get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations[SCHEDULED_TIMESTAMP] = rfc3339(scheduled.astimezone(tz))
        job: dict[str, Any] = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "CronJob",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }
        if template_meta.get("labels"):
            job["metadata"]["labels"] = dict(template_meta["labels"])
        try:
            created = self.store.insert(self.rt("jobs.batch"), job).obj
        except errors.ApiError as exc:
            if exc.code != 409:
                self.events.record(
                    cronjob,
                    "Warning",
                    "FailedCreate",
                    f"Error creating job: {exc.message}",
                    component=COMPONENT,
                )
                raise
            # The Job for this firing exists already (created before a restart): adopt it.
            existing = self.store.peek(jobs.JOB_KEY, meta["namespace"], name)
            if existing is None or not scheduling.is_controlled_by(existing.obj, meta["uid"]):
                return None
            return existing.obj
        self.events.record(
            cronjob, "Normal", "SuccessfulCreate", f"Created job {name}", component=COMPONENT
        )
        return created

    def _requeue_next(
        self, key: tuple[str, str], schedule: cron.Schedule, now: dt.datetime, tz: dt.tzinfo
    ) -> None:
        upcoming = schedule.next_after(now, tz)
        # A little past the firing time, as upstream, so the firing is in the past when synced.
        self.enqueue_after(key, (upcoming - now).total_seconds() + 0.1)

    def _write_status(self, stored: Stored, status: dict[str, Any]) -> None:
        if status == (stored.obj.get("status") or {}):
            return
        meta = stored.obj["metadata"]
        current = self.store.peek(CRONJOB_KEY, meta["namespace"], meta["name"])
        if current is None:
            return
        obj = current.copy()
        obj["status"] = status
        self.store.replace(
            self.rt("cronjobs.batch"),
            obj,
            namespace=meta["namespace"],
            name=meta["name"],
            subresource="status",
        )


def _go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
