"""Why the GPUCluster is (not) ready: `gpu-operator explain policy` for the DRA stack (pure).

A snapshot of the cluster in (the GPUCluster and any ClusterPolicy, the API server's version, the
nodes' driver versions and CDI labels, the states' DaemonSets and Deployment with their pods,
Events and log tails), a verdict out. The links, in order:

1. `conflict`: a cluster runs a ClusterPolicy or a GPUCluster, never both (status/gpucluster.py
   decides which is refused); failed when the GPUCluster is the refused one, a warning when it
   runs and the ClusterPolicy is refused; either way it names what to delete;
2. the requirements: `kubernetes` (>= 1.34.2, blocking), `driver` (580 branch or newer on every
   node whose driver is known) and `cdi` (no node with CDI off in the toolkit): warnings;
3. `spec`: what the operator said when it stopped before applying (an invalid spec, a render
   error, an unmet prerequisite), from the Ready condition;
4. the states in NVIDIA's order (`state-dra-driver`, `state-dcgm`, `state-dcgm-exporter`,
   `state-dra-validation`), each from its live DaemonSets/Deployment. The first state that is not
   ready is the failing link and carries the evidence (the workload's readiness, its failing
   pods, their containers' messages, telling log lines, Warning Events) and a fix; the states
   after it are still listed with their one-line outcome, as they often wait on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator import api
from gpu_operator.api import gpucluster as gc_api
from gpu_operator.operands import dra_driver, readiness
from gpu_operator.status import conditions
from gpu_operator.status import explain as chain
from gpu_operator.status import gpucluster as gc_status
from gpu_operator.status.explain import Evidence, Link, LinkStatus

Obj = dict[str, Any]
DEFAULT_NAMESPACE = "gpu-operator"

TITLES = {
    "conflict": "one stack per cluster",
    "kubernetes": "Kubernetes version",
    "driver": "driver branch",
    "cdi": "CDI in the runtime",
    "spec": "spec and prerequisites",
    dra_driver.STATE_DRIVER: "state-dra-driver (kubelet plugin, compute-domain controller)",
    dra_driver.STATE_DCGM: "state-dcgm (host engine)",
    dra_driver.STATE_DCGM_EXPORTER: "state-dcgm-exporter",
    dra_driver.STATE_VALIDATION: "state-dra-validation (validator)",
}
# Where to look when a state's workload is not ready.
_STATE_FIX = {
    dra_driver.STATE_DRIVER: (
        "the plugin's driver-validation init container waits for the node's driver "
        "(nvidia-smi under hostPaths.driverInstallDir); the gpus container's log says what "
        "it could not publish"
    ),
    dra_driver.STATE_DCGM: "the host engine needs the node's GPUs through its admin claim",
    dra_driver.STATE_DCGM_EXPORTER: (
        "the exporter needs the node's GPUs through its admin claim, and the host engine "
        "(nvidia-dcgm-dra:5555) when dcgm.enabled"
    ),
    dra_driver.STATE_VALIDATION: (
        "the validator claims a GPU of the gpu.nvidia.com class: it waits for the kubelet "
        "plugin's ResourceSlices on the node (kubectl get resourceslices)"
    ),
}
# Ready-condition reasons that mean the operator stopped before applying the states.
_STOPPED = (
    conditions.INVALID_SPEC,
    conditions.RECONCILE_FAILED,
    gc_status.PREREQUISITE_NOT_MET,
)


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the explanation reads. `None` means not read (unknown), empty means none."""

    cluster: Obj
    policies: Sequence[Obj] = ()
    server_version: str | None = None
    # Node -> its driver version (`580.95.05`) or branch (`580`), where known.
    node_drivers: Mapping[str, str] = field(default_factory=dict)
    cdi_disabled: Sequence[str] = ()
    # The operator namespace's DaemonSets and Deployments carrying a DRA state label.
    workloads: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    revisions: Sequence[Obj] = ()
    events: Sequence[Obj] = ()
    logs: Mapping[tuple[str, str], str] | None = None  # (pod, container) -> tail


@dataclass(frozen=True)
class ClusterVerdict:
    name: str
    namespace: str
    ready: bool  # the Ready condition the operator wrote
    message: str
    links: tuple[Link, ...]

    @property
    def failed(self) -> Link | None:
        return next((link for link in self.links if link.status == "failed"), None)

    @property
    def warnings(self) -> tuple[Link, ...]:
        return tuple(link for link in self.links if link.status == "warning")

    @property
    def ok(self) -> bool:
        """Ready as the operator says and no link failed."""
        return self.ready and self.failed is None

    def to_dict(self) -> dict[str, Any]:
        failed = self.failed
        return {
            "kind": gc_api.KIND,
            "name": self.name,
            "namespace": self.namespace,
            "ready": self.ready,
            "message": self.message,
            "failedLink": failed.id if failed else None,
            "warnings": [link.id for link in self.warnings],
            "links": [link.to_dict() for link in self.links],
        }


