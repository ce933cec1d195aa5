"""`gpu-operator upgrade ...`: parse, call `upgrade_plan`, print (rich tables or JSON)."""

from __future__ import annotations

import asyncio
import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpu_operator.api import manifests
from gpu_operator.cli import upgrade_plan
from gpu_operator.upgrade import simulate

app = typer.Typer(
    name="upgrade",
    help="Rolling driver upgrades: see what one will do before it starts.",
    no_args_is_help=True,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
POLICY_KINDS = ("ClusterPolicy", "NVIDIADriver")


class Output(StrEnum):
    table = "table"
    json = "json"


def _policies(filename: str) -> list[dict[str, Any]]:
    documents = manifests.read(filename)
    found = [d for d in documents if d.get("kind") in POLICY_KINDS]
    if not found:
        raise upgrade_plan.PlanError(f"{filename}: no ClusterPolicy or NVIDIADriver in the file")
    return found


async def _list(kubeconfig: str | None, namespace: str) -> upgrade_plan.Listed:
    # Imported here so that offline plans never load the client stack.
    from gpu_operator.kube import client as kube_client
    from gpu_operator.kube import resources

    client = kube_client.connect(kubeconfig)
    try:

        async def items(res: Any, ns: str | None = None, optional: bool = False) -> list[Any]:
            try:
                listing = client.list(res) if ns is None else client.list(res, namespace=ns)
                return [dict(obj) async for obj in listing]
            except Exception as exc:
                code = getattr(getattr(exc, "status", None), "code", None)
                if optional and code == 404:
                    return []  # the CRD is not installed
                raise

        every = resources.ALL_NAMESPACES
        return upgrade_plan.Listed(
            nodes=await items(resources.NODE),
            pods=await items(resources.POD, every),
            daemonsets=await items(resources.DAEMONSET, namespace),
            revisions=await items(resources.CONTROLLER_REVISION, namespace),
            budgets=await items(resources.POD_DISRUPTION_BUDGET, every),
            policies=[
                *await items(resources.CLUSTER_POLICY, optional=True),
                *await items(resources.NVIDIA_DRIVER, optional=True),
            ],
        )
    finally:
        await client.close()


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit})" if len(names) > limit else "")


def _print(plan: dict[str, Any]) -> None:
    out = Console(highlight=False, soft_wrap=True)
    for group in plan["policies"]:
        extras = []
        if group["canaryNodes"]:
            extras.append(f"canary {group['canaryNodes']} per pool")
        if group["maxFailedNodes"] is not None:
            extras.append(f"stop after {group['maxFailedNodes']} failed")
        if group["rollback"]:
            extras.append("rollback")
        out.print(
            f"[bold]{group['owner']}[/]: {group['upgrading']} of {group['nodes']} nodes to "
            f"upgrade, maxParallelUpgrades "
            f"{group['maxParallelUpgrades']}, maxUnavailable {group['maxUnavailable']}"
            + (f", {', '.join(extras)}" if extras else "")
            + ("" if group["autoUpgrade"] else " [yellow](autoUpgrade is off)[/]")
        )
        if group["error"]:
            out.print(f"  [red]unusable policy:[/] {group['error']}")
    for note in plan["notes"]:
        out.print(f"note: {note}")
    batches = Table(title="Batches", title_justify="left")
    for column in ("batch", "starts", "nodes", "pods evicted", "blocked by PDB"):
        batches.add_column(column)
    for batch in plan["batches"]:
        label = f"{batch['batch']}" + (" (canary)" if batch["canary"] else "")
        batches.add_row(
            label,
            f"+{_duration(batch['startSeconds'])}",
            _names(batch["nodes"]),
            str(len(batch["evicts"])),
            ", ".join(batch["blockedBy"]) or "-",
        )
    out.print(batches)
    trouble = [n for n in plan["nodes"] if n["state"] not in ("upgrade-done", "")]
    if trouble:
        table = Table(title="Nodes that will not finish", title_justify="left")
        for column in ("node", "state", "why"):
            table.add_column(column)
        for node in trouble:
            table.add_row(node["name"], node["state"], node["message"])
        out.print(table)
    kernels: dict[tuple[str, str], list[str]] = {}
    for node in plan["nodes"]:
        pre = node["precompiled"]
        kernels.setdefault(
            (node["kernel"] or "?", f"{pre['verdict']} ({pre['source']})"), []
        ).append(node["name"])
    table = Table(title="Precompiled driver image per kernel", title_justify="left")
    for column in ("kernel", "nodes", "available (source)"):
        table.add_column(column)
    for (kernel, verdict), names in sorted(kernels.items()):
        table.add_row(kernel, _names(names, 3), verdict)
    out.print(table)
    estimate = plan["estimate"]
    timing = plan["timing"]
    out.print(
        f"Estimated duration: {_duration(estimate['seconds'])} "
        f"(ideal ceil(nodes/maxParallelUpgrades) x per-node time: "
        f"{_duration(estimate['idealSeconds'])}); at most {estimate['peakUnavailable']} "
        f"nodes unavailable and {estimate['peakInProgress']} in progress at once."
    )
    out.print(
        f"Per-node times assumed: eviction {timing['evictionSeconds']:.0f}s, driver start "
        f"{timing['driverStartSeconds']:.0f}s ({timing['driverStartPrecompiledSeconds']:.0f}s "
        f"precompiled), validation {timing['validationSeconds']:.0f}s ({timing['source']})."
    )
    if not estimate["finished"]:
        out.print("[yellow]The dry run did not finish: some nodes wait for ever (see above).[/]")


