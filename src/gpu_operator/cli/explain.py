"""`gpu-operator explain node|policy`: why a GPU node is not usable, why the ClusterPolicy is not
ready; a rich tree for people, JSON for tools. Exit 0 usable/ready, 1 not, 2 bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from gpu_operator.status import explain

app = typer.Typer(
    name="explain",
    help="Why a GPU node is not allocatable, why the ClusterPolicy, the GPUCluster or a "
    "ComputeDomain is not ready.",
    no_args_is_help=True,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
T = TypeVar("T")
MARKS = {
    "ok": "[green]✓[/]",
    "warning": "[yellow]![/]",
    "failed": "[red]✗[/]",
    "skipped": "[dim]-[/]",
}


class Output(StrEnum):
    tree = "tree"
    json = "json"


KUBECONFIG = typer.Option(
    None, "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: in-cluster)."
)
NAMESPACE = typer.Option(
    None, "--namespace", help="The operator's namespace (default: from the ClusterPolicy status)."
)


def run_api(
    kubeconfig: str | None,
    work: Callable[[Any], Awaitable[T]],
    bad_input: tuple[type[Exception], ...] = (),
) -> T:
    """Connect, run `work(client)`, close; `bad_input` errors exit 2, API failures 1, with one
    line each."""
    from gpu_operator.kube import client as kube_client

    async def main() -> T:
        client = kube_client.connect(kubeconfig)
        try:
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except kube_client.ConnectError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    except bad_input as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # transport errors and API refusals: say what failed
        err.print(f"error: {type(exc).__name__}: {exc}", markup=False)
        raise typer.Exit(1) from None


def tree(verdict: explain.Verdict) -> Tree:
    """The verdict as a rich tree: one branch per link, evidence and fix under the failing link
    and under each warning."""
    head = "[green]usable[/]" if verdict.usable else "[red]not usable[/]"
    if verdict.usable and verdict.warnings:
        count = len(verdict.warnings)
        head += f", [yellow]{count} warning{'s' if count > 1 else ''}[/]"
    root = Tree(f"node [bold]{escape(verdict.node)}[/]: {head}")
    for link in verdict.links:
        branch = root.add(f"{MARKS[link.status]} {escape(link.title)}: {escape(link.summary)}")
        if link.status in ("failed", "warning") or link.id in ("device-plugin", "dra-slices"):
            for evidence in link.evidence:
                branch.add(
                    f"[dim]{evidence.kind}[/] {escape(evidence.ref)}: {escape(evidence.text)}"
                )
        if link.fix:
            branch.add(f"[bold]fix:[/] {escape(link.fix)}")
    reached = {link.id for link in verdict.links}
    for link_id, title in verdict.chain:
        if link_id not in reached:
            root.add(f"[dim]· {title}: not reached[/]")
    if verdict.startup_gate and verdict.failed is not None and verdict.failed.id != "gate":
        root.add(f"[yellow]startup gate:[/] {escape(verdict.startup_gate)}")
    return root


@app.command("node")
def node_command(
    name: str = typer.Argument(..., help="The node to explain."),
    output: Output = typer.Option(Output.tree, "-o", "--output", help="tree or json."),
    kubeconfig: str | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
) -> None:
    """Walk the node readiness chain for one node and stop at the first failing link."""
    from gpu_operator.kube import explain_read

    async def work(client: Any) -> explain.NodeFacts:
        return await explain_read.node_snapshot(client, name, namespace)

    facts = run_api(kubeconfig, work, (explain_read.NodeNotFound,))
    verdict = explain.explain(facts)
    if output is Output.json:
        typer.echo(json.dumps(verdict.to_dict(), indent=2))
    else:
        Console(highlight=False).print(tree(verdict))
    raise typer.Exit(0 if verdict.usable else 1)


def policy_report(policy: dict[str, Any] | None) -> tuple[bool, list[dict[str, str]], str]:
    """(ready, the states with their outcome and message, the Ready condition's message)."""
    if policy is None:
        return False, [], "no ClusterPolicy: nothing is deployed (create one, or install the chart)"
    status = policy.get("status") or {}
    ready: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    states = [
        {
            "name": str(s.get("name")),
            "state": str(s.get("state")),
            "message": str(s.get("message") or ""),
        }
        for s in status.get("states") or []
    ]
    message = str(ready.get("message") or "the operator has not reported a status yet")
    return status.get("state") == "ready", states, message


def policy_tree(name: str, ready: bool, message: str, states: list[dict[str, str]]) -> Tree:
    head = "[green]ready[/]" if ready else "[red]not ready[/]"
    root = Tree(f"ClusterPolicy [bold]{escape(name or '-')}[/]: {head}: {escape(message)}")
    marks = {"ready": "ok", "notReady": "failed", "failed": "failed", "disabled": "skipped"}
    for state in states:
        mark = MARKS[marks.get(state["state"], "skipped")]
        text = f" ({escape(state['message'])})" if state["message"] else ""
        root.add(f"{mark} {escape(state['name'])}: {state['state']}{text}")
    return root


def cluster_tree(verdict: Any) -> Tree:
    """A GPUCluster verdict (status/gpucluster_explain.py) as a tree: every link, evidence and
    fix under the failing link and under each warning."""
    head = "[green]ready[/]" if verdict.ok else "[red]not ready[/]"
    if verdict.ok and verdict.warnings:
        count = len(verdict.warnings)
        head += f", [yellow]{count} warning{'s' if count > 1 else ''}[/]"
    root = Tree(
        f"GPUCluster [bold]{escape(verdict.name or '-')}[/] (namespace "
        f"{escape(verdict.namespace)}): {head}: {escape(verdict.message)}"
    )
    for link in verdict.links:
        branch = root.add(f"{MARKS[link.status]} {escape(link.title)}: {escape(link.summary)}")
        for evidence in link.evidence:
            branch.add(f"[dim]{evidence.kind}[/] {escape(evidence.ref)}: {escape(evidence.text)}")
        if link.fix:
            branch.add(f"[bold]fix:[/] {escape(link.fix)}")
    return root


@app.command("policy")
def policy_command(
    output: Output = typer.Option(Output.tree, "-o", "--output", help="tree or json."),
    kubeconfig: str | None = KUBECONFIG,
) -> None:
    """Why the ClusterPolicy (from its status, state by state) or the GPUCluster (its states in
    order, the first failing one with its evidence, its requirements and any conflict with a
    ClusterPolicy) is not ready."""
    from gpu_operator.kube import explain_read, gpucluster_read
    from gpu_operator.status import gpucluster_explain

    async def work(client: Any) -> tuple[dict[str, Any] | None, Any]:
        found = await explain_read.policies(client)
        cluster = explain_read.active_cluster(await explain_read.clusters(client))
        if cluster is None:
            return explain_read.active_policy(found), None
        return explain_read.active_policy(found), await gpucluster_read.snapshot(
            client, cluster, found
        )

    policy, snapshot = run_api(kubeconfig, work)
    ready, states, message = policy_report(policy)
    name = str(((policy or {}).get("metadata") or {}).get("name") or "")
    report = {"kind": "ClusterPolicy", "name": name, "ready": ready, "message": message,
              "states": states}  # fmt: skip
    if snapshot is not None:
        verdict = gpucluster_explain.explain(snapshot)
        if output is Output.json:
            out = verdict.to_dict()
            if policy is not None:
                out["clusterPolicy"] = report
            typer.echo(json.dumps(out, indent=2))
        else:
            console = Console(highlight=False)
            console.print(cluster_tree(verdict))
            if policy is not None:
                console.print(policy_tree(name, ready, message, states))
        raise typer.Exit(0 if verdict.ok else 1)
    if output is Output.json:
        typer.echo(json.dumps(report, indent=2))
    elif policy is None:
        err.print("no ClusterPolicy and no GPUCluster: nothing is deployed (create one, or "
                  "install the chart)", markup=False)  # fmt: skip
    else:
        Console(highlight=False).print(policy_tree(name, ready, message, states))
    if policy is None:
        raise typer.Exit(2)
    raise typer.Exit(0 if ready else 1)


@app.command("computedomain")
def computedomain_command(
    name: str = typer.Argument(..., help="The ComputeDomain to explain."),
    domain_namespace: str = typer.Option("default", "-n", "--namespace", help="Its namespace."),
    output: Output = typer.Option(Output.tree, "-o", "--output", help="tree or json."),
    kubeconfig: str | None = KUBECONFIG,
) -> None:
    """Why a ComputeDomain is not Ready: each node's IMEX daemon and the domain's warnings."""
    from gpu_operator.kube.computedomains import ComputeDomainApi
    from gpu_operator.status import computedomain

    class NotFound(Exception):
        pass

    async def work(client: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        api = ComputeDomainApi(client, domain_namespace, "gpu-operator-explain")
        found = await api.domain(domain_namespace, name)
        if found is None:
            raise NotFound(
                f"ComputeDomain {domain_namespace}/{name} not found (kubectl get computedomains -A "
                "lists them)"
            )
        return found, await api.events(domain_namespace, name)

    domain, events = run_api(kubeconfig, work, (NotFound,))
    lines = computedomain.explain(domain, events)
    ready = (domain.get("status") or {}).get("status") == "Ready"
    if output is Output.json:
        warnings = [
            {"reason": str(e.get("reason")), "message": str(e.get("message"))}
            for e in events
            if e.get("type") == "Warning"
        ]
        status = domain.get("status") or {}
        typer.echo(json.dumps({"name": name, "namespace": domain_namespace, "ready": ready,
                               "nodes": status.get("nodes") or [], "warnings": warnings,
                               "lines": lines}, indent=2))  # fmt: skip
    else:
        for line in lines:
            typer.echo(line)
    raise typer.Exit(0 if ready else 1)


def must_gather_command(
    output_file: str = typer.Option(
        "", "-o", "--output", help="The archive to write (default: must-gather-<time>.tar.gz)."
    ),
    kubeconfig: str | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    timeout: float = typer.Option(
        300.0, "--timeout", min=1.0, help="Deadline; logs not read by then are left out."
    ),
    parallel: int = typer.Option(
        16, "--parallel", min=1, max=256, help="Log reads in flight at once."
    ),
) -> None:
    """One tar.gz for a bug report: operator and operand logs (current and previous), DaemonSets,
    ClusterPolicy/NVIDIADrivers, GPU nodes, Events, rendered objects, `explain` per GPU node.
    Never a Secret; credentials redacted by shape and by name, counted per kind in MANIFEST.txt;
    bounded per log, in all and in time (see the docs)."""
    import time
    from pathlib import Path

    from rich.progress import Progress

    from gpu_operator.kube import must_gather

    target = Path(output_file or time.strftime("must-gather-%Y%m%d-%H%M%S.tar.gz"))
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("reading the cluster", total=None)

        def progress(step: str, done: int, total: int) -> None:
            bar.update(task, description=f"reading {step}", completed=done, total=total)

        async def work(client: Any) -> Any:
            return await must_gather.gather(
                client, namespace, deadline=timeout, parallel=parallel, progress=progress
            )

        archive = run_api(kubeconfig, work)
    data = archive.tar_gz()
    try:
        target.write_bytes(data)
    except OSError as exc:
        err.print(f"error: {target}: {exc.strerror or exc}", markup=False)
        raise typer.Exit(2) from None
    left = ""
    if len(archive.left_out) > 3:  # thousands of cut logs at the deadline: MANIFEST.txt has them
        left = f"; left out: {len(archive.left_out)} items (listed in MANIFEST.txt)"
    elif archive.left_out:
        left = f"; left out: {'; '.join(archive.left_out)}"
    redacted = sum(archive.redacted.values())
    kinds = " (kinds in MANIFEST.txt)" if redacted else ""
    typer.echo(
        f"wrote {target}: {len(archive.files)} files, {len(data)} bytes, "
        f"{redacted} value(s) redacted{kinds}{left}"
    )