def _link(
    id_: str, status: LinkStatus, summary: str, evidence: Sequence[Evidence] = (), fix: str = ""
) -> Link:
    return Link(id_, TITLES[id_], status, summary, tuple(evidence), fix)


def _ready_condition(cluster: Obj) -> Obj:
    found = (cluster.get("status") or {}).get("conditions") or []
    return next((c for c in found if c.get("type") == "Ready"), {})


# ----- links ---------------------------------------------------------------------------------


def _conflict(snap: ClusterSnapshot) -> Link:
    clash = gc_status.conflict(snap.cluster, snap.policies)
    if clash is None:
        return _link("conflict", "ok", "no ClusterPolicy: the GPUCluster is the cluster's stack")
    evidence = [
        Evidence("resource", f"{clash.refused_kind}/{clash.refused}", "refused"),
        Evidence("resource", f"{clash.winner_kind}/{clash.winner}", "runs"),
    ]
    if clash.refused_kind == gc_api.KIND:
        cp = clash.winner
        return _link(
            "conflict", "failed", clash.refused_message, evidence,
            f"to move to DRA: kubectl delete clusterpolicy {cp} (the GPUCluster then takes over; "
            f"the device plugin stack goes); to keep the device plugin stack: kubectl delete "
            f"gpucluster {clash.refused}",
        )  # fmt: skip
    return _link(
        "conflict", "warning",
        f"ClusterPolicy {clash.refused} is refused (newer than this GPUCluster; a cluster runs "
        "one of the two): nothing of it is applied",
        evidence,
        f"kubectl delete clusterpolicy {clash.refused} (this GPUCluster keeps running)",
    )  # fmt: skip


def _kubernetes(snap: ClusterSnapshot) -> Link:
    wanted = ".".join(map(str, gc_status.MIN_KUBERNETES))
    if snap.server_version is None:
        return _link("kubernetes", "skipped", "the API server's version was not read")
    evidence = [Evidence("resource", "version", snap.server_version)]
    reqs = gc_status.requirements(snap.server_version, {})
    if reqs.blocking:
        return _link(
            "kubernetes", "failed", reqs.blocking[0], evidence,
            f"upgrade the control plane and the kubelets to {wanted} or newer",
        )  # fmt: skip
    if reqs.warnings:
        return _link("kubernetes", "warning", reqs.warnings[0], evidence)
    return _link("kubernetes", "ok", f"{snap.server_version} (>= {wanted})", evidence)


def _major(version: str) -> int | None:
    head = version.strip().lstrip("v").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _driver(snap: ClusterSnapshot) -> Link:
    majors = {n: m for n, v in snap.node_drivers.items() if (m := _major(v)) is not None}
    if not majors:
        return _link(
            "driver", "skipped",
            f"no node's driver version is known yet (the DRA driver needs the "
            f"{gc_status.MIN_DRIVER_MAJOR} branch or newer)",
        )  # fmt: skip
    evidence = [Evidence("node", n, snap.node_drivers[n]) for n in sorted(majors)[:5]]
    reqs = gc_status.requirements(None, majors)
    if reqs.warnings:
        old = [n for n in sorted(majors) if majors[n] < gc_status.MIN_DRIVER_MAJOR]
        evidence = [Evidence("node", n, snap.node_drivers[n]) for n in old[:5]]
        return _link(
            "driver", "warning", reqs.warnings[0], evidence,
            f"upgrade the driver on those nodes to the {gc_status.MIN_DRIVER_MAJOR} branch or "
            "newer (an NVIDIADriver, or the node image's)",
        )  # fmt: skip
    versions = sorted({snap.node_drivers[n] for n in majors})
    return _link(
        "driver", "ok",
        f"{len(majors)} node(s) on the {gc_status.MIN_DRIVER_MAJOR} branch or newer "
        f"({', '.join(versions[:3])})",
        evidence,
    )  # fmt: skip


def _cdi(snap: ClusterSnapshot) -> Link:
    if not snap.cdi_disabled:
        return _link("cdi", "ok", "no node reports CDI disabled in the container toolkit")
    reqs = gc_status.requirements(None, {}, snap.cdi_disabled)
    evidence = [Evidence("label", n, "nvidia.com/cdi.enabled=false") for n in snap.cdi_disabled]
    return _link(
        "cdi", "warning", reqs.warnings[0], evidence[:5],
        "enable CDI in the runtime (nvidia-ctk runtime configure --cdi.enabled; CDI is on by "
        "default in containerd 2.x and CRI-O)",
    )  # fmt: skip


