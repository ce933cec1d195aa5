"""The demo through the real install path: kubesim (RBAC enforced), then the real `helm install
--wait` of the chart from the checkout, then the same live view and summary as the in-process demo.

Everything the chart deploys runs: the operator Deployment's `gpu-operator controller` as a
process with its pod's ServiceAccount token (`install.OperatorImage`), NFD's master, worker and
gc (`nfd.Programs`), and the operands the operator creates (`programs.Programs`). No label is
written by hand: NFD labels the nodes from their simulated hardware files.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

from rich.console import Console

import kubesim
from gpu_operator.kube import node_features
from gpudemo import cluster, fit, install, programs, view
from gpudemo import fleet as fleet_mod
from simhost import nfd

MIN_PROBE_SCALE = 0.1
NFD_CHART = "node-feature-discovery"


def _helm_help(helm: install.Helm, chart: str) -> list[str]:
    k = f"kubectl --kubeconfig {helm.kubeconfig}"
    h = f"{helm.binary} --kubeconfig {helm.kubeconfig}"
    ns = f"-n {helm.namespace}"
    return [
        f"  {h} {ns} list",
        f"  {h} {ns} upgrade {helm.release} {chart} --reuse-values"
        " --set dcgmExporter.enabled=false",
        f"  {h} {ns} uninstall {helm.release}     # leaves no operator or NFD label on the nodes",
        f"  {k} {ns} logs deploy/{helm.release}",
    ]


def prepare(sim: kubesim.Cluster, demo: cluster.Demo) -> programs.Programs:
    """Register the programs of the chart's images and the operands, and create the fleet's
    nodes with their host files: the cluster is then ready for `helm install`."""
    options = demo.options
    nodes = programs.Programs(sim, options.timing, nvidia_toolkit=options.nvidia_toolkit)
    nodes.register()
    # Probes run on the operands' time scale (real periods by default), but never so fast that
    # a liveness probe kills a process before it could start serving (about half a second).
    probe_scale = max(options.timing.scale, MIN_PROBE_SCALE)
    nfd.Programs(lambda ctx: install.pod_kubeconfig(sim, ctx), probe_scale).register(sim)
    install.OperatorImage(sim, probe_time_scale=probe_scale).register()
    demo.populate(sim, nodes, install=False)
    return nodes


async def _release_brings_nfd(
    helm: install.Helm, chart: Path, values: list[Path], sets: list[str] | None = None
) -> bool:
    """Whether the chart with these values deploys NFD (`nfd.enabled`)."""
    args = ["template", helm.release, str(chart)]
    for path in values:
        args += ["-f", str(path)]
    for item in sets or ():
        args += ["--set", item]
    code, out = await helm.run(*args)
    return code != 0 or f"{NFD_CHART}-worker" in out  # a bad render: let install say why


async def _install_nfd_alone(sim: kubesim.Cluster, chart: Path, console: Console) -> None:
    """NFD on its own, as the Network Operator brings it on AKS, for values that turn it off."""
    nfd_chart = chart / "charts" / NFD_CHART
    if not (nfd_chart / "Chart.yaml").is_file():
        console.print("note: the values turn NFD off and the chart has no NFD sub-chart to"
                      " install on its own: nodes get no NFD labels", highlight=False)  # fmt: skip
        return
    separate = install.Helm(sim.kubeconfig_path, release="nfd", namespace=NFD_CHART)
    console.print(
        f"the values turn NFD off (NFD comes with the cluster, as the Network Operator brings it"
        f" on AKS): helm install nfd {nfd_chart} -n {NFD_CHART} --create-namespace --wait",
        markup=False,
        highlight=False,
    )
    code, out = await separate.install(nfd_chart)
    if code != 0:
        console.print(f"warning: installing NFD failed (exit {code}): {out.strip()}",
                      markup=False, highlight=False)  # fmt: skip


async def run(options: cluster.Options, console: Console) -> cluster.Result:
    """Install the chart with helm on a fresh simulated cluster and show it converge."""
    with cluster.quiet_logs():
        return await _run(options, console)


async def _run(options: cluster.Options, console: Console) -> cluster.Result:
    chart = options.chart or install.find_chart()
    fitted = fit.for_helm(options, chart)
    options = fitted.options
    demo = cluster.Demo(options, console)
    kubeconfig = options.kubeconfig_out
    if options.serve and kubeconfig is None:
        kubeconfig = cluster.DEFAULT_KUBECONFIG.expanduser()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    fleet = options.fleet
    console.print(
        f"gpu-operator demo: fleet [bold]{fleet.name}[/] with {fleet.node_count} nodes on a"
        " simulated cluster (kubesim, RBAC enforced), installed with helm",
        highlight=False,
    )
    for line in [*(f"  {d}" for d in fleet_mod.describe(fleet)), *fitted.lines]:
        console.print(line, markup=False, highlight=False)
    installing: asyncio.Task[tuple[int, str]] | None = None
    try:
        async with kubesim.Cluster(
            kubelet=cluster.kubelet_config(options),
            kubeconfig_path=kubeconfig,
            authorization="rbac",
            images=options.images,
        ) as sim:
            nodes = prepare(sim, demo)
            helm = install.Helm(sim.kubeconfig_path)
            demo.policy_created = time.monotonic()
            if not await _release_brings_nfd(helm, chart, options.values, options.sets):
                await _install_nfd_alone(sim, chart, console)
            command = ["helm install", helm.release, str(chart), "-n", helm.namespace]
            command += ["--create-namespace", "--wait", *(f"-f {v}" for v in options.values)]
            command += [f"--set {item}" for item in options.sets]
            command += [f"--set-json '{item}'" for item in options.set_json]
            console.print(" ".join(command), markup=False, highlight=False)
            wait = f"{max(int(options.timeout), 1)}s"
            installing = asyncio.create_task(
                helm.install(chart, options.values, options.sets, wait=wait,
                             set_json=options.set_json)
            )  # fmt: skip
            deadline = time.monotonic() + options.timeout

            def failed() -> bool:
                return installing is not None and installing.done() and installing.result()[0] != 0

            def finished(snap: view.Snapshot) -> bool:
                done = installing is not None and installing.done()
                return (snap.converged and done) or failed() or time.monotonic() > deadline

            snap = await demo.watch(sim, stop, finished)
            converged = snap.converged and installing.done() and not failed()
            result = cluster.observe(sim, converged, kubeconfig)
            summary = None
            if failed():
                code, output = installing.result()
                console.print(f"error: helm install failed (exit {code}):", highlight=False)
                console.print(output.rstrip(), markup=False, highlight=False)
            elif converged:
                summary = view.summarize(
                    sim.store, snap, node_features.OWNED_LABELS_ANNOTATION, demo.hardware
                )
                for line in view.summary_lines(summary, since="the start of `helm install`"):
                    console.print(line, markup=False, highlight=False)
            elif not stop.is_set():
                console.print(
                    f"error: not converged after {options.timeout:.0f}s: "
                    + view.progress_line(snap),
                    markup=False,
                    highlight=False,
                )
            if options.serve and not stop.is_set():
                lines = cluster.kubectl_help(sim.kubeconfig_path)
                for line in [*lines[:-1], *_helm_help(helm, str(chart)), lines[-1]]:
                    console.print(line, markup=False, highlight=False)
                if options.on_serving is not None:
                    options.on_serving(sim, nodes)
                await demo.watch(sim, stop, lambda _snap: False)
                console.print("stopping ...", highlight=False)
            result.summary = summary
            return result
    finally:
        if installing is not None and not installing.done():
            installing.cancel()
            await asyncio.gather(installing, return_exceptions=True)
        for sig in handled:
            loop.remove_signal_handler(sig)
