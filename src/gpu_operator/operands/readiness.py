"""Readiness of operand workloads (reference §3.6), with the first concrete problem as the reason.

Upstream only says "not ready"; here the reason names a pod and what is wrong with it (a
container waiting in CrashLoopBackOff, an image that cannot be pulled, a pod that cannot be
scheduled, an out-of-date revision), so status can explain itself.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

Obj = dict[str, Any]
REVISION_HASH_LABEL = "controller-revision-hash"
# Waiting reasons that are normal while a pod starts; anything else is worth reporting first.
_BENIGN_WAITING = frozenset({"ContainerCreating", "PodInitializing"})
# Waiting reasons whose message is worth quoting (it names the image or the missing object).
_QUOTE_MESSAGE = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


# How much of a container's termination message a reason quotes (its last line, this long).
_MESSAGE_LIMIT = 300


def termination_message(terminated: Obj | None) -> str:
    """The telling part of a terminated container's `message`: its last non-empty line (the
    validator writes one line; a log tail ends with the error), shortened to a status line."""
    message = str((terminated or {}).get("message") or "")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= _MESSAGE_LIMIT else last[: _MESSAGE_LIMIT - 3] + "..."


@dataclass(frozen=True)
class Readiness:
    """Whether a workload is ready, how many pods it wants, how many are not ready, and why."""

    ready: bool
    desired: int
    not_ready: int
    reason: str


class PodSummary(NamedTuple):
    """What readiness needs from one pod, computed once when the pod changes.

    Caches of thousands of pods keep these instead of the pods themselves: a summary costs a few
    hundred bytes where a pod's status costs kilobytes.
    """

    name: str
    node: str
    owner_uids: tuple[str, ...]
    revision_hash: str | None
    problem: tuple[int, str] | None  # without the revision check, which needs the DaemonSet
    # The `app` and `app.kubernetes.io/component` labels: the NVIDIADriver hand-over finds the
    # driver pods a deleted ClusterPolicy DaemonSet left running by them.
    app: str | None = None
    component: str | None = None
    # The most restarts of any of its containers, and the Kubernetes reasons behind a problem
    # (waiting containers' reasons, `Unschedulable`): status/rollout.py tells planned work from
    # failures by them.
    restarts: int = 0
    reasons: tuple[str, ...] = ()


def _reasons(pod: Obj) -> tuple[str, ...]:
    """The waiting reasons of its containers (init containers included) and, for a pod the
    scheduler could not place, the PodScheduled condition's reason; sorted, without repeats."""
    status = pod.get("status") or {}
    found: set[str] = set()
    for container in (*(status.get("initContainerStatuses") or []),
                      *(status.get("containerStatuses") or [])):  # fmt: skip
        waiting = (container.get("state") or {}).get("waiting")
        if waiting is not None and waiting.get("reason"):
            found.add(str(waiting["reason"]))
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            found.add(str(condition.get("reason") or "Unschedulable"))
    return tuple(sorted(found))


def _restarts(pod: Obj) -> int:
    status = pod.get("status") or {}
    counts = [
        _int(c.get("restartCount"))
        for c in (*(status.get("initContainerStatuses") or []),
                  *(status.get("containerStatuses") or []))
    ]  # fmt: skip
    return max(counts, default=0)


def _shared(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) and value else value


def summarize(pod: Obj) -> PodSummary:
    """The summary of one pod (see PodSummary). The strings thousands of pods repeat (node,
    owners, revision, app labels) are interned: one copy each in a cache of every pod."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    problem = pod_problem(pod)
    return PodSummary(
        name=str(meta.get("name", "?")),
        node=sys.intern(str(pod.get("spec", {}).get("nodeName") or "")),
        owner_uids=tuple(
            sys.intern(str(ref.get("uid"))) for ref in meta.get("ownerReferences") or []
        ),
        revision_hash=_shared(labels.get(REVISION_HASH_LABEL)),
        problem=problem,
        app=_shared(labels.get("app")),
        component=_shared(labels.get("app.kubernetes.io/component")),
        restarts=_restarts(pod),
        reasons=_reasons(pod) if problem is not None else (),
    )


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) else 0


def _owned(
    pods: list[Obj] | list[PodSummary], owner: Obj, *, known: bool = False
) -> list[PodSummary]:
    """The pods `owner` owns, its uid read once (a status pass asks this of every DaemonSet's
    thousands of pods). `known`: `pods` are summaries already picked by this owner's uid (the
    operator's pods-by-owner index), taken as they are."""
    uid = owner.get("metadata", {}).get("uid")
    if not uid:
        return []  # an owner without a uid (rendered, never applied) owns nothing yet
    if known:
        return cast(list[PodSummary], pods)
    return [p for p in _summaries(pods) if uid in p.owner_uids]


