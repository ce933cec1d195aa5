"""The `gpu-operator` command: parse, call, print."""

from __future__ import annotations

import asyncio
import os
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console

import gpu_operator
from gpu_operator.agents import cli as agents_cli
from gpu_operator.api import crds as crd_gen
from gpu_operator.api import manifests, validation
from gpu_operator.cli import adopt, explain, images, upgrade

app = typer.Typer(
    name="gpu-operator",
    help="An API-compatible NVIDIA GPU Operator for Kubernetes, in Python.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(agents_cli.app)
app.add_typer(upgrade.app)
app.add_typer(explain.app)
app.command("must-gather")(explain.must_gather_command)
app.command("images")(images.images_command)
app.command("adopt")(adopt.adopt_command)

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpu-operator {gpu_operator.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """An API-compatible NVIDIA GPU Operator for Kubernetes, in Python."""


def _where(exc: Exception) -> str:
    """The URL a failed HTTP request went to, when the error knows it."""
    try:
        url = exc.request.url  # type: ignore[attr-defined]
        return f"{url.scheme}://{url.netloc.decode()}"
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is set
        return "the API server"


@app.command()
def crds(
    out: Path | None = typer.Option(
        None, "--out", help="Write one file per CRD into this directory instead of stdout."
    ),
    apply: bool = typer.Option(
        False, "--apply", help="Server-side apply the CRDs to the cluster and wait until served."
    ),
    delete: bool = typer.Option(
        False, "--delete", help="Delete the CRDs from the cluster (and every object of them)."
    ),
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: in-cluster)."
    ),
) -> None:
    """Print our CRDs generated from the models (ClusterPolicy, NVIDIADriver, and NVIDIA's
    GPUCluster, which ours does not reconcile yet), or install them."""
    generated = crd_gen.all_crds()
    if sum((out is not None, apply, delete)) > 1:
        err.print("error: --out, --apply and --delete exclude each other")
        raise typer.Exit(2)
    if apply or delete:
        # Imported here so that printing the CRDs never loads the client stack.
        from gpu_operator.kube import client as kube_client
        from gpu_operator.kube import crd_install

        async def run() -> list[str]:
            client = kube_client.connect(kubeconfig)
            try:
                if apply:
                    return await crd_install.apply(client, generated.values())
                names = [str(crd["metadata"]["name"]) for crd in generated.values()]
                return await crd_install.delete(client, names)
            finally:
                await client.close()

        import httpx2

        try:
            done = asyncio.run(run())
        except (kube_client.ConnectError, crd_install.CRDInstallError) as exc:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(1) from None
        except httpx2.TimeoutException as exc:
            # httpx's timeout errors often carry no message; say what happened instead.
            err.print(f"error: {_where(exc)}: timed out waiting for the API server", markup=False)
            raise typer.Exit(1) from None
        except httpx2.TransportError as exc:
            err.print(
                f"error: cannot reach {_where(exc)}: {exc or type(exc).__name__}", markup=False
            )
            raise typer.Exit(1) from None
        verb = f"applied (schema version {crd_gen.SCHEMA_VERSION})" if apply else "deleted"
        for name in done:
            typer.echo(f"customresourcedefinition/{name} {verb}")
        return
    if out is None:
        typer.echo(
            yaml.safe_dump_all(list(generated.values()), sort_keys=False, width=100), nl=False
        )
        return
    out.mkdir(parents=True, exist_ok=True)
    for filename, crd in generated.items():
        (out / filename).write_text(yaml.safe_dump(crd, sort_keys=False, width=100))
        err.print(f"wrote {out / filename}")


