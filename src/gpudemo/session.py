"""One demo run: start kubesim with the fleet, install CRDs and a ClusterPolicy, run the operator
in-process with the node programs, show convergence, summarize, and optionally keep serving.
`run` is the demo's entry point: with `install="helm"` it hands over to `helm_session.run`. The
pieces both runs share live in `cluster` (re-exported here for callers)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

from rich.console import Console

import kubesim
from gpu_operator.cli import render
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import node_features
from gpudemo import fit, helm_session, programs, view
from gpudemo import fleet as fleet_mod
from gpudemo.cluster import (
    DEFAULT_KUBECONFIG,
    DEFAULT_POLICY,
    NAMESPACE,
    NODE_CAPACITY,
    POLICY_NAME,
    Demo,
    Options,
    Result,
    kubectl_help,
    kubelet_config,
    observe,
    quiet_logs,
    with_namespace,
)

# The demo's shared pieces, re-exported: `session` is the demo's entry point for callers.
__all__ = [
    "DEFAULT_KUBECONFIG",
    "DEFAULT_POLICY",
    "NAMESPACE",
    "NODE_CAPACITY",
    "POLICY_NAME",
    "Demo",
    "Options",
    "Result",
    "kubelet_config",
    "observe",
    "run",
    "with_namespace",
]


async def run(options: Options, console: Console) -> Result:
    """Run the demo; returns whether every GPU node converged before the timeout."""
    options = fit.fit_fleet(options, console)
    if options.install == "helm":
        return await helm_session.run(options, console)
    with quiet_logs():
        return await _run_in_process(options, console)


async def _run_in_process(options: Options, console: Console) -> Result:
    fitted = fit.for_in_process(options, DEFAULT_POLICY)
    options = fitted.options
    demo = Demo(options, console)
    kubeconfig = options.kubeconfig_out
    if options.serve and kubeconfig is None:
        kubeconfig = DEFAULT_KUBECONFIG.expanduser()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    kubelet = kubelet_config(options)
    fleet = options.fleet
    console.print(
        f"gpu-operator demo: fleet [bold]{fleet.name}[/] with {fleet.node_count} nodes on an"
        " in-process simulated cluster (kubesim)",
        highlight=False,
    )
    for line in [*(f"  {d}" for d in fleet_mod.describe(fleet)), *fitted.lines]:
        console.print(line, markup=False, highlight=False)
    try:
        # A served cluster listens for anyone on this machine: like `kubesim serve`, it then
        # requires the bearer token its kubeconfig carries (over TLS).
        async with kubesim.Cluster(
            kubelet=kubelet,
            kubeconfig_path=kubeconfig,
            authentication=options.serve,
            images=options.images,
        ) as sim:
            nodes = programs.Programs(sim, options.timing, nvidia_toolkit=options.nvidia_toolkit)
            nodes.register()
            demo.populate(sim, nodes)
            client = kube_client.connect(str(sim.kubeconfig_path))
            operator = Operator(
                client,
                Settings(
                    namespace=NAMESPACE,
                    operator_env=render.DEFAULT_OPERATOR_ENV,
                    **options.operator_settings,
                ),
            )
            task = asyncio.create_task(operator.run())
            try:
                await asyncio.wait_for(operator.ready.wait(), 30)
                for obj in options.objects:
                    sim.store.create(with_namespace(obj))
                sim.store.create(options.policy)
                demo.policy_created = time.monotonic()
                deadline = time.monotonic() + options.timeout

                def finished(snap: view.Snapshot) -> bool:
                    return snap.converged or time.monotonic() > deadline or task.done()

                snap = await demo.watch(sim, stop, finished)
                result = observe(sim, snap.converged, kubeconfig)
                summary = None
                if snap.converged:
                    summary = view.summarize(
                        sim.store, snap, node_features.OWNED_LABELS_ANNOTATION, demo.hardware
                    )
                    kind = str(options.policy.get("kind") or "ClusterPolicy")
                    for line in view.summary_lines(summary, since=f"{kind} creation"):
                        console.print(line, markup=False, highlight=False)
                elif not stop.is_set():
                    console.print(
                        f"error: not converged after {options.timeout:.0f}s: "
                        + view.progress_line(snap),
                        markup=False,
                        highlight=False,
                    )
                if options.serve and not stop.is_set():
                    kind = str(options.policy.get("kind") or "ClusterPolicy")
                    for line in kubectl_help(sim.kubeconfig_path, kind):
                        console.print(line, markup=False, highlight=False)
                    if options.on_serving is not None:
                        options.on_serving(sim, nodes)
                    await demo.watch(sim, stop, lambda _snap: task.done())
                    console.print("stopping ...", highlight=False)
                result.summary = summary
                return result
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await client.close()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
