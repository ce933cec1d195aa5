"""`gpu-operator must-gather`: one tar.gz with what a maintainer needs to debug a GPU cluster.

Never reads a Secret; every text it writes (logs, objects, Events, explain output, what was left
out) goes through `redact`, which replaces credentials found by shape or by name, and
MANIFEST.txt says how many of each kind were replaced. Bounded: each
log is cut to LOG_TAIL_LINES lines and LOG_LIMIT_BYTES bytes, all logs together to
TOTAL_LOG_BYTES, and the whole run to a deadline; what was left out is listed in MANIFEST.txt.
Logs are read PARALLEL at a time and committed in a fixed order, so the archive does not depend
on which read finished first.

Upstream's hack/must-gather.sh runs `kubectl logs --all-containers` and again with `--previous`
for every operand pod, one pod after the other and without a bound; at thousands of nodes that
is tens of thousands of sequential requests, half of them for previous runs that do not exist.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from lightkube import AsyncClient

from gpu_operator.api import keys
from gpu_operator.kube import explain_read, redact, resources
from gpu_operator.nodes import gate
from gpu_operator.operands import readiness
from gpu_operator.status import explain

Obj = dict[str, Any]
ROOT = "must-gather"
LOG_TAIL_LINES = 2000
LOG_LIMIT_BYTES = 256 * 1024
TOTAL_LOG_BYTES = 64 * 1024 * 1024
DEADLINE_SECONDS = 300.0
# Events written: at 5,000 nodes the operand namespace holds ~100,000 (Scheduled, Pulled, ...
# per pod), ~80 MB of YAML; the newest Warnings matter, not the bulk of Normal ones.
EVENT_LIMIT = 10_000
# Log reads in flight at once: enough to hide the API server -> kubelet round trip of each read,
# few enough that a debugging run does not load the API server of a struggling cluster.
PARALLEL = 16
REDACTED = redact.REDACTED


# libyaml's emitter when PyYAML has it: the pure-Python one takes minutes for 20,000 pods.
_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass
class Archive:
    """The archive being built, in memory, what was left out and what was redacted (per kind).

    Objects are redacted as objects, before they become YAML or JSON: names are still keys
    then, and no line folding can split a value."""

    files: dict[str, bytes] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    log_bytes: int = 0
    redacted: Counter[str] = field(default_factory=Counter)

    def add(self, path: str, text: str) -> None:
        """Add a text, redacted."""
        clean, counts = redact.redact_text(text)
        self.redacted.update(counts)
        self.files[f"{ROOT}/{path}"] = clean.encode()

    def add_redacted(self, path: str, data: bytes) -> None:
        """Add bytes that went through `redact` already (the logs, MANIFEST.txt)."""
        self.files[f"{ROOT}/{path}"] = data

    def add_objects(self, path: str, objects: list[Obj]) -> None:
        """Add API objects as a YAML stream, redacted."""
        documents, counts = redact.redact_value(objects)
        self.redacted.update(counts)
        text = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False)
        self.add_redacted(path, text.encode())

    def add_json(self, path: str, value: Any) -> None:
        """Add a JSON document, redacted."""
        clean, counts = redact.redact_value(value)
        self.redacted.update(counts)
        self.add_redacted(path, json.dumps(clean, indent=2).encode())

    def tar_gz(self) -> bytes:
        buffer = io.BytesIO()
        mtime = int(time.time())
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in sorted(self.files.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = mtime
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


@dataclass(frozen=True)
class LogRead:
    """One container log to read: the current run, or the previous one."""

    pod: str
    container: str
    previous: bool = False

    @property
    def path(self) -> str:
        return f"logs/{self.pod}/{self.container}{'.previous.log' if self.previous else '.log'}"


def _is_operator(pod: Obj) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    # Ours carries the component label; upstream's operator pod `app: gpu-operator`.
    return "gpu-operator" in (labels.get("app.kubernetes.io/component"), labels.get("app"))


def log_reads(pods: Sequence[Obj]) -> list[LogRead]:
    """The logs worth a request: every container that has run (current), and the previous run
    only where restartCount > 0 (otherwise there is none and the request only gets a 400).

    Read first what a maintainer needs most, so the deadline or the byte budget cuts the rest:
    the operator's own logs, then containers failing or restarted, then the healthy ones; by
    pod name within each.
    """
    ranked: list[tuple[int, str, int, LogRead]] = []
    for pod in pods:
        name = str(pod["metadata"]["name"])
        operator = _is_operator(pod)
        for order, view in enumerate(explain.container_views(pod)):
            if view.state == "waiting" and not view.restarts:
                continue  # never started: no log yet
            troubled = view.restarts > 0 or not (view.ready or view.succeeded)
            rank = 0 if operator else 1 if troubled else 2
            ranked.append((rank, name, 2 * order, LogRead(name, view.name)))
            if view.restarts:
                ranked.append((rank, name, 2 * order + 1, LogRead(name, view.name, True)))
    return [read for *_, read in sorted(ranked, key=lambda r: r[:3])]


@dataclass
class Logs:
    """What `collect_logs` kept (in read order), what it left out and why, and the requests."""

    files: list[tuple[str, bytes]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    bytes: int = 0
    requests: int = 0
    # What redaction replaced in the kept logs and in the reasons of the ones left out.
    redacted: Counter[str] = field(default_factory=Counter)


def cut(data: bytes, limit: int) -> bytes:
    """At most `limit` bytes, without a UTF-8 character cut in half at the end."""
    if len(data) <= limit:
        return data
    return data[:limit].decode("utf-8", "ignore").encode()


_PENDING = object()


async def collect_logs(
    reads: Sequence[LogRead],
    read: Callable[[LogRead], Awaitable[str]],
    *,
    parallel: int = PARALLEL,
    timeout: float = DEADLINE_SECONDS,
    per_log_bytes: int = LOG_LIMIT_BYTES,
    total_bytes: int = TOTAL_LOG_BYTES,
    progress: Callable[[str, int, int], None] = lambda what, done, total: None,
) -> Logs:
    """Read `reads` with at most `parallel` in flight, for at most `timeout` seconds.

    Results are committed in the order of `reads`, whatever order they finish in, until the
    first log that does not fit in what `total_bytes` leaves: the limit is exact and the archive
    is the one a sequential run would make. No read starts once the budget is spent. Reads still
    in flight at the timeout are cancelled; they and the ones never started are listed.
    Each log is redacted before it is cut to `per_log_bytes`; its counts are those of the log
    as read.
    """
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    logs = Logs()
    results: list[object] = [_PENDING] * len(reads)
    next_read = 0  # the next read a worker takes
    committed = 0  # reads[:committed] are in logs.files or logs.left_out
    finished = 0
    full = False  # a log did not fit: the ones after it are left out too
    # Bytes read but not committed yet (an earlier read is still running). When they and the
    # committed ones exceed the budget, some log up to the last finished one will not fit, so
    # no later read can be kept: stop reading.
    waiting = 0

    def commit() -> None:
        nonlocal committed, full, waiting
        while committed < len(reads) and results[committed] is not _PENDING:
            result, results[committed] = results[committed], None
            path = reads[committed].path
            if isinstance(result, str):  # the reason the read failed
                reason, counts = redact.redact_text(result)
                logs.redacted.update(counts)
                logs.left_out.append(f"{path}: {reason}")
            elif not isinstance(result, tuple):  # pragma: no cover - only these are stored
                raise AssertionError(result)
            elif full or logs.bytes + len(result[0]) > total_bytes:
                full = True
                waiting -= len(result[0])
                logs.left_out.append(f"{path}: total log limit")
            else:
                data, counts = result
                waiting -= len(data)
                logs.bytes += len(data)
                logs.files.append((path, data))
                logs.redacted.update(counts)
            committed += 1

    async def worker() -> None:
        nonlocal next_read, finished, waiting
        while next_read < len(reads) and not full and logs.bytes + waiting <= total_bytes:
            index, next_read = next_read, next_read + 1
            logs.requests += 1
            try:
                text = await read(reads[index])
            except Exception as exc:  # one failed read must not lose the archive
                results[index] = f"read failed: {exc}"
            else:
                clean, counts = redact.redact_text(text)
                data = cut(clean.encode(), per_log_bytes)
                results[index] = (data, counts)
                waiting += len(data)
            finished += 1
            progress("logs", finished, len(reads))
            commit()

    progress("logs", 0, len(reads))
    workers = [asyncio.create_task(worker()) for _ in range(min(parallel, len(reads)))]
    timed_out = False
    if workers:
        _, pending = await asyncio.wait(workers, timeout=max(timeout, 0.0))
        timed_out = bool(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in workers:
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error  # a bug in progress() or commit(), not a failed read
    spent = full or logs.bytes + waiting > total_bytes
    reason = "total log limit" if spent or not timed_out else "deadline"
    for index, result in enumerate(results):
        if result is _PENDING:
            results[index] = reason
    commit()
    if finished < len(reads):  # the rest is accounted for (left out): the bar ends full
        progress("logs", len(reads), len(reads))
    return logs


def node_summary(node: Obj) -> Obj:
    """A GPU node's labels, annotations, conditions, capacity and taints (no images, no ids)."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return {
        "name": meta.get("name"),
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
        "taints": (node.get("spec") or {}).get("taints") or [],
        "capacity": status.get("capacity") or {},
        "allocatable": status.get("allocatable") or {},
        "conditions": status.get("conditions") or [],
        "nodeInfo": status.get("nodeInfo") or {},
    }