@app.command("cleanup-nodes")
def cleanup_nodes(
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: in-cluster)."
    ),
    namespace: str | None = typer.Option(
        None,
        "--namespace",
        envvar="OPERATOR_NAMESPACE",
        help="Namespace of the operator, whose pods must be gone first.",
    ),
    wait: float = typer.Option(
        120.0, "--wait", min=0.0, help="Seconds to wait for the operator's pods to go."
    ),
) -> None:
    """Remove the node labels and annotations the operator and GFD set (the uninstall hook)."""
    # Imported here so that the other commands never load the client stack.
    from gpu_operator.kube import client as kube_client
    from gpu_operator.kube import node_cleanup

    async def run() -> list[str]:
        client = kube_client.connect(kubeconfig)
        try:
            if namespace:
                await node_cleanup.wait_for_pods_gone(
                    client, namespace, node_cleanup.OPERATOR_SELECTOR, timeout=wait
                )
            return await node_cleanup.cleanup(client)
        finally:
            await client.close()

    try:
        changed = asyncio.run(run())
    except kube_client.ConnectError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None
    except Exception as exc:  # an API refusal (RBAC, connection): say what failed, exit 1
        err.print(f"error: cleaning up nodes: {exc}", markup=False)
        raise typer.Exit(1) from None
    for name in changed:
        typer.echo(f"node/{name} cleaned")
    typer.echo(f"{len(changed)} node(s) cleaned")


@app.command()
def validate(
    files: list[str] = typer.Option(
        ..., "-f", "--filename", help="Manifest file (YAML or JSON, several documents); - is stdin."
    ),
    kubeconfig: str | None = typer.Option(
        None,
        "--kubeconfig",
        help="Also read the ConfigMaps a ClusterPolicy or NVIDIADriver names from this cluster "
        "(those given with -f win).",
    ),
    namespace: str | None = typer.Option(
        None,
        "-n",
        "--namespace",
        envvar="OPERATOR_NAMESPACE",
        help="The operator's namespace, where --kubeconfig looks for the ConfigMaps.",
    ),
) -> None:
    """Check ClusterPolicy and NVIDIADriver manifests, mig-parted configs (a ConfigMap or a
    bare file) and the ConfigMaps they name: exit 0 valid, 1 invalid, 2 unreadable."""
    from gpu_operator import api
    from gpu_operator.controller import validate_refs

    if kubeconfig and not namespace:
        err.print("error: --kubeconfig needs --namespace (the operator's namespace)")
        raise typer.Exit(2)
    loaded: list[tuple[str, list[manifests.Document]]] = []
    for source in files:
        try:
            documents = manifests.read_documents(source)
        except manifests.ManifestError as exc:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(2) from None
        loaded.append(("<stdin>" if source == "-" else source, documents))
    objects = [(label, document.obj) for label, documents in loaded for document in documents]
    # A ConfigMap a policy names is checked as what that policy makes of it (below), not alone.
    given = {name: obj for _, obj in objects if (name := _config_map_name(obj))}
    referenced = {
        ref.name
        for _, obj in objects
        if isinstance(obj, dict)
        for ref in validate_refs.references_of(obj)
    }
    if kubeconfig and namespace and referenced - set(given):
        given = {**_read_config_maps(kubeconfig, namespace, referenced - set(given)), **given}
    failed = checked_any = False
    for label, documents in loaded:
        for document in documents:
            if _config_map_name(document.obj) in referenced:
                continue
            mig_ok = _check_mig_config(document.obj, label)
            if mig_ok is not None:
                checked_any = True
                failed |= not mig_ok
                continue
            result = validation.check_document(document.obj)
            if not result.skipped:
                decoded = [validation.Problem(path, message) for path, message in document.problems]
                result.errors[:0] = decoded
            if result.skipped:
                suggestion = validation.kind_suggestion(document.obj)
                if suggestion is None:
                    err.print(
                        f"{label}: {result.ref}: skipped (not a GPU operator kind)", markup=False
                    )
                    continue
                typer.echo(f"{label}: {result.ref}: {suggestion}")
                checked_any = failed = True
                continue
            model = result.obj if isinstance(result.obj, api.ClusterPolicy) else None
            refs = validate_refs.check(
                document.obj,
                given,
                complete=kubeconfig is not None,
                namespace=namespace,
                policy=model,
            )
            for warning in result.warnings:
                err.print(f"{label}: {result.ref}: warning: {warning}", markup=False)
            for text in refs.warnings:
                err.print(f"{label}: {result.ref}: warning: {text}", markup=False)
            for problem in [*map(str, result.errors), *refs.errors]:
                typer.echo(f"{label}: {result.ref}: {problem}")
            checked_any = True
            ok = result.ok and not refs.errors
            failed |= not ok
            if ok:
                err.print(f"{label}: {result.ref}: valid", markup=False)
    if not checked_any:
        err.print("error: no ClusterPolicy or NVIDIADriver found in the input", markup=False)
        raise typer.Exit(2)
    raise typer.Exit(1 if failed else 0)