def newest_revision_hash(ds: Obj, revisions: list[Obj]) -> str | None:
    """The hash of the DaemonSet's newest ControllerRevision (highest `.revision`)."""
    name = ds["metadata"]["name"]
    own = [r for r in revisions if r.get("metadata", {}).get("name", "").startswith(name)]
    if not own:
        return None
    newest = max(own, key=lambda r: _int(r.get("revision")))
    labels = newest.get("metadata", {}).get("labels") or {}
    found = labels.get(REVISION_HASH_LABEL)
    if found:
        return str(found)
    # A revision is named `<ds>-<hash>` when it carries no hash label.
    return str(newest["metadata"]["name"]).removeprefix(f"{name}-")


def _container_problem(statuses: list[Obj], kind: str) -> tuple[int, str] | None:
    """(severity, text) of the worst container status; higher severity is reported first."""
    worst: tuple[int, str] | None = None
    for status in statuses:
        name = status.get("name", "?")
        state = status.get("state") or {}
        restarts = _int(status.get("restartCount"))
        found: tuple[int, str] | None = None
        waiting = state.get("waiting")
        terminated = state.get("terminated")
        if waiting is not None:
            reason = waiting.get("reason") or "Waiting"
            severity = 1 if reason in _BENIGN_WAITING else 3
            text = f"{kind} {name} in {reason}"
            message = waiting.get("message")
            if message and reason in _QUOTE_MESSAGE:
                text += f": {message}"
            else:
                # A container crash-looping says why it failed last time in its message.
                last = termination_message((status.get("lastState") or {}).get("terminated"))
                if last:
                    text += f": {last}"
            if restarts:
                text += f" (restarted {restarts} times)"
            found = (severity, text)
        elif kind == "init container" and state.get("running") is not None and restarts:
            # Retrying after a failure: the last failure is the best evidence there is.
            last = termination_message((status.get("lastState") or {}).get("terminated"))
            if last:
                found = (3, f"{kind} {name} is retrying (restarted {restarts} times): {last}")
        elif terminated is not None and _int(terminated.get("exitCode")) != 0:
            reason = terminated.get("reason") or "Error"
            code = _int(terminated.get("exitCode"))
            text = f"{kind} {name} terminated with exit code {code} ({reason})"
            last = termination_message(terminated)
            found = (3, f"{text}: {last}" if last else text)
        elif kind == "container" and not status.get("ready", False):
            suffix = f" (restarted {restarts} times)" if restarts else ""
            found = (2, f"{kind} {name} is not ready{suffix}")
        if found is not None and (worst is None or found[0] > worst[0]):
            worst = found
    return worst


def pod_problem(pod: Obj, newest_hash: str | None = None) -> tuple[int, str] | None:
    """The most telling problem of one pod, or None when it is Running and ready."""
    status = pod.get("status") or {}
    labels = pod.get("metadata", {}).get("labels") or {}
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return (1, "terminating")
    phase = status.get("phase") or "Pending"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "Unschedulable"
            message = condition.get("message")
            return (4, f"pod not scheduled ({reason}{': ' + message if message else ''})")
    problems = [
        p
        for p in (
            _container_problem(status.get("initContainerStatuses") or [], "init container"),
            _container_problem(status.get("containerStatuses") or [], "container"),
        )
        if p is not None
    ]
    if problems:
        worst = max(problems, key=lambda p: p[0])
        if worst[0] > 1 or phase != "Running":
            return worst
    if phase in ("Failed", "Succeeded"):
        return (3, f"pod {phase}{': ' + status['reason'] if status.get('reason') else ''}")
    if phase != "Running":
        return (1, f"pod {phase}")
    if problems:
        return problems[0]
    if newest_hash is not None and labels.get(REVISION_HASH_LABEL) != newest_hash:
        return (2, "runs an out-of-date revision (waiting to be replaced)")
    return None


