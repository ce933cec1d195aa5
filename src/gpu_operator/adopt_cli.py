"""`gpu-operator adopt --dry-run`: what taking over NVIDIA's operand objects will do, per object.

Reads the live cluster (the active ClusterPolicy, nodes, CRDs, the operand objects in the operator
namespace and the cluster-scoped ones the policy controls), renders what our operator would write
for that policy, and prints the pure planner's verdicts (`operands.adoption`). It changes nothing:
the operator itself adopts the objects when it runs (docs/swap-in.md).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpu_operator import api
from gpu_operator.api import images, keys
from gpu_operator.operands import adoption, registry

err = Console(stderr=True, highlight=False, soft_wrap=True)
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
PROMETHEUSRULE_CRD = "prometheusrules.monitoring.coreos.com"
NAMESPACED_KINDS = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "DaemonSet"),
)
CLUSTER_KINDS = (
    ("node.k8s.io/v1", "RuntimeClass"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
)
# A failure to read the cluster or an unusable ClusterPolicy (the plan's own codes are 0, 3, 4).
EXIT_ERROR = 1
EXIT_USAGE = 2


class Output(StrEnum):
    table = "table"
    json = "json"


@dataclass
class Snapshot:
    """What the plan reads from the cluster."""

    policies: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    crds: set[str]
    live: list[dict[str, Any]]
    operator_env: dict[str, str]


def operator_env(deployments: list[dict[str, Any]], environ: Mapping[str, str]) -> dict[str, str]:
    """The `*_IMAGE` env of the operator Deployment in the namespace (NVIDIA's, before the swap),
    else of this process: the fallbacks for images the ClusterPolicy leaves unset."""
    names = set(images.IMAGE_ENV.values())
    for deployment in deployments:
        pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers") or []:
            found = {
                e["name"]: e["value"]
                for e in container.get("env") or []
                if e.get("name") in names and e.get("value")
            }
            if found:
                return found
    return {k: v for k, v in environ.items() if k in names and v}


async def read_snapshot(kubeconfig: str | None, namespace: str) -> Snapshot:
    # Imported here: only this command path needs the client stack.
    from gpu_operator.kube import client as kube_client
    from gpu_operator.kube import resources

    client = kube_client.connect(kubeconfig)
    try:

        async def items(res: Any, ns: str | None = None) -> list[dict[str, Any]]:
            listing = client.list(res) if ns is None else client.list(res, namespace=ns)
            return [dict(obj) async for obj in listing]

        live: list[dict[str, Any]] = []
        for api_version, kind in NAMESPACED_KINDS:
            live += await items(resources.resource(api_version, kind), namespace)
        for api_version, kind in CLUSTER_KINDS:
            live += await items(resources.resource(api_version, kind))
        crds = {str(c["metadata"]["name"]) for c in await items(resources.CRD)}
        for api_version, kind, crd in (
            ("monitoring.coreos.com/v1", "ServiceMonitor", SERVICEMONITOR_CRD),
            ("monitoring.coreos.com/v1", "PrometheusRule", PROMETHEUSRULE_CRD),
        ):
            if crd in crds:
                live += await items(resources.resource(api_version, kind), namespace)
        policies = (
            await items(resources.CLUSTER_POLICY) if "clusterpolicies.nvidia.com" in crds else []
        )
        deployments = await items(resources.resource("apps/v1", "Deployment"), namespace)
        return Snapshot(
            policies=policies,
            nodes=await items(resources.NODE),
            crds=crds,
            live=live,
            operator_env=operator_env(deployments, os.environ),
        )
    finally:
        await client.close()


def build_plan(snapshot: Snapshot, namespace: str) -> adoption.AdoptionPlan:
    """Render what the operator would write for the active policy and plan the takeover."""
    from gpu_operator.controller import clusterpolicy
    from gpu_operator.controller import facts as facts_mod
    from gpu_operator.kube.writer import with_hash

    active = clusterpolicy.active_policy(snapshot.policies)
    if active is None:
        return adoption.plan([], snapshot.live, policy_uid=None)
    checked = api.check_document(active)
    if not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
        problems = "; ".join(str(p) for p in checked.errors)
        raise ValueError(f"ClusterPolicy {active['metadata']['name']} is invalid: {problems}")
    config_maps = [o for o in snapshot.live if o.get("kind") == "ConfigMap"]
    facts = facts_mod.from_nodes(
        snapshot.nodes,
        namespace=namespace,
        operator_env=snapshot.operator_env,
        has_servicemonitor_crd=SERVICEMONITOR_CRD in snapshot.crds,
        has_prometheusrule_crd=PROMETHEUSRULE_CRD in snapshot.crds,
        config_map_keys={cm["metadata"]["name"]: tuple(cm.get("data") or {}) for cm in config_maps},
        config_map_data={
            cm["metadata"]["name"]: cm["data"] for cm in config_maps if cm.get("data")
        },
    )
    owner = adoption.owner_reference(active)
    desired: list[dict[str, Any]] = []
    notes: list[str] = []
    kept_states: set[str] = set()
    for state in registry.render_all(checked.obj, facts):
        if state.error is not None:
            kept_states.add(state.name)
            notes.append(f"{state.name} does not render ({state.error}); its objects are kept")
            continue
        for obj in state.objects if state.enabled else []:
            if obj.get("kind") == "DaemonSet" and facts.gpu_node_count == 0:
                continue  # no GPU node, no DaemonSet (as the controller)
            if obj.get("kind") == "ServiceMonitor" and SERVICEMONITOR_CRD not in snapshot.crds:
                continue
            if obj.get("kind") == "PrometheusRule" and PROMETHEUSRULE_CRD not in snapshot.crds:
                continue
            obj.setdefault("metadata", {})["ownerReferences"] = [owner]
            desired.append(with_hash(obj))
    # The controller keeps the objects of a state that failed to render: so does the plan.
    live = [
        o
        for o in snapshot.live
        if ((o.get("metadata") or {}).get("labels") or {}).get(keys.OPERATOR_STATE_LABEL)
        not in kept_states
    ]
    result = adoption.plan(desired, live, policy_uid=str(active["metadata"].get("uid")))
    return adoption.AdoptionPlan(result.objects, (*result.notes, *notes))


def _print(plan: adoption.AdoptionPlan, policy: str | None) -> None:
    out = Console(highlight=False, soft_wrap=True)
    table = Table(title=f"Adoption plan for ClusterPolicy {policy or '-'}", title_justify="left")
    for column in ("object", "verdict", "pods", "why / fields"):
        table.add_column(column)
    for obj in plan.objects:
        if obj.verdict in ("replace", "delete") and not obj.pods_kept:
            pods = "replaced"
        elif obj.rolls:
            pods = "roll once" if not obj.pods_kept else "kept (OnDelete)"
        else:
            pods = "-"
        detail = obj.reason
        if obj.verdict == "patch":
            detail += ": " + ", ".join(obj.changes)
        table.add_row(obj.ref, obj.verdict, pods, detail)
    out.print(table)
    for note in plan.notes:
        out.print(f"note: {note}")
    counts = plan.counts()
    out.print(
        ", ".join(f"{counts[v]} {v}" for v in adoption.VERDICTS) + f"; {len(plan.rolling)} roll"
    )


def adopt_command(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan (required: the operator itself adopts)."
    ),
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: in-cluster)."
    ),
    namespace: str = typer.Option("gpu-operator", "--namespace", "-n", help="Operator namespace."),
    output: Output = typer.Option(Output.table, "-o", "--output", help="table or json."),
) -> None:
    """List, per operand object, whether our operator adopts it as is, patches it in place (and
    whether its pods roll), replaces it or deletes it. Exit 0: all in place; 3: some replaced or
    deleted; 4: some blocked; 1: the cluster or the policy cannot be read."""
    if not dry_run:
        err.print(
            "error: adopt only reports; pass --dry-run. Our operator adopts the objects itself "
            "once it runs (docs/swap-in.md)."
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        snapshot = asyncio.run(read_snapshot(kubeconfig, namespace))
        plan = build_plan(snapshot, namespace)
    except Exception as exc:  # the client raises many types: one line, no traceback
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from None
    from gpu_operator.controller import clusterpolicy

    active = clusterpolicy.active_policy(snapshot.policies)
    name = active["metadata"]["name"] if active else None
    if output is Output.json:
        body = {
            "policy": name,
            "objects": [{**asdict(o), "changes": list(o.changes)} for o in plan.objects],
            "notes": list(plan.notes),
            "counts": plan.counts(),
            "exitCode": plan.exit_code,
        }
        typer.echo(json.dumps(body, indent=2))
    else:
        _print(plan, name)
    raise typer.Exit(plan.exit_code)