def _config_map_name(obj: Any) -> str | None:
    if not isinstance(obj, dict) or obj.get("kind") != "ConfigMap":
        return None
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else None


def _read_config_maps(kubeconfig: str, namespace: str, names: set[str]) -> dict[str, Any]:
    """The named ConfigMaps from the cluster; exit 2 when it cannot be read."""
    from gpu_operator.kube import client as kube_client
    from gpu_operator.kube import config_maps

    try:
        return config_maps.read(kubeconfig, namespace, names)
    except kube_client.ConnectError as exc:
        err.print(f"error: {exc}", markup=False)
    except Exception as exc:  # an API refusal (RBAC, connection): one line, exit 2
        err.print(f"error: reading ConfigMaps in {namespace}: {exc}", markup=False)
    raise typer.Exit(2)


def _check_mig_config(obj: dict[str, Any], label: str) -> bool | None:
    """Check a mig-parted config (a ConfigMap holding one, or a bare file) and print the
    findings; True when valid, None when `obj` is no MIG config."""
    from gpu_operator.agents.mig_manager import check

    if check.is_mig_parted(obj):
        texts: list[tuple[str, Any]] = [(label, obj)]
    else:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        texts = []
        for key, text in check.config_map_entries(obj):
            source = f"{label}: ConfigMap/{name or '<unnamed>'}: data.{key}"
            try:
                parsed = manifests.parse(text, source)
            except manifests.ManifestError as exc:
                typer.echo(str(exc))
                return False
            texts.append((source, parsed[0] if len(parsed) == 1 else parsed))
        if not texts:
            return None
    ok = True
    for source, data in texts:
        report = check.check(data, source)
        for warning in report.warnings:
            err.print(f"warning: {warning}", markup=False)
        for problem in report.errors:
            typer.echo(problem)
        ok &= not report.errors
        if not report.errors:
            err.print(f"{source}: valid MIG config", markup=False)
    return ok


class LogFormat(StrEnum):
    text = "text"
    json = "json"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