class PodIssue(NamedTuple):
    """A pod of a DaemonSet with a problem: the pod, its problem, whether it is out of date."""

    pod: PodSummary
    severity: int
    text: str
    outdated: bool


def pod_issues(
    ds: Obj, pods: list[Obj] | list[PodSummary], revisions: list[Obj], *, owned: bool = False
) -> list[PodIssue]:
    """The DaemonSet's pods that have a problem, an out-of-date revision (OnDelete) included.
    `owned`: `pods` are the DaemonSet's pod summaries already (picked by its uid)."""
    strategy = (ds.get("spec", {}).get("updateStrategy") or {}).get("type", "RollingUpdate")
    newest = newest_revision_hash(ds, revisions) if strategy == "OnDelete" else None
    found = []
    for pod in _owned(pods, ds, known=owned):
        outdated = newest is not None and pod.revision_hash != newest
        problem = pod.problem
        if problem is None and outdated:
            problem = (2, "runs an out-of-date revision (waiting to be replaced)")
        if problem is not None:
            found.append(PodIssue(pod, problem[0], problem[1], outdated))
    return found


def _first_problem(pods: list[PodSummary], newest_hash: str | None) -> tuple[int, str]:
    """How many pods have a problem and a description of the most severe one."""
    found: list[tuple[int, str, str]] = []
    for pod in pods:
        problem = pod.problem
        if problem is None and newest_hash is not None and pod.revision_hash != newest_hash:
            problem = (2, "runs an out-of-date revision (waiting to be replaced)")
        if problem is not None:
            found.append((problem[0], pod.node or pod.name, problem[1]))
    if not found:
        return 0, ""
    severity = max(f[0] for f in found)
    node, text = next((n, t) for s, n, t in found if s == severity)
    return len(found), f"{node}: {text}"


def _summaries(pods: list[Obj] | list[PodSummary]) -> list[PodSummary]:
    return [p if isinstance(p, PodSummary) else summarize(p) for p in pods]


def daemonset_readiness(
    ds: Obj, pods: list[Obj] | list[PodSummary], revisions: list[Obj], *, owned: bool = False
) -> Readiness:
    """Upstream's DaemonSet readiness (OnDelete revision check included), explained.

    `pods` may be pod objects or their summaries; `owned`: they are the DaemonSet's pod
    summaries already (picked by its uid), so they are not filtered again.
    """
    name = ds.get("metadata", {}).get("name", "?")
    status = ds.get("status") or {}
    desired = _int(status.get("desiredNumberScheduled"))
    # Until the DaemonSet controller has seen the latest spec, its counts (even "0 desired")
    # describe an older one, so nothing else can be concluded.
    if _int(status.get("observedGeneration")) < _int(ds.get("metadata", {}).get("generation")):
        reason = f"{name}: the DaemonSet controller has not seen the latest spec yet"
        return Readiness(False, desired, max(desired, 1), reason)
    if desired == 0:
        return Readiness(True, 0, 0, "")
    mine = _owned(pods, ds, known=owned)
    strategy = (ds.get("spec", {}).get("updateStrategy") or {}).get("type", "RollingUpdate")
    newest = newest_revision_hash(ds, revisions) if strategy == "OnDelete" else None
    problems, detail = _first_problem(mine, newest)

    def not_ready(count: int, summary: str) -> Readiness:
        count = max(count, 1)
        reason = f"{name}: {summary}" + (f"; {detail}" if detail else "")
        return Readiness(False, desired, count, reason)

    unavailable = _int(status.get("numberUnavailable"))
    if unavailable != 0:
        return not_ready(unavailable, f"{unavailable}/{desired} pods not ready")
    if strategy != "OnDelete":
        updated = _int(status.get("updatedNumberScheduled"))
        available = _int(status.get("numberAvailable"))
        if updated != desired or available != desired:
            lagging = desired - min(updated, available)
            return not_ready(
                lagging, f"{updated}/{desired} pods updated, {available}/{desired} available"
            )
        return Readiness(True, desired, 0, "")
    if not mine:
        return not_ready(desired, f"0/{desired} pods exist")
    if newest is None:
        return not_ready(desired, "no ControllerRevision found")
    if problems:
        return not_ready(problems, f"{problems}/{desired} pods not ready or not up to date")
    return Readiness(True, desired, 0, "")
