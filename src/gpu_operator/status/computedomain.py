"""The compute-domain controller's decisions for one ComputeDomain (pure).

Facts in (the domain, the driver's channel devices by node and clique, the nodes a channel claim
of the domain was prepared on, the domain's IMEX daemon pods), plan out: the workload's
ResourceClaimTemplate, the IMEX DaemonSet and its claim template, the ComputeDomainCliques, the
status and the Events to record. controller/computedomain.py observes and executes.

As NVIDIA's controller: the workload template asks for one channel of class
`compute-domain-default-channel.nvidia.com` with an opaque `ComputeDomainChannelConfig` naming
the domain; the DaemonSet `computedomain-daemon-<uid>` in the driver's namespace selects the nodes
labelled `resource.nvidia.com/computeDomain=<uid>` (the kubelet plugin sets it when it prepares a
channel there), so daemons run on exactly the workload's nodes and go when its pods go. Ours
adds the clique: the template's channel request selects one NVLink clique (the first with at
least numNodes nodes offering a channel, chosen when the template is made: templates are
immutable), so every pod of the domain lands in one NVLink partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api import computedomain as cdapi

Obj = dict[str, Any]

DAEMON_CONTAINER = "compute-domain-daemon"
DAEMON_ENTRY = "compute-domain-daemon"
DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
# The daemon writes what keeps its IMEX domain from being whole here, on its own pod.
PROBLEMS_ANNOTATION = "resource.nvidia.com/imex-problems"
CHANNEL_REQUEST = "channel"
DAEMON_REQUEST = "daemon"


@dataclass(frozen=True)
class DaemonPod:
    """One IMEX daemon pod of the domain, as observed."""

    name: str
    node: str
    ip: str
    ready: bool
    problems: str = ""  # the daemon's own report (PROBLEMS_ANNOTATION)
    deleting: bool = False


@dataclass(frozen=True)
class Facts:
    domain: Mapping[str, Any]
    namespace: str  # the driver's (where the DaemonSet and cliques live)
    image: str
    # node -> clique (`<cluster UUID>.<clique id>`, "" for none) of every node publishing a channel.
    channel_nodes: Mapping[str, str] = field(default_factory=dict)
    # Nodes labelled for this domain (a channel claim was prepared there).
    labelled_nodes: Sequence[str] = ()
    daemons: Sequence[DaemonPod] = ()
    # The clique the existing workload template selects (None: no template yet).
    template_clique: str | None = None
    template_exists: bool = False
    pull_secrets: Sequence[str] = ()


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    apply: tuple[Obj, ...]
    status: Obj
    events: tuple[Event, ...] = ()
    clique: str | None = None
    finalize: bool = False  # the domain is being deleted: delete its objects, drop the finalizer


def _meta(domain: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = domain.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")


def daemonset_name(uid: str) -> str:
    return f"computedomain-daemon-{uid}"


def clique_sizes(channel_nodes: Mapping[str, str]) -> dict[str, int]:
    """How many nodes offer a channel in each NVLink clique (nodes without a clique left out)."""
    sizes: dict[str, int] = {}
    for clique in channel_nodes.values():
        if clique:
            sizes[clique] = sizes.get(clique, 0) + 1
    return sizes


def _sizes_text(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{c}: {n}" for c, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])))


def choose_clique(num_nodes: int, channel_nodes: Mapping[str, str]) -> tuple[str | None, str]:
    """The clique with the most nodes offering a channel (ties: the first by name), and why the
    domain does not fit when that clique has fewer than `num_nodes` nodes ("" when it fits).
    None when no node offers a channel in a clique yet.

    A domain larger than every clique still gets the largest: its workload template must exist so
    that the scheduler places the pods that fit and says why the others stay Pending ("cannot
    allocate all claims"), rather than every pod waiting for a template that never comes."""
    sizes = clique_sizes(channel_nodes)
    if not sizes:
        return None, "no node publishes a compute-domain channel in an NVLink clique yet"
    best = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return best, _misfit(num_nodes, best, sizes)


def _misfit(num_nodes: int, clique: str, sizes: Mapping[str, int]) -> str:
    have = sizes.get(clique, 0)
    if have >= max(num_nodes, 1):
        return ""
    return (
        f"numNodes {num_nodes} does not fit in one NVLink clique: the channel template selects "
        f"clique {clique} with {have} node(s) offering a channel (cliques by size: "
        f"{_sizes_text(sizes) or 'none'}); at most {have} pod(s) of the domain get a channel, "
        "the others stay Pending (FailedScheduling: cannot allocate all claims)"
    )


def _template(domain: Mapping[str, Any]) -> str:
    channel = (domain.get("spec") or {}).get("channel") or {}
    return str((channel.get("resourceClaimTemplate") or {}).get("name") or "")


def workload_template(domain: Mapping[str, Any], clique: str) -> Obj:
    ns, _, uid = _meta(domain)
    channel = (domain.get("spec") or {}).get("channel") or {}
    mode = channel.get("allocationMode") or cdapi.ALLOCATION_SINGLE
    name = str((channel.get("resourceClaimTemplate") or {}).get("name") or "")
    selector = f"device.attributes['{cdapi.DRIVER}'].cliqueID == '{clique}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {
                cdapi.DOMAIN_LABEL: uid,
                cdapi.TARGET_LABEL: cdapi.TARGET_WORKLOAD,
                cdapi.CLIQUE_LABEL: clique.rsplit(".", 1)[-1],
            },
            "annotations": {cdapi.NODE_CLIQUE_LABEL: clique},
        },
        "spec": {"spec": {"devices": {
            "requests": [{"name": CHANNEL_REQUEST, "exactly": {
                "deviceClassName": cdapi.DEFAULT_CHANNEL_CLASS,
                "selectors": [{"cel": {"expression": selector}}],
            }}],
            "config": [{"requests": [CHANNEL_REQUEST], "opaque": {
                "driver": cdapi.DRIVER,
                "parameters": {
                    "apiVersion": cdapi.API_VERSION, "kind": cdapi.CHANNEL_CONFIG_KIND,
                    "domainID": uid, "allocationMode": mode,
                },
            }}],
        }}},
    }  # fmt: skip