@app.command("plan")
def plan_command(
    filename: str | None = typer.Option(
        None,
        "-f",
        "--filename",
        help="ClusterPolicy or NVIDIADriver you are about to apply (YAML or JSON; - is stdin).",
    ),
    facts: Path | None = typer.Option(
        None,
        "--facts",
        help="Offline: the facts file `render` takes, with an optional upgrade: section.",
    ),
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", envvar="KUBECONFIG", help="Plan against this cluster."
    ),
    namespace: str = typer.Option(
        upgrade_plan.NAMESPACE, "--namespace", help="Operator namespace."
    ),
    output: Output = typer.Option(Output.table, "-o", "--output", help="table or json."),
    eviction_seconds: float = typer.Option(30.0, help="Assumed time for evicted pods to leave."),
    driver_start_seconds: float = typer.Option(300.0, help="Assumed driver build and load time."),
    precompiled_start_seconds: float = typer.Option(60.0, help="Same, for precompiled drivers."),
    validation_seconds: float = typer.Option(60.0, help="Assumed validator run time."),
) -> None:
    """Print which nodes upgrade in which batch, what each batch evicts (and which PDBs block
    it), whether precompiled images exist for the nodes' kernels, and how long it should take.

    With --facts the plan is offline (--kubeconfig and $KUBECONFIG are not used)."""
    timing = simulate.Timing(
        eviction=eviction_seconds,
        driver_start=driver_start_seconds,
        driver_start_precompiled=precompiled_start_seconds,
        validation=validation_seconds,
    )
    precompiled: list[str] | None = None
    notes: list[str] = []
    try:
        if facts is not None:
            if filename is None:
                raise upgrade_plan.PlanError("--facts needs -f with the policy to plan")
            facts_file, upgrade_facts = upgrade_plan.load_facts(facts)
            policies = [p for p in _policies(filename) if p.get("kind") == "ClusterPolicy"]
            if not policies:
                raise upgrade_plan.PlanError(
                    f"{filename}: offline plans need a ClusterPolicy (NVIDIADriver pools need "
                    "the cluster: use --kubeconfig)"
                )
            snap = upgrade_plan.offline_snapshot(policies[0], facts_file, upgrade_facts, namespace)
            precompiled = upgrade_facts.precompiled_kernels
            notes.append("offline: every node is assumed to run an older driver than the policy's")
        else:
            changes = _policies(filename) if filename is not None else []
            listed = asyncio.run(_list(kubeconfig, namespace))
            snap, notes = upgrade_plan.live_snapshot(
                listed, now=time.time(), namespace=namespace, changes=changes
            )
    except (upgrade_plan.PlanError, manifests.ManifestError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    except Exception as exc:  # a cluster that cannot be reached or read
        from gpu_operator.kube.client import ConnectError

        if isinstance(exc, ConnectError) or getattr(exc, "status", None) is not None:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(1) from None
        raise
    outcome = simulate.run(snap, timing)
    result = upgrade_plan.report(
        snap, outcome, timing, precompiled_kernels=precompiled, notes=notes
    )
    if output is Output.json:
        typer.echo(json.dumps(result, indent=2))
    else:
        _print(result)
