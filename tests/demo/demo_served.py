"""The demo served to real clients, for end-to-end tests: the session runs in this event loop
and the test gets the cluster, the node programs and a kubeconfig for kubectl."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kubesim_helpers import KUBECTL
from rich.console import Console
from waiting import within

import kubesim
from gpudemo import fleet, programs, session

Served = tuple[kubesim.Cluster, programs.Programs, Path]


@asynccontextmanager
async def serve_demo(
    tmp_path: Path,
    chosen: fleet.Fleet,
    *,
    timeout: float = 60.0,
    wait: float = 90.0,
    **options: Any,
) -> AsyncIterator[Served]:
    """Run the demo on `chosen` until it converged (or `timeout` passed) and serve it; the
    session's output is shown when it never started serving within `wait` seconds."""
    ready: asyncio.Future[tuple[kubesim.Cluster, programs.Programs]] = (
        asyncio.get_running_loop().create_future()
    )
    kubeconfig = tmp_path / "kubeconfig"
    buffer = io.StringIO()
    settings = session.Options(
        fleet=chosen,
        serve=True,
        kubeconfig_out=kubeconfig,
        timing=options.pop("timing", programs.Timing(scale=0.0)),
        timeout=timeout,
        live=False,
        on_serving=lambda sim, nodes: ready.set_result((sim, nodes)),
        **options,
    )
    task = asyncio.ensure_future(session.run(settings, Console(file=buffer, width=200)))
    try:
        waiters: set[asyncio.Future[Any]] = {task, ready}
        done, _ = await asyncio.wait(waiters, timeout=wait, return_when="FIRST_COMPLETED")
        assert ready in done, buffer.getvalue()
        sim, nodes = ready.result()
        yield sim, nodes, kubeconfig
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def run_kubectl(kubeconfig: Path, *args: str, timeout: float = 60.0) -> tuple[int, str]:
    """`kubectl --kubeconfig KUBECONFIG ARGS...`: exit code and output (stderr included)."""
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(kubeconfig), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await within(proc.communicate(), f"kubectl {' '.join(args)}", timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode()
