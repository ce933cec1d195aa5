"""`gpu-operator adopt --dry-run`: what taking over NVIDIA's operand objects will do, per object.

Reads the live cluster (the active ClusterPolicy, nodes, CRDs, the operand objects and pods in the
operator namespace and the cluster-scoped objects the policy controls), renders what our operator
would write for that policy, sends each first write the operator would make as a server-side dry
run (the takeover patch or the apply: the API server says what it would store, or why it would
refuse it), and prints the pure planner's verdicts (`operands.adoption`). It changes nothing but,
with `--apply-crds`, the CRDs: the operator itself adopts the objects when it runs
(docs/swap-in.md).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpu_operator import api
from gpu_operator.api import crds as crd_gen
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
# Our CRDs are missing or older than this operator's (NVIDIA's have no schema marker): the operator
# would refuse to reconcile until they are applied (`--apply-crds`).
EXIT_CRDS = 5
APPLY_CRDS_COMMAND = "gpu-operator adopt --dry-run --apply-crds"


class Output(StrEnum):
    table = "table"
    json = "json"


@dataclass
class Snapshot:
    """What the plan reads from the cluster: `crds` by name, `pods` in the operator namespace."""

    policies: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    crds: dict[str, dict[str, Any]]
    live: list[dict[str, Any]]
    operator_env: dict[str, str]
    pods: list[dict[str, Any]] = field(default_factory=list)


def crd_problems(installed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why our CRDs must be applied before our operator reconciles: each of ours that is missing
    or carries no (or an older) schema version marker, as NVIDIA's CRDs do."""
    problems: list[str] = []
    for crd in crd_gen.all_crds().values():
        name = str(crd["metadata"]["name"])
        found = installed.get(name)
        if found is None:
            problems.append(f"CRD {name} is not installed")
            continue
        schema = crd_gen.installed_schema(found)
        if schema.older:
            if schema.problem and schema.problem.startswith("no "):
                what = f"has {schema.problem} (NVIDIA's CRDs have none)"
            else:
                what = f"has {schema.problem or f'schema version {schema.installed}'}"
            problems.append(f"CRD {name} {what}; ours is version {schema.expected}")
    return problems


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


async def read_snapshot(client: Any, namespace: str) -> Snapshot:
    """Read what the plan needs through a connected client."""
    from gpu_operator.kube import resources  # only this command path needs the client stack

    async def items(res: Any, ns: str | None = None) -> list[dict[str, Any]]:
        listing = client.list(res) if ns is None else client.list(res, namespace=ns)
        return [dict(obj) async for obj in listing]

    live: list[dict[str, Any]] = []
    for api_version, kind in NAMESPACED_KINDS:
        live += await items(resources.resource(api_version, kind), namespace)
    for api_version, kind in CLUSTER_KINDS:
        live += await items(resources.resource(api_version, kind))
    crds = {str(c["metadata"]["name"]): c for c in await items(resources.CRD)}
    for api_version, kind, crd in (
        ("monitoring.coreos.com/v1", "ServiceMonitor", SERVICEMONITOR_CRD),
        ("monitoring.coreos.com/v1", "PrometheusRule", PROMETHEUSRULE_CRD),
    ):
        if crd in crds:
            live += await items(resources.resource(api_version, kind), namespace)
    policies = await items(resources.CLUSTER_POLICY) if "clusterpolicies.nvidia.com" in crds else []
    deployments = await items(resources.resource("apps/v1", "Deployment"), namespace)
    return Snapshot(
        policies=policies,
        nodes=await items(resources.NODE),
        crds=crds,
        live=live,
        operator_env=operator_env(deployments, os.environ),
        pods=await items(resources.POD, namespace),
    )


@dataclass
class Rendered:
    """What the operator would write for the active policy, before it is compared."""

    desired: list[dict[str, Any]]
    live: list[dict[str, Any]]
    notes: list[str]
    policy_uid: str | None
    auto_upgrade: bool


def render(snapshot: Snapshot, namespace: str) -> Rendered:
    """Render what the operator would write for the active policy (owner reference and hash
    annotation set, as the writer sends it)."""
    from gpu_operator.controller import clusterpolicy
    from gpu_operator.controller import facts as facts_mod
    from gpu_operator.kube.writer import with_hash

    active = clusterpolicy.active_policy(snapshot.policies)
    if active is None:
        return Rendered([], snapshot.live, [], None, False)
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
    upgrade = checked.obj.spec.driver.upgradePolicy
    return Rendered(
        desired, live, notes, str(active["metadata"].get("uid")),
        bool(upgrade is not None and upgrade.autoUpgrade),
    )  # fmt: skip


def build_plan(
    snapshot: Snapshot,
    namespace: str,
    trials: Mapping[tuple[str, str, str], adoption.Trial] | None = None,
    notes: tuple[str, ...] = (),
    rendered: Rendered | None = None,
) -> adoption.AdoptionPlan:
    """Plan the takeover of what the operator would write for the active policy."""
    rendered = rendered or render(snapshot, namespace)
    result = adoption.plan(
        rendered.desired, rendered.live, policy_uid=rendered.policy_uid, trials=trials,
        pods=snapshot.pods, auto_upgrade=rendered.auto_upgrade,
    )  # fmt: skip
    return adoption.AdoptionPlan(result.objects, (*result.notes, *rendered.notes, *notes))