def _spec(snap: ClusterSnapshot) -> tuple[Link, Any]:
    """The spec as the operator reads it (None when invalid) and what it said on stopping."""
    ready = _ready_condition(snap.cluster)
    reason = str(ready.get("reason") or "")
    message = str(ready.get("message") or "")
    # The spec as the operator judges it (the status is the operator's, not the user's input).
    checked = api.check_document({k: v for k, v in snap.cluster.items() if k != "status"})
    typed = checked.obj if checked.ok and isinstance(checked.obj, gc_api.GPUCluster) else None
    if typed is None:
        problems = "; ".join(str(p) for p in checked.errors) or message
        return _link(
            "spec", "failed", f"invalid spec: {problems}",
            [Evidence("condition", "Ready", f"{reason}: {message}")] if reason else [],
            "kubectl edit gpucluster " + _name(snap.cluster) + " (docs/dra.md lists the fields)",
        ), None  # fmt: skip
    if ready.get("status") != "True" and reason in _STOPPED:
        fix = {
            gc_status.PREREQUISITE_NOT_MET: "meet the requirement the message names",
            conditions.RECONCILE_FAILED: "the operator's log and the GPUCluster's Events say "
            "which object could not be applied (RBAC, an admission webhook, an API not served)",
        }.get(reason, "fix the spec field the message names")
        return _link(
            "spec", "failed", message, [Evidence("condition", "Ready", reason)], fix
        ), typed.spec
    return _link("spec", "ok", "valid; the operator applies the states"), typed.spec


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def expected(spec: gc_api.GPUClusterSpec) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each state with the workloads (kind, name) the spec has it run; [] for a state the spec
    switches off."""
    eff = dra_driver.effective(spec)
    driver = [("DaemonSet", dra_driver.PLUGIN_DAEMONSET)]
    if eff.compute_domains:
        driver.append(("Deployment", dra_driver.CONTROLLER))
    dcgm = [("DaemonSet", dra_driver.DCGM_DRA)] if dra_driver.dcgm_enabled(spec) else []
    exporter = (
        [("DaemonSet", dra_driver.DCGM_EXPORTER_DRA)]
        if dra_driver.dcgm_exporter_enabled(spec)
        else []
    )
    return [
        (dra_driver.STATE_DRIVER, driver),
        (dra_driver.STATE_DCGM, dcgm),
        (dra_driver.STATE_DCGM_EXPORTER, exporter),
        (dra_driver.STATE_VALIDATION, [("DaemonSet", dra_driver.VALIDATOR)]),
    ]


_DISABLED = {
    dra_driver.STATE_DCGM: "disabled (dcgm.enabled is not true: the exporter embeds its own "
    "host engine)",
    dra_driver.STATE_DCGM_EXPORTER: "disabled (no dcgmExporter section, or enabled: false)",
}


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def _deployment_pods(snap: ClusterSnapshot, deployment: Obj) -> list[Obj]:
    """A Deployment's pods: those its ReplicaSets' pods' labels match (its selector)."""
    selector = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if not selector:
        return []
    return [
        p
        for p in snap.pods
        if all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v
               for k, v in selector.items())
    ]  # fmt: skip


def _events_about(snap: ClusterSnapshot, name: str) -> list[Evidence]:
    found = []
    for event in snap.events:
        involved = event.get("involvedObject") or {}
        if involved.get("name") != name or event.get("type") != "Warning":
            continue
        text = f"{event.get('reason', '')}: {event.get('message', '')}".strip()
        found.append(Evidence("event", f"{involved.get('kind', '')}/{name}", text))
    return found[-3:]


def _pod_evidence(snap: ClusterSnapshot, pods: Sequence[Obj], shown: int = 2) -> list[Evidence]:
    """The failing pods (the first `shown`): problem, container message, log lines, Events."""
    out: list[Evidence] = []
    failing = [(p, problem) for p in pods if (problem := readiness.pod_problem(p)) is not None]
    for pod, problem in sorted(failing, key=lambda f: -f[1][0])[:shown]:
        view = chain.pod_view(pod, problem[1])
        node = str((pod.get("spec") or {}).get("nodeName") or "not scheduled")
        out.append(Evidence("pod", view.name, f"on {node}: {problem[1]}"))
        name = view.failing_container
        ctr = view.container(name) if name else None
        if ctr is not None and ctr.message:
            last = ctr.message.strip().splitlines()[-1]
            if last not in problem[1]:
                out.append(Evidence("container", f"{view.name}/{ctr.name}", last))
        if name and snap.logs is not None:
            tail = snap.logs.get((view.name, name), "")
            out.extend(
                Evidence("log", f"{view.name}/{name}", line) for line in chain.telling_lines(tail)
            )
        out.extend(_events_about(snap, view.name))
    if len(failing) > shown:
        out.append(Evidence("pod", "...", f"{len(failing) - shown} more pod(s) with a problem"))
    return out