def events_by_object(events: list[Obj]) -> dict[str, list[Obj]]:
    """Events grouped by the name of the object they are about (one pass for all nodes)."""
    out: dict[str, list[Obj]] = {}
    for event in events:
        out.setdefault(str((event.get("involvedObject") or {}).get("name")), []).append(event)
    return out


def _event_time(event: Obj) -> str:
    meta = event.get("metadata") or {}
    series = event.get("series") or {}
    return str(
        series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
        or meta.get("creationTimestamp") or ""
    )  # fmt: skip


def newest_events(events: list[Obj], limit: int = EVENT_LIMIT) -> list[Obj]:
    """At most `limit` events, Warnings before Normal ones and newest first among each, kept in
    their listed order."""
    if len(events) <= limit:
        return events
    ranked = sorted(
        range(len(events)),
        key=lambda i: (events[i].get("type") == "Warning", _event_time(events[i])),
        reverse=True,
    )
    return [events[i] for i in sorted(ranked[:limit])]


def dra_facts_by_node(
    names: Sequence[str], plugin_pods: list[Obj], slices: list[Obj] | None
) -> dict[str, explain.DraFacts]:
    """The DRA chain's facts of each DRA node from lists read once for all nodes: the DRA
    kubelet plugin's pods (any namespace) and the ResourceSlices (None: resource.k8s.io/v1 not
    served). Claims are not read (their pods' Events would cost a request per claim)."""
    pods: dict[str, list[explain.PodView]] = {}
    for pod in plugin_pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        problem = readiness.pod_problem(pod)
        view = explain.pod_view(pod, problem[1] if problem else None)
        pods.setdefault(str((pod.get("spec") or {}).get("nodeName")), []).append(view)
    by_node: dict[str, list[Obj]] = {}
    for found in slices or ():
        by_node.setdefault(str((found.get("spec") or {}).get("nodeName")), []).append(found)
    return {
        name: explain.DraFacts(
            mode="label",
            plugin_pods=tuple(pods.get(name, ())),
            slices=tuple(by_node.get(name, ())) if slices is not None else None,
            claims=None,
        )
        for name in names
    }


