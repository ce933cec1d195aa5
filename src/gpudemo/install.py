"""The real install path on the simulated cluster: the chart's pods run what their images would.

* `OperatorImage` is the program of every container of the operator image
  (`ghcr.io/gpu-operator-py/gpu-operator`): it runs the container's command line (`gpu-operator
  controller ...`, `gpu-operator crds --apply`, `gpu-operator cleanup-nodes`) as a process on this
  machine, with the container's environment (`$(VAR)` references expanded as the kubelet does)
  and its pod's ServiceAccount token as the in-cluster credentials (`KUBECONFIG`). Each pod has
  its own network namespace in a real cluster; here the `--*-address` flags are moved to free
  loopback ports and served as the pod's ports, so `kubectl port-forward` reaches them and the
  kubelet's probes (`kubesim.probes`) hit the controller's `/healthz` and `/readyz`.
* `Helm` runs the real helm binary against the cluster (`helm install --wait` of the chart from
  the checkout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubesim
from kubesim import PodContext, private_files, probes
from kubesim import errors as sim_errors

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_IMAGE = "ghcr.io/gpu-operator-py/gpu-operator"
ENTRYPOINT = "gpu-operator"
# Where the kubelet projects a pod's ServiceAccount token (the kube-api-access volume).
TOKEN_DIR = "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/kube-api-access"
# Environment a container image brings besides what the pod spec sets.
IMAGE_ENV = ("PATH", "HOME", "LANG", "LC_ALL")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion in command and args: defined variables are replaced,
    undefined references stay as written, `$$` is a literal `$`."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(one, text)


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """What the container runs: its command (or the image's entry point) and its args."""
    command = [str(c) for c in container.get("command") or []] or [ENTRYPOINT]
    args = [str(a) for a in container.get("args") or []]
    return [expand(part, env) for part in (*command, *args)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bind_locally(args: Sequence[str]) -> tuple[list[str], dict[int, int]]:
    """Move every `--*-address HOST:PORT` listener to a free loopback port; returns the new args
    and which local port serves each pod port (a port of 0 stays off)."""
    out: list[str] = []
    ports: dict[int, int] = {}
    pending: str | None = None
    for arg in args:
        if pending is not None:
            out.append(_rebind(arg, ports))
            pending = None
            continue
        name, sep, value = arg.partition("=")
        if name.startswith("--") and name.endswith("-address"):
            if sep:
                out.append(f"{name}={_rebind(value, ports)}")
                continue
            pending = name
        out.append(arg)
    return out, ports


def _rebind(address: str, ports: dict[int, int]) -> str:
    _host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return address
    local = ports.setdefault(int(port), free_port())
    return f"127.0.0.1:{local}"


def pod_kubeconfig(sim: kubesim.Cluster, ctx: PodContext) -> Path:
    """A kubeconfig with the pod's projected ServiceAccount token, written where the kubelet
    keeps the pod's kube-api-access volume on its node (what in-cluster config reads)."""
    token = sim.auth.token_for_pod(ctx.pod)
    directory = ctx.host_path(TOKEN_DIR.format(uid=ctx.pod["metadata"]["uid"]))
    directory.mkdir(parents=True, exist_ok=True)
    # The token and the kubeconfig carrying it are readable by their owner only.
    private_files.write(directory / "token", token)
    (directory / "namespace").write_text(ctx.namespace)
    path = directory / f"kubeconfig-{ctx.container_name}"
    return sim.auth.write_kubeconfig(token, path, namespace=ctx.namespace)


@dataclass
class OperatorImage:
    """Runs the operator image's command line as a process for each of its containers."""

    sim: kubesim.Cluster
    probe_time_scale: float = 1.0
    python: str = sys.executable

    def register(self, image: str = OPERATOR_IMAGE) -> None:
        # The chart's own pods only (operator, hook Jobs): operand pods of this image
        # (`agents.builtin`) are the demo's node programs, and the validator's workload pods
        # run as kubesim runs any container (their `vectorAdd` is the demo's CUDA sample).
        self.sim.register_pod_runner(
            self.run,
            image=image,
            label_selector="app.kubernetes.io/managed-by=Helm",
            reports_readiness=True,
        )

    async def run(self, ctx: PodContext) -> int:
        argv = command_line(ctx.container, ctx.env)
        if Path(argv[0]).name != ENTRYPOINT:
            ctx.log(f'exec: "{argv[0]}": executable file not found in $PATH', "stderr")
            return 127
        try:
            kubeconfig = pod_kubeconfig(self.sim, ctx)
        except sim_errors.ApiError as err:
            ctx.log(f"error: no ServiceAccount token for the pod: {err}", "stderr")
            return 1
        args, ports = bind_locally(argv[1:])
        env = {k: os.environ[k] for k in IMAGE_ENV if k in os.environ}
        env.update(ctx.env)
        env.update(KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "gpu_operator", *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        pumps = [
            asyncio.create_task(_pump(proc.stdout, ctx, "stdout")),
            asyncio.create_task(_pump(proc.stderr, ctx, "stderr")),
        ]
        prober: asyncio.Task[probes.Verdict] | None = None
        try:
            for pod_port, local in ports.items():
                await ctx.serve_port(pod_port, ("127.0.0.1", local))
            prober = asyncio.create_task(probes.Prober(ctx, time_scale=self.probe_time_scale).run())
            exited = asyncio.create_task(proc.wait())
            await asyncio.wait([exited, prober], return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():
                # The container is stopping, or the kubelet kills it for a failed startup or
                # liveness probe: SIGTERM, then the grace period.
                await _terminate(proc, self._grace(ctx))
                if prober.result() is probes.Verdict.KILL:
                    return 137
            await asyncio.gather(*pumps, return_exceptions=True)
            return _exit_code(proc.returncode)
        finally:
            if proc.returncode is None:
                # The pod is stopping (this task is being cancelled): SIGTERM, then the grace.
                await _terminate(proc, self._grace(ctx))
            if prober is not None:
                prober.cancel()
            for pump in pumps:
                pump.cancel()

    @staticmethod
    def _grace(ctx: PodContext) -> float:
        spec = ctx.pod.get("spec") or {}
        return float(spec.get("terminationGracePeriodSeconds") or 30)


async def _pump(stream: asyncio.StreamReader | None, ctx: PodContext, name: str) -> None:
    if stream is None:
        return
    async for line in stream:
        ctx.log(line.rstrip(b"\n"), name)


async def _terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 137
    return 128 - returncode if returncode < 0 else returncode


# ----- helm --------------------------------------------------------------------------------------


class HelmNotFound(RuntimeError):
    """No helm binary: scripts/setup installs one into .tools/bin."""


def find_helm() -> Path:
    """$HELM, the project's .tools/bin/helm, or helm on PATH."""
    for candidate in (os.environ.get("HELM"), ROOT / ".tools" / "bin" / "helm"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    found = shutil.which("helm")
    if found:
        return Path(found)
    raise HelmNotFound("helm not found: run scripts/setup (it installs .tools/bin/helm)")


def find_chart() -> Path:
    """The chart of this checkout (charts/gpu-operator)."""
    for base in (ROOT, Path.cwd()):
        chart = base / "charts" / "gpu-operator"
        if (chart / "Chart.yaml").is_file():
            return chart
    raise FileNotFoundError("charts/gpu-operator not found: run from a checkout of the project")


@dataclass
class Helm:
    """The real helm binary against one cluster."""

    kubeconfig: Path
    binary: Path = field(default_factory=find_helm)
    release: str = "gpu-operator"
    namespace: str = "gpu-operator"

    async def run(self, *args: str, timeout: float = 600.0) -> tuple[int, str]:
        """Run `helm <args>` (release namespace and kubeconfig set); exit status and output."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        # Keep helm's caches out of the user's home: the demo is a throw-away cluster.
        for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env.setdefault(name, str(self.kubeconfig.parent / ".helm" / name.lower()))
        proc = await asyncio.create_subprocess_exec(
            str(self.binary), *args, "-n", self.namespace,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
            return 124, out.decode(errors="replace")
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        return proc.returncode or 0, out.decode(errors="replace")

    async def install(
        self,
        chart: Path,
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        wait: str = "5m",
        set_json: Sequence[str] = (),
    ) -> tuple[int, str]:
        """`helm install --wait` of the chart, creating the namespace."""
        args = ["install", self.release, str(chart), "--create-namespace"]
        args += ["--wait", "--timeout", wait]
        for path in values:
            args += ["-f", str(path)]
        for item in sets:
            args += ["--set", item]
        for item in set_json:
            args += ["--set-json", item]
        return await self.run(*args)