def _workload(
    snap: ClusterSnapshot, namespace: str, kind: str, name: str
) -> tuple[LinkStatus, str, list[Evidence]]:
    live = next((w for w in snap.workloads if w.get("kind") == kind and _name(w) == name), None)
    if live is None:
        return "failed", f"{kind} {name} not created yet", _events_about(snap, _name(snap.cluster))
    uid = str((live.get("metadata") or {}).get("uid") or "")
    ref = f"{kind}/{name}"
    if kind == "Deployment":
        status = live.get("status") or {}
        want = int((live.get("spec") or {}).get("replicas") or 1)
        have = int(status.get("availableReplicas") or 0)
        if have >= want:
            return "ok", f"{ref}: {have}/{want} available", []
        pods = _deployment_pods(snap, live)
        return "failed", f"{ref}: {have}/{want} available", [
            Evidence("resource", ref, f"{have}/{want} replicas available"),
            *_pod_evidence(snap, pods), *_events_about(snap, name),
        ]  # fmt: skip
    pods = [p for p in snap.pods if _owned_by(p, uid)]
    revisions = [r for r in snap.revisions if _owned_by(r, uid)]
    verdict = readiness.daemonset_readiness(live, pods, revisions)
    if not verdict.ready:
        return "failed", verdict.reason, [
            Evidence("resource", ref, verdict.reason), *_pod_evidence(snap, pods),
            *_events_about(snap, name),
        ]  # fmt: skip
    if verdict.desired == 0:
        selector = ((live.get("spec") or {}).get("template") or {}).get("spec", {}).get(
            "nodeSelector"
        ) or {}
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "none"
        return (
            "failed",
            f"{ref}: no node selected (nodeSelector {wanted})",
            [Evidence("resource", ref, "0 pods desired")],
        )
    return "ok", f"{ref}: {verdict.desired}/{verdict.desired} ready", []


def _states(snap: ClusterSnapshot, spec: gc_api.GPUClusterSpec, namespace: str) -> list[Link]:
    links: list[Link] = []
    first = True
    for state, workloads in expected(spec):
        if not workloads:
            links.append(_link(state, "skipped", _DISABLED.get(state, "disabled")))
            continue
        outcomes = [_workload(snap, namespace, kind, name) for kind, name in workloads]
        bad = [o for o in outcomes if o[0] == "failed"]
        if not bad:
            links.append(_link(state, "ok", "; ".join(o[1] for o in outcomes)))
            continue
        summary = "; ".join(o[1] for o in bad)
        if first:
            evidence = [e for o in bad for e in o[2]]
            fix = (
                f"{_STATE_FIX[state]}; kubectl -n {namespace} describe pod <pod> and kubectl -n "
                f"{namespace} logs <pod> -c <container> show more"
            )
            if "no node selected" in summary:
                fix = (
                    "no node carries every label of the nodeSelector: the operator puts the DRA "
                    "deploy labels on GPU nodes (NFD's pci-10de label, or "
                    "nvidia.com/gpu.present=true), so check the nodes' labels and NFD; any other "
                    "label there (a hand edit) must be on the nodes too"
                )
            links.append(_link(state, "failed", summary, evidence, fix))
            first = False
        else:
            links.append(_link(state, "failed", summary))
    return links


def explain(snap: ClusterSnapshot) -> ClusterVerdict:
    """The GPUCluster's links in order (module docstring)."""
    cluster = snap.cluster
    ready_cond = _ready_condition(cluster)
    status = cluster.get("status") or {}
    namespace = str(status.get("namespace") or DEFAULT_NAMESPACE)
    ready = ready_cond.get("status") == "True" and status.get("state") == "ready"
    message = str(ready_cond.get("message") or "the operator has not reported a status yet")
    links = [_conflict(snap), _kubernetes(snap), _driver(snap), _cdi(snap)]
    spec_link, spec = _spec(snap)
    links.append(spec_link)
    stopped = links[0].status == "failed" or links[1].status == "failed"
    if stopped or spec_link.status == "failed" or spec is None:
        why = "the GPUCluster is refused" if links[0].status == "failed" else "the operator stopped"
        for state in dra_driver.STATES:
            links.append(_link(state, "skipped", f"not applied ({why})"))
    else:
        links.extend(_states(snap, spec, namespace))
    return ClusterVerdict(_name(cluster), namespace, ready, message, tuple(links))


__all__ = ["TITLES", "ClusterSnapshot", "ClusterVerdict", "expected", "explain"]