@app.command()
def controller(
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: in-cluster)."
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", envvar="OPERATOR_NAMESPACE", help="Namespace of the operands."
    ),
    leader_elect: bool = typer.Option(
        False, "--leader-elect", help="Run only while holding the leader Lease (for HA)."
    ),
    leader_elect_namespace: str = typer.Option(
        "",
        "--leader-elect-namespace",
        envvar="LEADER_ELECT_NAMESPACE",
        help="Namespace of the leader Lease (default: the operator's namespace).",
    ),
    metrics_bind_address: str = typer.Option(":8080", help="Where /metrics is served."),
    health_probe_bind_address: str = typer.Option(
        ":8081",
        envvar="HEALTH_PROBE_BIND_ADDRESS",
        help="Where /healthz and /readyz are served; [$(POD_IP)]:8081 keeps them off other "
        "interfaces (the kubelet probes the pod IP).",
    ),
    log_level: LogLevel = typer.Option(LogLevel.info, help="Log level."),
    log_format: LogFormat = typer.Option(LogFormat.text, help="text, or json for log pipelines."),
    status_write_interval: float = typer.Option(
        1.0,
        envvar="STATUS_WRITE_INTERVAL",
        min=0.0,
        max=60.0,
        help="Seconds between status writes to one ClusterPolicy or NVIDIADriver; the newest "
        "status is written when they pass, a new failure at once (0: every change).",
    ),
) -> None:
    """Run the operator: reconcile ClusterPolicy, label GPU nodes, deploy the operands."""
    if not namespace:
        err.print("error: set --namespace or the OPERATOR_NAMESPACE environment variable")
        raise typer.Exit(1)
    # Imported here so that `validate` and friends start fast and never load the client stack.
    from gpu_operator.controller import logs
    from gpu_operator.controller import main as controller_main
    from gpu_operator.kube.client import ConnectError

    logs.configure(log_level.value, log_format.value)
    try:
        asyncio.run(
            controller_main.run(
                kubeconfig=kubeconfig,
                namespace=namespace,
                leader_elect=leader_elect,
                leader_namespace=leader_elect_namespace,
                metrics_address=metrics_bind_address,
                health_address=health_probe_bind_address,
                status_write_interval=status_write_interval,
            )
        )
    except ConnectError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None
    except OSError as exc:
        # A metrics or health port that is taken: asyncio's message names the address.
        err.print(f"error: {exc.strerror or exc}", markup=False)
        raise typer.Exit(1) from None


class RenderFormat(StrEnum):
    yaml = "yaml"
    json = "json"


