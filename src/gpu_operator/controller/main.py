"""`gpu-operator controller`: run the operator until SIGTERM, then release the lease and exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Mapping

from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.controller import endpoints, gc_tuning, health
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client
from gpu_operator.nodes.coexist import CoexistPolicy
from gpu_operator.nodes.gate import StartupTaint

log = logging.getLogger(__name__)


# Ours, set by the chart: the operator's own image (operands running it get what our agents
# need, operands/builtin.py) and whether the runtime-config guard runs next to NVIDIA's toolkit.
OWN_ENV = ("OPERATOR_IMAGE", "RUNTIME_CONFIG_GUARD")


def image_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The operator's `*_IMAGE` env vars (fallbacks for images a ClusterPolicy leaves unset) and
    its own settings for the renderers (`OWN_ENV`)."""
    names = {*IMAGE_ENV.values(), *OWN_ENV}
    return {k: v for k, v in environ.items() if k in names and v}


async def run(
    *,
    kubeconfig: str | None,
    namespace: str,
    leader_elect: bool,
    metrics_address: str,
    leader_namespace: str | None = None,
    health_address: str,
    status_write_interval: float = 1.0,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Run until cancelled or signalled; SIGTERM and SIGINT stop it cleanly."""
    client = kube_client.connect(kubeconfig)
    identity = f"{socket.gethostname()}_{os.getpid()}"
    operator = Operator(
        client,
        Settings(
            namespace=namespace,
            identity=identity,
            leader_elect=leader_elect,
            leader_namespace=leader_namespace or None,
            operator_env=image_env(environ),
            coexist=CoexistPolicy.from_env(environ),
            startup_taint=StartupTaint.from_env(environ),
            status_write_interval=status_write_interval,
        ),
    )
    listeners = [
        await endpoints.serve(
            endpoints.health_routes(
                lambda: health.readiness(operator.runtime),
                lambda: health.liveness(operator.runtime),
            ),
            health_address,
            "operator health endpoint",
        ),
        await endpoints.serve(
            endpoints.metrics_routes(operator.metrics.registry),
            metrics_address,
            "operator metrics endpoint",
        ),
    ]
    task = asyncio.create_task(operator.run())
    # The collector, tuned for caches of millions of long-lived objects (controller/gc_tuning.py).
    collector = gc_tuning.GcTuning()
    collector.install()
    upkeep = asyncio.create_task(collector.keep(operator.ready))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, task.cancel)
    log.info("gpu-operator controller started (namespace %s, identity %s)", namespace, identity)
    try:
        await task
    except asyncio.CancelledError:
        log.info("shutting down")
    finally:
        upkeep.cancel()
        collector.uninstall()
        for listener in listeners:
            await listener.aclose()
        await client.close()