def facts_for(
    node: Obj,
    pods: list[Obj],
    events: dict[str, list[Obj]],
    daemonsets: dict[str, Obj],
    policy: Obj | None,
    startup_taint: gate.StartupTaint | None = None,
    dra: explain.DraFacts | None = None,
) -> explain.NodeFacts:
    """The chain's snapshot of one node from objects already read (no log reads); `events` is
    `events_by_object`'s index, so each node costs its own events only."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    names = dict.fromkeys([str(meta.get("name"))])
    names.update(dict.fromkeys(str((p.get("metadata") or {}).get("name")) for p in pods))
    views = []
    for pod in pods:
        problem = readiness.pod_problem(pod)
        views.append(explain.pod_view(pod, problem[1] if problem else None))
    return explain.NodeFacts(
        name=str(meta.get("name")),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        capacity=status.get("capacity") or {},
        allocatable=status.get("allocatable") or {},
        conditions=status.get("conditions") or [],
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        pods=tuple(views),
        events=[e for name in names for e in events.get(name, ())],
        policy=explain.policy_view(policy.get("spec")) if policy else None,
        daemonsets=daemonsets,
        taints=list((node.get("spec") or {}).get("taints") or []),
        startup_taint=startup_taint,
        dra=dra,
    )


async def _list(client: AsyncClient, resource: Any, **kwargs: Any) -> list[Obj]:
    return await explain_read._list(client, resource, **kwargs)


async def gather(
    client: AsyncClient,
    namespace: str | None = None,
    *,
    deadline: float = DEADLINE_SECONDS,
    total_log_bytes: int = TOTAL_LOG_BYTES,
    parallel: int = PARALLEL,
    progress: Callable[[str, int, int], None] = lambda what, done, total: None,
) -> Archive:
    """Read everything into an Archive; `progress(step, done, total)` follows the log reads.

    Every kind is listed once for all nodes (the per-node explain works from those lists);
    the logs are what scales with the cluster, read `parallel` at a time until the deadline.
    """
    start = time.monotonic()
    archive = Archive()
    found, drivers, nodes = await asyncio.gather(
        explain_read.policies(client),
        _list(client, resources.NVIDIA_DRIVER),
        explain_read.gpu_nodes(client),
    )
    policy = explain_read.active_policy(found)
    ns = explain_read.operator_namespace(policy, namespace)
    pods, daemonsets, deployments, events, default_events = await asyncio.gather(
        _list(client, resources.POD, namespace=ns),
        _list(client, resources.DAEMONSET, namespace=ns),
        _list(client, resources.resource("apps/v1", "Deployment"), namespace=ns),
        _list(client, resources.EVENT, namespace=ns),
        _list(client, resources.EVENT, namespace="default"),
    )
    node_names = {str(n["metadata"]["name"]) for n in nodes}
    # The operator records Events about cluster-scoped objects in `default` (kube/writer.py).
    events += [
        e
        for e in default_events
        if (e.get("involvedObject") or {}).get("name") in node_names
        or (e.get("involvedObject") or {}).get("kind") in ("ClusterPolicy", "NVIDIADriver")
    ]
    archive.add_objects("cluster/clusterpolicies.yaml", found)
    archive.add_objects("cluster/nvidiadrivers.yaml", drivers)
    archive.add_objects("cluster/gpu-nodes.yaml", [node_summary(n) for n in nodes])
    archive.add_objects(f"namespaces/{ns}/pods.yaml", pods)
    archive.add_objects(f"namespaces/{ns}/daemonsets.yaml", daemonsets)
    archive.add_objects(f"namespaces/{ns}/deployments.yaml", deployments)
    kept = newest_events(events)
    if len(kept) < len(events):
        archive.left_out.append(
            f"namespaces/{ns}/events.yaml: {len(events) - len(kept)} event(s) beyond "
            f"{EVENT_LIMIT} (Normal and oldest first)"
        )
    archive.add_objects(f"namespaces/{ns}/events.yaml", kept)
    if policy is not None:
        rendered = _rendered(policy, nodes, ns)
        if isinstance(rendered, str):
            archive.add("rendered.yaml", rendered)
        else:
            archive.add_objects("rendered.yaml", rendered)
    by_app: dict[str, Obj] = {}
    for ds in daemonsets:
        meta = ds.get("metadata") or {}
        by_app[str((meta.get("labels") or {}).get("app") or meta.get("name"))] = ds
    pods_by_node: dict[str, list[Obj]] = {}
    for pod in pods:
        pods_by_node.setdefault(str((pod.get("spec") or {}).get("nodeName")), []).append(pod)
    index = events_by_object(events)
    taint = explain_read.startup_taint_of(deployments)
    # DRA nodes (nvidia.com/dra-kubelet-plugin=true): the plugin's pods and the slices, listed
    # once and only when there is one.
    dra_names = [
        str(n["metadata"]["name"])
        for n in nodes
        if (n["metadata"].get("labels") or {}).get(keys.DRA_NODE) == "true"
    ]
    dra: dict[str, explain.DraFacts] = {}
    if dra_names:
        plugin_pods, slices = await asyncio.gather(
            _list(client, resources.POD, namespace=resources.ALL_NAMESPACES,
                  labels={"app": explain.DRA_PLUGIN_APP}),
            explain_read._served(client, resources.RESOURCE_SLICE),
        )  # fmt: skip
        dra = dra_facts_by_node(dra_names, plugin_pods, slices)
        if slices is not None:
            archive.add_objects("cluster/resourceslices.yaml", slices)
    for node in nodes:
        name = str(node["metadata"]["name"])
        facts = facts_for(
            node, pods_by_node.get(name, []), index, by_app, policy, taint, dra.get(name)
        )
        archive.add_json(f"explain/{name}.json", explain.explain(facts).to_dict())

    async def read(item: LogRead) -> str:
        return await explain_read.pod_log(
            client, ns, item.pod, item.container, previous=item.previous,
            tail_lines=LOG_TAIL_LINES, limit_bytes=LOG_LIMIT_BYTES,
        )  # fmt: skip

    logs = await collect_logs(
        log_reads(pods), read, parallel=parallel, timeout=deadline - (time.monotonic() - start),
        total_bytes=total_log_bytes, progress=progress,
    )  # fmt: skip
    for path, data in logs.files:
        archive.add_redacted(path, data)
    archive.log_bytes = logs.bytes
    archive.left_out.extend(logs.left_out)
    archive.redacted.update(logs.redacted)
    manifest = [
        f"gpu-operator must-gather: namespace {ns}, {len(nodes)} GPU node(s), "
        f"{len(pods)} pod(s), {logs.requests} log request(s) ({parallel} at a time), "
        f"{time.monotonic() - start:.1f}s",
        f"limits: {LOG_TAIL_LINES} lines and {LOG_LIMIT_BYTES} bytes per log, "
        f"{total_log_bytes} bytes of logs in all, {EVENT_LIMIT} events, {deadline:.0f}s",
        *redaction_lines(archive.redacted),
        "left out:",
        *(f"  {item}" for item in archive.left_out or ["nothing"]),
        "files:",
        *(f"  {n.removeprefix(ROOT + '/')}" for n in sorted(archive.files)),
    ]
    # Written as is: its lines are redacted already, and the kinds' descriptions would be
    # taken for credentials (`token=`).
    archive.add_redacted("MANIFEST.txt", ("\n".join(manifest) + "\n").encode())
    return archive


def redaction_lines(counts: Counter[str]) -> list[str]:
    """MANIFEST.txt's account of what was redacted: each kind found, how many, what it covers."""
    found = [kind for kind in redact.KINDS if counts.get(kind)]
    lines = [
        f"redacted (values replaced by {REDACTED} in the files below; Secrets are never read): "
        f"{sum(counts[k] for k in found) or 'nothing'}"
    ]
    lines.extend(f"  {kind}: {counts[kind]} ({redact.KINDS[kind]})" for kind in found)
    return lines


def _rendered(policy: Obj, nodes: list[Obj], namespace: str) -> list[Obj] | str:
    """What the operator renders for the live policy and these nodes (as `gpu-operator render`)."""
    from gpu_operator import api
    from gpu_operator.controller import facts as facts_mod
    from gpu_operator.controller import strip
    from gpu_operator.operands import registry

    checked = api.check_document(policy)
    if not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
        return "# the live ClusterPolicy is invalid: " + "; ".join(map(str, checked.errors)) + "\n"
    facts = facts_mod.from_nodes(
        [strip.node(n) for n in nodes],
        namespace=namespace,
        operator_env={},
        has_servicemonitor_crd=False,
        has_prometheusrule_crd=False,
    )
    documents: list[Obj] = []
    for state in registry.render_all(checked.obj, facts):
        if state.error is not None:
            documents.append({"state": state.name, "error": state.error})
        documents.extend(state.objects)
    return documents