@app.command("render")
def render_command(
    filenames: list[str] = typer.Option(
        ...,
        "-f",
        "--filename",
        help="File with a ClusterPolicy and the ConfigMaps it names, or a GPUCluster (YAML or "
        "JSON, several documents; repeatable); - is stdin.",
    ),
    facts: Path | None = typer.Option(
        None, "--facts", help="Cluster facts YAML (node pools, OS, runtime...; see docs/demo.md)."
    ),
    namespace: str | None = typer.Option(None, "--namespace", help="Operator namespace."),
    output: RenderFormat = typer.Option(RenderFormat.yaml, "-o", "--output", help="yaml or json."),
) -> None:
    """Print every object the controller would create for a ClusterPolicy (or a GPUCluster) and
    cluster facts."""
    import json

    from gpu_operator import api
    from gpu_operator.api.gpucluster import GPUCluster
    from gpu_operator.cli import render as render_mod
    from gpu_operator.cli.image_list import both_kinds_message

    labels = ["<stdin>" if filename == "-" else filename for filename in filenames]
    labelled: list[tuple[str, dict[str, Any]]] = []
    try:
        for filename, label in zip(filenames, labels, strict=True):
            labelled += [(label, doc) for doc in manifests.read(filename)]
        facts_file = (
            render_mod.load_facts(facts) if facts is not None else render_mod.parse_facts({})
        )
    except (manifests.ManifestError, render_mod.FactsError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    documents = [doc for _, doc in labelled]
    inputs = ", ".join(dict.fromkeys(labels))
    policies = [(label, d) for label, d in labelled if d.get("kind") == "ClusterPolicy"]
    clusters = [(label, d) for label, d in labelled if d.get("kind") == "GPUCluster"]
    if policies and clusters:
        err.print(f"error: {inputs}: {both_kinds_message(policies[0][1], clusters[0][1])}",
                  markup=False)  # fmt: skip
        raise typer.Exit(2)
    if not policies and not clusters:
        hints = [hint for d in documents if (hint := validation.kind_suggestion(d))]
        more = f" ({hints[0]})" if hints else ""
        err.print(f"error: {inputs}: no ClusterPolicy or GPUCluster found in the input{more}",
                  markup=False)  # fmt: skip
        raise typer.Exit(2)
    kind = "ClusterPolicy" if policies else "GPUCluster"
    chosen = policies or clusters
    covered = ("ClusterPolicy", "ConfigMap") if policies else ("GPUCluster",)
    for label, doc in labelled:
        if doc.get("kind") not in covered:
            err.print(f"{label}: {doc.get('kind')}: skipped (render covers {kind})")
    label, first = chosen[0]
    if len(chosen) > 1:
        err.print(f"{inputs}: several {kind} objects; rendering the first (the controller "
                  "reconciles only the oldest)", markup=False)  # fmt: skip
    result = validation.check_document(first)
    for warning in result.warnings:
        err.print(f"{label}: {result.ref}: warning: {warning}", markup=False)
    wanted = api.ClusterPolicy if policies else GPUCluster
    if not result.ok or not isinstance(result.obj, wanted):
        for problem in result.errors:
            err.print(f"{label}: {result.ref}: {problem}", markup=False)
        raise typer.Exit(1)
    if isinstance(result.obj, GPUCluster):
        given = render_mod.GivenConfigMaps()
        rendered = render_mod.render_cluster(result.obj, facts_file, namespace)
    else:
        given = render_mod.given_config_maps(documents, namespace or facts_file.namespace)
        rendered = render_mod.render(result.obj, facts_file, namespace, given.keys, given.data)
    for text in [*given.warnings, *rendered.warnings]:
        err.print(f"warning: {text}", markup=False)
    for state, kind, message in rendered.notes:
        if kind != "disabled":
            err.print(f"{state}: {kind}: {message}", markup=False)
    if output is RenderFormat.json:
        typer.echo(json.dumps(render_mod.to_list(rendered), indent=2))
    else:
        sources = " ".join(f"-f {label}" for label in labels)
        header = [f"gpu-operator render {sources}: {len(rendered.objects)} objects"]
        typer.echo(render_mod.to_yaml(rendered, header), nl=False)
    raise typer.Exit(1 if rendered.failed else 0)


class InstallMode(StrEnum):
    helm = "helm"
    in_process = "in-process"


@app.command("demo")
def demo_command(
    fleet: str | None = typer.Option(
        None,
        "--fleet",
        help="A named fleet (default, small, hopper, inference, mig, kubevirt, aks-preinstalled,"
        " dra, autoscaled) or a fleet file.",
    ),
    nodes: int | None = typer.Option(
        None, "--nodes", min=1, help="Scale the fleet's pools to about this many nodes."
    ),
    serve: bool = typer.Option(
        False, "--serve", help="Keep the cluster running for kubectl until Ctrl-C."
    ),
    kubeconfig_out: Path | None = typer.Option(
        None,
        "--kubeconfig-out",
        help="Where to write the kubeconfig (with --serve: ~/.kube/gpu-operator-demo.yaml).",
    ),
    policy: str | None = typer.Option(
        None,
        "--policy",
        help="ClusterPolicy (or GPUCluster: the DRA stack) file to install instead of the "
        "built-in default.",
    ),
    time_scale: float = typer.Option(
        1.0, "--time-scale", min=0.0, help="Multiply simulated operand delays (0: instant)."
    ),
    timeout: float = typer.Option(120.0, "--timeout", min=1.0, help="Give up after seconds."),
    live: bool | None = typer.Option(
        None, "--live/--no-live", help="Live table (default: only on a terminal)."
    ),
    install: InstallMode | None = typer.Option(
        None,
        "--install",
        help="helm: `helm install --wait` of the chart, everything it deploys running (the "
        "default); in-process: the operator in this process (the default with --policy).",
    ),
    values: list[Path] = typer.Option(
        [], "--values", "-f", help="Values file for `helm install` (repeatable; --install helm)."
    ),
    chart: Path | None = typer.Option(
        None, "--chart", help="The chart to install (default: charts/gpu-operator of the checkout)."
    ),
    sets: list[str] = typer.Option(
        [],
        "--set",
        help="KEY=VALUE for `helm install --set` (repeatable; --install helm), e.g. "
        "agents.builtin=true.",
    ),
    nvidia_toolkit: bool = typer.Option(
        False,
        "--nvidia-toolkit",
        help="Toolkit pods of NVIDIA's image behave as NVIDIA's toolkit (it rewrites the "
        "runtime config and leaves it so) instead of running our agent.",
    ),
    images: list[str] = typer.Option(
        [],
        "--image",
        help="An image the simulated registries hold besides the chart's and the public ones "
        "(kubesim's defaults), as [HOST/]PATH[:TAG] with globs, e.g. "
        "registry.example.com/nvidia/* for values pointing at a private mirror; other images "
        "fail to pull (ErrImagePull) as on a cluster. Repeatable.",
    ),
) -> None:
    """Run the operator on a simulated cluster with mock GPUs and show it converge."""
    # gRPC's core logs connection teardown (GOAWAY) at info level when the demo stops its
    # simulated kubelets and plugins; those lines are noise in the demo's output. Read when gRPC
    # first starts, so set before the demo creates any channel; an explicit setting wins.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # Imported here: the demo loads the simulated cluster, which no other command needs.
    from gpudemo import fleet as fleet_mod
    from gpudemo import programs, session

    try:
        chosen = fleet_mod.resolve(fleet)
        if nodes is not None:
            chosen = fleet_mod.scale(chosen, nodes)
    except fleet_mod.FleetError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    from kubesim import images as sim_images

    for pattern in images:
        try:
            sim_images.entry(pattern)
        except ValueError as exc:
            err.print(f"error: --image: {exc}", markup=False)
            raise typer.Exit(2) from None
    body = session.DEFAULT_POLICY
    extra: list[dict[str, Any]] = []
    if policy is not None:
        try:
            documents = manifests.read(policy)
        except manifests.ManifestError as exc:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(2) from None
        # A ClusterPolicy (the device plugin stack) or a GPUCluster (the DRA stack).
        found = [d for d in documents if d.get("kind") in ("ClusterPolicy", "GPUCluster")]
        if not found:
            err.print(f"error: {policy}: no ClusterPolicy or GPUCluster found", markup=False)
            raise typer.Exit(2)
        result = validation.check_document(found[0])
        if not result.ok:
            for problem in result.errors:
                err.print(f"{policy}: {result.ref}: {problem}", markup=False)
            raise typer.Exit(1)
        body = found[0]
        # The ConfigMaps the policy names (device-plugin configs, MIG configs) come along.
        extra = [d for d in documents if d.get("kind") == "ConfigMap"]
    mode = install or (InstallMode.in_process if policy is not None else InstallMode.helm)
    if mode is InstallMode.helm and policy is not None:
        err.print("error: --policy needs --install in-process; with helm, pass --values FILE")
        raise typer.Exit(2)
    if mode is InstallMode.in_process and (values or sets or chart is not None):
        err.print("error: --values and --chart need --install helm (and so does --set)")
        raise typer.Exit(2)
    for path in values:
        if not path.is_file():
            err.print(f"error: --values {path}: no such file", markup=False)
            raise typer.Exit(2)
    console = Console(highlight=False, soft_wrap=True)
    options = session.Options(
        fleet=chosen,
        install=mode.value,
        values=list(values),
        sets=list(sets),
        nvidia_toolkit=nvidia_toolkit,
        images=list(images),
        chart=chart,
        policy=body,
        objects=extra,
        serve=serve,
        kubeconfig_out=kubeconfig_out,
        timing=programs.Timing(scale=time_scale),
        timeout=timeout,
        live=live,
    )
    if mode is InstallMode.helm:
        from gpudemo import install as install_mod

        try:
            install_mod.find_helm()
            options.chart = chart or install_mod.find_chart()
        except (install_mod.HelmNotFound, FileNotFoundError) as exc:
            err.print(f"error: {exc} (or use --install in-process)", markup=False)
            raise typer.Exit(2) from None
    outcome = asyncio.run(session.run(options, console))
    raise typer.Exit(0 if outcome.converged else 1)


def main() -> None:
    app()
