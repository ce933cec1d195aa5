"""The kubelet's prober for runner containers that serve their ports (opt-in).

kubesim's kubelet runs no probes by itself. A runner whose program serves HTTP or TCP on pod ports
(`ctx.serve_port`) can hand its container to `Prober`, which probes those ports as the kubelet
does: the startup probe first, then readiness (`ctx.set_ready`) and liveness, with the container's
`initialDelaySeconds`, `periodSeconds`, `timeoutSeconds`, `successThreshold` and
`failureThreshold` (times `time_scale`, so tests can run them fast), and the kubelet's `Unhealthy`
and `Killing` Events. A failed startup or liveness probe ends `Prober.run` with `Verdict.KILL`;
the runner then stops its program, so the kubelet restarts the container per its restartPolicy.

Kubelet facts kept here: an HTTP probe succeeds on a status from 200 to 399; a container without
a readiness probe is ready once started (and once its startup probe passed); probe defaults are
period 10 s, timeout 1 s, success 1, failure 3. `exec` and `grpc` probes are not run: they count
as passing (the runner owns no process kubesim could exec in).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from kubesim.controllers.kubelet import PodContext

log = logging.getLogger(__name__)

# The smallest period when time_scale shrinks probes towards zero (no busy loop).
MIN_PERIOD = 0.02


class Verdict(enum.Enum):
    """How probing ended: the container is being stopped, or the kubelet would kill it."""

    STOPPED = "stopped"
    KILL = "kill"


@dataclass(frozen=True)
class Probe:
    """One probe of a container, with its port resolved to a number."""

    kind: str  # "startup", "readiness" or "liveness"
    handler: str  # "httpGet", "tcpSocket", or the name of a handler that is not run
    port: int
    path: str
    scheme: str
    headers: tuple[tuple[str, str], ...]
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def parse(cls, kind: str, spec: dict[str, Any], container: dict[str, Any]) -> Probe:
        """A probe from its container spec field (`readinessProbe`, ...)."""
        handler = next((h for h in ("httpGet", "tcpSocket", "grpc", "exec") if h in spec), "")
        action = spec.get(handler) or {}
        return cls(
            kind=kind,
            handler=handler,
            port=_port_number(action.get("port"), container),
            path=str(action.get("path") or "/"),
            scheme=str(action.get("scheme") or "HTTP").lower(),
            headers=tuple(
                (str(h.get("name", "")), str(h.get("value", "")))
                for h in action.get("httpHeaders") or []
            ),
            initial_delay=float(spec.get("initialDelaySeconds") or 0),
            period=float(spec.get("periodSeconds") or 10),
            timeout=float(spec.get("timeoutSeconds") or 1),
            success_threshold=int(spec.get("successThreshold") or 1),
            failure_threshold=int(spec.get("failureThreshold") or 3),
        )

    @property
    def runs(self) -> bool:
        return self.handler in ("httpGet", "tcpSocket")


def _port_number(port: Any, container: dict[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports (0 if unknown)."""
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item.get("containerPort") or 0)
    return 0