@dataclass
class Outcome:
    """What the command found: the plan, the CRD problems left, and the CRDs it applied."""

    snapshot: Snapshot
    plan: adoption.AdoptionPlan
    crd_problems: list[str]
    applied_crds: list[str]

    @property
    def exit_code(self) -> int:
        code = self.plan.exit_code
        if code == adoption.EXIT_BLOCKED:
            return code
        return EXIT_CRDS if self.crd_problems else code


async def examine(kubeconfig: str | None, namespace: str, *, apply_crds: bool) -> Outcome:
    """Apply our CRDs (with `apply_crds`), read the cluster, ask the API server about each
    write (dry runs) and plan."""
    from gpu_operator.kube import adopt_trials, crd_install
    from gpu_operator.kube import client as kube_client

    client = kube_client.connect(kubeconfig)
    try:
        applied: list[str] = []
        if apply_crds:
            applied = await crd_install.apply(client, crd_gen.all_crds().values())
        snapshot = await read_snapshot(client, namespace)
        rendered = render(snapshot, namespace)
        trials, notes = await adopt_trials.run_trials(client, rendered.desired, rendered.live)
        plan = build_plan(snapshot, namespace, trials, tuple(notes), rendered)
        return Outcome(snapshot, plan, crd_problems(snapshot.crds), applied)
    finally:
        await client.close()


def _pods_column(obj: adoption.ObjectPlan) -> str:
    if obj.verdict in ("replace", "delete") and not obj.pods_kept:
        return f"replaced ({len(obj.restarts)})"
    if obj.rolls and not obj.pods_kept:
        return f"roll once ({len(obj.restarts)})"
    if obj.rolls:
        return f"restarted by upgrade ({len(obj.restarts)})" if obj.restarts else "kept (OnDelete)"
    return "-"


def _print(outcome: Outcome, policy: str | None) -> None:
    # Everything printed comes from the cluster (names, field paths such as
    # `[/sys/devices/system/memory/auto_online_blocks]`): never read as Rich markup.
    plan = outcome.plan
    out = Console(highlight=False, soft_wrap=True)
    table = Table(
        title=escape(f"Adoption plan for ClusterPolicy {policy or '-'}"), title_justify="left"
    )
    for column in ("object", "verdict", "pods", "why / fields"):
        table.add_column(column)
    for obj in plan.objects:
        detail = obj.reason
        if obj.verdict == "patch":
            detail += ": " + ", ".join(obj.changes)
        table.add_row(escape(obj.ref), obj.verdict, _pods_column(obj), escape(detail))
    out.print(table)
    for name in outcome.applied_crds:
        out.print(escape(f"applied: customresourcedefinition/{name}"))
    for problem in outcome.crd_problems:
        out.print(escape(f"crds: {problem}"))
    if outcome.crd_problems:
        out.print(
            escape(
                f"crds: our operator refuses to reconcile until our CRDs are applied: run "
                f"`{APPLY_CRDS_COMMAND}` (or `gpu-operator crds --apply`)"
            )
        )
    for note in plan.notes:
        out.print(escape(f"note: {note}"))
    counts = plan.counts()
    out.print(
        ", ".join(f"{counts[v]} {v}" for v in adoption.VERDICTS) + f"; {len(plan.rolling)} roll"
    )
    restarts = plan.restarts
    out.print(
        escape(f"pods that would restart ({len(restarts)}): {', '.join(restarts)}")
        if restarts
        else "pods that would restart: none"
    )


def adopt_command(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan (required: the operator itself adopts)."
    ),
    apply_crds: bool = typer.Option(
        False,
        "--apply-crds",
        help="First replace the CRDs with ours (server-side apply, as `gpu-operator crds "
        "--apply`): the one change adopt makes.",
    ),
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: in-cluster)."
    ),
    namespace: str = typer.Option("gpu-operator", "--namespace", "-n", help="Operator namespace."),
    output: Output = typer.Option(Output.table, "-o", "--output", help="table or json."),
) -> None:
    """List, per operand object, whether our operator adopts it as is, patches it in place (and
    which pods restart), replaces it or deletes it, or cannot write it (blocked, with the API
    server's reason), and whether our CRDs must be applied first. Exit 0: all in place; 3: some
    replaced or deleted; 4: some blocked; 5: our CRDs must be applied (`--apply-crds`); 1: the
    cluster or the policy cannot be read."""
    if not dry_run:
        err.print(
            "error: adopt only reports; pass --dry-run. Our operator adopts the objects itself "
            "once it runs (docs/swap-in.md)."
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        outcome = asyncio.run(examine(kubeconfig, namespace, apply_crds=apply_crds))
    except Exception as exc:  # the client raises many types: one line, no traceback
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from None
    from gpu_operator.controller import clusterpolicy

    active = clusterpolicy.active_policy(outcome.snapshot.policies)
    name = active["metadata"]["name"] if active else None
    plan = outcome.plan
    if output is Output.json:
        body = {
            "policy": name,
            "objects": [
                {**asdict(o), "changes": list(o.changes), "restarts": list(o.restarts)}
                for o in plan.objects
            ],
            "restarts": list(plan.restarts),
            "crds": outcome.crd_problems,
            "appliedCrds": outcome.applied_crds,
            "notes": list(plan.notes),
            "counts": plan.counts(),
            "exitCode": outcome.exit_code,
        }
        typer.echo(json.dumps(body, indent=2))
    else:
        _print(outcome, name)
    raise typer.Exit(outcome.exit_code)