def daemon_template(domain: Mapping[str, Any], namespace: str) -> Obj:
    _, _, uid = _meta(domain)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": daemonset_name(uid),
            "namespace": namespace,
            "labels": {cdapi.DOMAIN_LABEL: uid, cdapi.TARGET_LABEL: cdapi.TARGET_DAEMON},
        },
        "spec": {"spec": {"devices": {
            "requests": [{"name": DAEMON_REQUEST,
                          "exactly": {"deviceClassName": cdapi.DAEMON_CLASS}}],
            "config": [{"requests": [DAEMON_REQUEST], "opaque": {
                "driver": cdapi.DRIVER,
                "parameters": {"apiVersion": cdapi.API_VERSION, "kind": cdapi.DAEMON_CONFIG_KIND,
                               "domainID": uid},
            }}],
        }}},
    }  # fmt: skip


def daemonset(domain: Mapping[str, Any], facts: Facts) -> Obj:
    ns, name, uid = _meta(domain)
    check = [DAEMON_ENTRY, "-v", "$(LOG_VERBOSITY)", "check"]
    field_env = (
        ("NODE_NAME", "spec.nodeName"), ("POD_IP", "status.podIP"), ("POD_UID", "metadata.uid"),
        ("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
    )  # fmt: skip
    pod: Obj = {
        "serviceAccountName": DAEMON_ACCOUNT,
        "nodeSelector": {cdapi.DOMAIN_LABEL: uid},
        "containers": [{
            "name": DAEMON_CONTAINER,
            "image": facts.image,
            "command": [DAEMON_ENTRY, "-v", "$(LOG_VERBOSITY)", "run"],
            "env": [
                {"name": "LOG_VERBOSITY", "value": "4"},
                *({"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field_env),
                {"name": "COMPUTE_DOMAIN_NAME", "value": name},
                {"name": "COMPUTE_DOMAIN_NAMESPACE", "value": ns},
                # Not a GPU container: the runtime must inject no GPU.
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
            ],
            "resources": {"claims": [{"name": DAEMON_CONTAINER}]},
            "startupProbe": {"exec": {"command": check}, "periodSeconds": 1,
                             "timeoutSeconds": 10, "failureThreshold": 1200},
            "livenessProbe": {"exec": {"command": check}, "periodSeconds": 60,
                              "timeoutSeconds": 10, "failureThreshold": 20},
            "readinessProbe": {"exec": {"command": check}, "periodSeconds": 10,
                               "timeoutSeconds": 10, "failureThreshold": 1},
        }],
        # An IMEX daemon must run wherever the workload landed, whatever the node's taints.
        "tolerations": [{"operator": "Exists", "effect": e}
                        for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")],
        "resourceClaims": [{"name": DAEMON_CONTAINER,
                            "resourceClaimTemplateName": daemonset_name(uid)}],
    }  # fmt: skip
    if facts.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in facts.pull_secrets]
    labels = {cdapi.DOMAIN_LABEL: uid}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": daemonset_name(uid), "namespace": facts.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def _nodes(facts: Facts, uid: str) -> tuple[list[Obj], dict[str, list[Obj]]]:
    """status.nodes (index by address order within each clique) and the cliques' daemons."""
    rows: list[Obj] = []
    by_clique: dict[str, list[Obj]] = {}
    live = sorted((d for d in facts.daemons if not d.deleting and d.ip), key=lambda d: d.node)
    for daemon in live:
        clique = facts.channel_nodes.get(daemon.node, "")
        members = by_clique.setdefault(clique, [])
        row = {
            "name": daemon.node,
            "ipAddress": daemon.ip,
            "cliqueID": clique,
            "index": len(members),
            "status": cdapi.READY if daemon.ready and not _own_fault(daemon) else cdapi.NOT_READY,
        }
        members.append(row)
        rows.append(row)
    return rows, by_clique


def _own_fault(daemon: DaemonPod) -> bool:
    """The daemon reports a fault of its own node (not only of a peer)."""
    return any(line.startswith(f"node {daemon.node} ") for line in daemon.problems.splitlines())


def clique_object(uid: str, clique: str, namespace: str, rows: Sequence[Obj]) -> Obj:
    return {
        "apiVersion": cdapi.API_VERSION,
        "kind": cdapi.CLIQUE_KIND,
        "metadata": {
            "name": cdapi.clique_name(uid, clique),
            "namespace": namespace,
            "labels": {cdapi.DOMAIN_LABEL: uid},
        },
        "daemons": [
            {"nodeName": r["name"], "ipAddress": r["ipAddress"], "cliqueID": clique,
             "index": r["index"], "status": r["status"]}
            for r in rows
        ],
    }  # fmt: skip


def plan(facts: Facts) -> Plan:
    """What the controller does for one ComputeDomain now."""
    domain = facts.domain
    ns, name, uid = _meta(domain)
    if (domain.get("metadata") or {}).get("deletionTimestamp"):
        return Plan(apply=(), status={}, finalize=True)
    spec = domain.get("spec") or {}
    num_nodes = int(spec.get("numNodes") or 0)
    events: list[Event] = []
    apply: list[Obj] = []
    clique = facts.template_clique
    if not facts.template_exists:
        clique, why = choose_clique(num_nodes, facts.channel_nodes)
        if clique is None:
            # No template yet: it is immutable and must name a clique; the pods wait for it.
            events.append(Event("Warning", "NoCliqueYet", f"{why}; the pods of ComputeDomain "
                                f"{ns}/{name} wait for its channel template "
                                f"{_template(domain)!r} until one does"))  # fmt: skip
        else:
            apply.append(workload_template(domain, clique))
    else:
        why = _misfit(num_nodes, clique, clique_sizes(facts.channel_nodes)) if clique else ""
    if why and clique is not None:
        events.append(Event("Warning", "NoCliqueFits", why))
    apply += [daemon_template(domain, facts.namespace), daemonset(domain, facts)]
    rows, by_clique = _nodes(facts, uid)
    for c, members in sorted(by_clique.items()):
        if c:
            apply.append(clique_object(uid, c, facts.namespace, members))
    ready = [r for r in rows if r["status"] == cdapi.READY]
    whole = len(ready) >= num_nodes if num_nodes else bool(ready)
    for daemon in sorted(facts.daemons, key=lambda d: d.node):
        for problem in daemon.problems.splitlines():
            reason = "IMEXDaemonNotReady" if _own_fault(daemon) else "IMEXPeerUnreachable"
            if "degraded" in problem and _own_fault(daemon):
                reason = "NVLinkFabricDegraded"
            events.append(Event("Warning", reason, f"node {daemon.node}: {problem}"))
    if any(e.reason not in ("NoCliqueFits", "NoCliqueYet") for e in events):
        whole = False
    status: Obj = {"status": cdapi.READY if whole else cdapi.NOT_READY}
    if rows:
        status["nodes"] = rows
    if whole and (domain.get("status") or {}).get("status") != cdapi.READY:
        events.append(Event("Normal", "Ready", f"IMEX daemons ready on {len(ready)} node(s)"))
    return Plan(apply=tuple(apply), status=status, events=tuple(events), clique=clique)


def explain(domain: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """Lines for `gpu-operator explain computedomain`: the status, each node, and the warnings."""
    ns, name, _ = _meta(domain)
    spec = domain.get("spec") or {}
    status = domain.get("status") or {}
    nodes = status.get("nodes") or []
    ready = [n for n in nodes if n.get("status") == cdapi.READY]
    want = int(spec.get("numNodes") or 0)
    lines = [
        f"ComputeDomain {ns}/{name}: {status.get('status') or cdapi.NOT_READY} "
        f"({len(ready)} of {want or 'any'} node(s) with a ready IMEX daemon)",
    ]
    for n in nodes:
        lines.append(
            f"  node {n.get('name')} ({n.get('ipAddress')}, clique {n.get('cliqueID') or 'none'},"
            f" index {n.get('index')}): {n.get('status')}"
        )
    if not nodes:
        lines.append("  no node yet: no workload pod's channel claim was prepared")
    warnings = [e for e in events if e.get("type") == "Warning"]
    for e in warnings[-10:]:
        lines.append(f"  {e.get('reason')}: {e.get('message')}")
    return lines