class Prober:
    """Probes one runner container until it stops or a startup/liveness probe fails."""

    def __init__(self, ctx: PodContext, *, time_scale: float = 1.0) -> None:
        self.ctx = ctx
        self.time_scale = time_scale
        container = ctx.container
        self.probes = {
            kind: Probe.parse(kind, container[f"{kind}Probe"], container)
            for kind in ("startup", "readiness", "liveness")
            if isinstance(container.get(f"{kind}Probe"), dict)
        }
        self._session: aiohttp.ClientSession | None = None

    def _seconds(self, value: float, *, period: bool = False) -> float:
        scaled = value * self.time_scale
        return max(scaled, MIN_PERIOD) if period else scaled

    async def run(self) -> Verdict:
        """Probe until the container stops (STOPPED) or must be killed (KILL)."""
        self._session = aiohttp.ClientSession()
        try:
            startup = self.probes.get("startup")
            if startup is not None and not await self._until_success(startup):
                return Verdict.KILL
            readiness = self.probes.get("readiness")
            if readiness is None:
                self.ctx.set_ready(True)
            tasks: list[asyncio.Task[Verdict]] = [
                asyncio.create_task(self._loop(probe))
                for probe in (readiness, self.probes.get("liveness"))
                if probe is not None
            ]
            stopping = asyncio.create_task(self.ctx.stopping.wait())
            try:
                await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (*tasks, stopping):
                    task.cancel()
                await asyncio.gather(*tasks, stopping, return_exceptions=True)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is None:
                    return task.result()
            return Verdict.STOPPED
        finally:
            await self._session.close()

    async def _until_success(self, probe: Probe) -> bool:
        """The startup probe: True once it succeeds, False after failureThreshold failures."""
        await self._sleep(self._seconds(probe.initial_delay))
        failures = 0
        while not self.ctx.stopping.is_set():
            ok, why = await self.check(probe)
            if ok:
                return True
            failures += 1
            self._unhealthy(probe, why)
            if failures >= probe.failure_threshold:
                self._killing(probe)
                return False
            await self._sleep(self._seconds(probe.period, period=True))
        return True

    async def _loop(self, probe: Probe) -> Verdict:
        """Readiness (sets the container's readiness) or liveness (returns KILL on failure)."""
        await self._sleep(self._seconds(probe.initial_delay))
        successes = failures = 0
        ready = False
        while not self.ctx.stopping.is_set():
            ok, why = await self.check(probe)
            if ok:
                successes, failures = successes + 1, 0
            else:
                successes, failures = 0, failures + 1
                self._unhealthy(probe, why)
            if probe.kind == "readiness":
                if ok and not ready and successes >= probe.success_threshold:
                    ready = True
                    self.ctx.set_ready(True)
                elif not ok and ready and failures >= probe.failure_threshold:
                    ready = False
                    self.ctx.set_ready(False)
            elif failures >= probe.failure_threshold:
                self._killing(probe)
                return Verdict.KILL
            await self._sleep(self._seconds(probe.period, period=True))
        return Verdict.STOPPED

    async def check(self, probe: Probe) -> tuple[bool, str]:
        """Run a probe once: (passed, why it failed)."""
        if not probe.runs:
            return True, ""
        # Messages name the pod's address, as the kubelet's Go client reports them.
        target = f"{self._pod_ip()}:{probe.port}"
        refused = f"dial tcp {target}: connect: connection refused"
        address = self.ctx._instance.ports.get(probe.port)
        if address is None:
            return False, refused if probe.handler == "tcpSocket" else self._get_failed(
                probe, target, refused
            )
        host, port = address
        timeout = max(self._seconds(probe.timeout), MIN_PERIOD)
        if probe.handler == "tcpSocket":
            try:
                _reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), timeout
                )
            except TimeoutError:
                return False, f"dial tcp {target}: i/o timeout"
            except OSError:
                return False, refused
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True, ""
        assert self._session is not None
        try:
            async with self._session.get(
                f"{probe.scheme}://{host}:{port}{probe.path}",
                headers=dict(probe.headers),
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
                ssl=False,
            ) as response:
                status = response.status
        except TimeoutError:
            why = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            return False, self._get_failed(probe, target, why)
        except (aiohttp.ClientError, OSError):
            return False, self._get_failed(probe, target, refused)
        if 200 <= status < 400:
            return True, ""
        return False, f"HTTP probe failed with statuscode: {status}"

    @staticmethod
    def _get_failed(probe: Probe, target: str, why: str) -> str:
        return f'Get "{probe.scheme}://{target}{probe.path}": {why}'

    def _pod_ip(self) -> str:
        pod = self.ctx.pod
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            with contextlib.suppress(Exception):
                ip = self.ctx._kubelet.pod_ip(pod["metadata"].get("uid", ""), pod)
        return str(ip or "")

    async def _sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less when the container stops."""
        if seconds <= 0 or self.ctx.stopping.is_set():
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ctx.stopping.wait(), seconds)

    def _field_path(self) -> str:
        group = "initContainers" if self.ctx.init else "containers"
        return f"spec.{group}{{{self.ctx.container_name}}}"

    def _event(self, event_type: str, reason: str, message: str) -> None:
        events = getattr(self.ctx._kubelet, "events", None)
        if events is None:
            return
        try:
            events.record(
                self.ctx.pod,
                event_type,
                reason,
                message,
                component="kubelet",
                host=self.ctx.node_name,
                field_path=self._field_path(),
            )
        except Exception:  # an Event is best effort, as on a real kubelet
            log.debug("could not record a probe Event", exc_info=True)

    def _unhealthy(self, probe: Probe, why: str) -> None:
        self._event("Warning", "Unhealthy", f"{probe.kind.capitalize()} probe failed: {why}")

    def _killing(self, probe: Probe) -> None:
        self._event(
            "Normal",
            "Killing",
            f"Container {self.ctx.container_name} failed {probe.kind} probe, will be restarted",
        )
