"""The plugin's I/O: NVML, the kubelet's sockets, the API server, the checkpoint, CDI files.

`Plugin.run()` reads the GPUs, serves the DRA service (v1 and v1beta1 on one socket under
`<kubelet root>/plugins/gpu.nvidia.com/`), registers through
`<kubelet root>/plugins_registry/gpu.nvidia.com-reg.sock`, publishes the node's slices and then
republishes whenever device health (NVML XID/ECC events, the device plugin's health rules) or
the MIG layout (re-read every `rescan_interval`) changes. Decisions are the pure modules'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import grpc

from gpu_operator import nvml
from gpu_operator.agents import cdi as common
from gpu_operator.agents.dcgm_exporter import podresources
from gpu_operator.agents.device_plugin import health, monitor, mps, mps_daemon
from gpu_operator.agents.dra import serving
from gpu_operator.agents.dra.serving import KUBELET_ROOT as KUBELET_ROOT
from gpu_operator.agents.dra.serving import StartError as StartError
from gpu_operator.agents.dra_kubelet_plugin import checkpoint, gpuconfig, handover, prepare, slices
from gpu_operator.agents.dra_kubelet_plugin.inventory import Inventory, collect
from gpu_operator.kube.resource_slices import SliceApi

log = logging.getLogger("gpu_operator.agents.dra_kubelet_plugin")

BOOT_ID = "proc/sys/kernel/random/boot_id"


@dataclass
class Settings(serving.KubeletPluginSettings):
    driver: ClassVar[str] = slices.DRIVER
    driver_root_view: Path = Path("/")
    driver_root: str = "/"
    dev_root_view: Path = Path("/")
    dev_root: str = "/"
    sys_root: Path = Path("/")
    proc_root: Path = Path("/")
    gates: Mapping[str, bool] = field(default_factory=lambda: dict(gpuconfig.DEFAULT_GATES))
    health_policy: health.XidPolicy = field(default_factory=health.XidPolicy)
    rescan_interval: float = 5.0
    recheck_interval: float = 1.0
    # Check the device plugin's hand-over (docs/dra.md, "Migrating from the device plugin").
    handover_check: bool = True

    @property
    def mps_root_view(self) -> Path:
        """Per MPS-shared claim `<claim UID>/{pipe,log,shm}` (NVIDIA's layout), as seen here."""
        return self.plugin_dir / "mps"

    @property
    def mps_root(self) -> str:
        """The same directory as the node's path (the claims' CDI mounts name it)."""
        return f"{self.kubelet_root.rstrip('/')}/plugins/{self.driver}/mps"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root_view / "pod-resources" / "kubelet.sock"


class TimeSlicer:
    """Sets a GPU's time-slice: `nvidia-smi compute-policy --set-timeslice` (and compute mode
    DEFAULT) on real GPUs, as NVIDIA's plugin does; the mock NVML has no such setting, so a
    simulated node records it (`current`)."""

    def __init__(self, *, simulated: bool) -> None:
        self.simulated = simulated
        self.current: dict[str, str] = {}

    async def apply(self, uuid: str, interval: str) -> None:
        if not self.simulated:
            await _run("nvidia-smi", "-i", uuid, "-c", "DEFAULT")
            level = str(gpuconfig.INTERVALS[interval])
            await _run("nvidia-smi", "compute-policy", "-i", uuid, f"--set-timeslice={level}")
        self.current[uuid] = interval
        log.info("GPU %s: time-slice %s", uuid, interval)

    async def reset(self, uuid: str) -> None:
        await self.apply(uuid, "Default")


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {out.decode().strip()}")


class Plugin(serving.KubeletPlugin):
    log = log
    prepare_errors = (prepare.PrepareError, RuntimeError, OSError)
    unprepare_errors = (OSError, RuntimeError)

    def __init__(
        self,
        settings: Settings,
        open_nvml: Callable[[], nvml.Nvml],
        api: SliceApi,
        *,
        simulated: bool = False,
    ) -> None:
        super().__init__(settings)
        self.s = settings
        self.open_nvml = open_nvml
        self.api = api
        self.time_slicer = TimeSlicer(simulated=simulated)
        self.simulated = simulated
        # The MPS control daemons of prepared claims, by claim UID.
        self.mps_daemons: dict[str, mps_daemon.Daemon] = {}
        self.inventory: Inventory | None = None
        self.published: dict[str, slices.PublishedDevice] = {}
        self.unhealthy: set[str] = set()
        self.generation = 0
        self.publishes = 0
        self.handover = handover.Handover(blocked=None, withheld=frozenset(), reasons=())
        self._publish_lock = asyncio.Lock()
        self._monitor: monitor.HealthMonitor | None = None
        self._lib: nvml.Nvml | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()

    # ----- start and stop -----------------------------------------------------------------

    def _boot_id(self) -> str:
        try:
            return (self.s.proc_root / BOOT_ID).read_text().strip()
        except OSError:
            return ""

    def _read(self) -> Inventory:
        assert self._lib is not None
        return collect(
            self._lib,
            driver_root=self.s.driver_root_view,
            sys_root=self.s.sys_root,
            proc_root=self.s.proc_root,
        )

    async def start(self) -> None:
        if self.s.gates.get(gpuconfig.DYNAMIC_MIG_GATE):
            raise StartError(
                "feature gate DynamicMIG (MIG devices created on demand) is not implemented by "
                "this plugin: MIG devices are published as the MIG manager configured them"
            )
        self._loop = asyncio.get_running_loop()
        self._lib = self.open_nvml()
        self._lib.init()
        self.inventory = await asyncio.to_thread(self._read)
        self.published = slices.allocatable(self.inventory)
        self._open_checkpoint(self._boot_id())
        for uid, claim in self.checkpoint.claims.items():
            if claim.mps_uuids and claim.state == checkpoint.PREPARE_COMPLETED:
                await self._ensure_mps(uid, claim.mps_uuids, claim.mps_commands)
        await self.publish()
        self._start_monitor()
        await self._serve()

    def _start_monitor(self) -> None:
        assert self.inventory is not None
        devices = common.node_devices(self.inventory.node)
        self._monitor = monitor.HealthMonitor(
            self.open_nvml,
            devices,
            self.s.health_policy,
            self._on_health,
            recheck_interval=self.s.recheck_interval,
        )
        self._monitor.start()

    def _on_health(self, changes: list[monitor.HealthChange]) -> None:
        loop = self._loop
        if loop is None:
            return

        def apply() -> None:
            for c in changes:
                if c.healthy:
                    self.unhealthy.discard(c.uuid)
                else:
                    self.unhealthy.add(c.uuid)
                log.warning("device %s healthy=%s: %s", c.uuid, c.healthy, c.reason)
            self._wake.set()

        loop.call_soon_threadsafe(apply)

    async def stop(self) -> None:
        """Stop serving; the slices stay (the kubelet wipes them if the plugin stays away)."""
        if self._monitor is not None:
            self._monitor.stop()
        await self._stop_serving()
        if self.simulated:
            # A simulated daemon lives in this process; a real one outlives it (`nvidia-cuda-
            # mps-control -d`). Either way the next start ensures the daemons of prepared claims.
            for daemon in self.mps_daemons.values():
                if daemon.control is not None:
                    await daemon.control.stop()
            self.mps_daemons.clear()
        if self._lib is not None:
            with contextlib.suppress(nvml.NvmlError):
                self._lib.shutdown()
            self._lib = None

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Start, then republish on health and MIG-layout changes until `stop` is set."""
        stop = stop or asyncio.Event()
        await self.start()
        try:
            while not stop.is_set():
                waiters = [asyncio.ensure_future(e.wait()) for e in (stop, self._wake)]
                await asyncio.wait(
                    waiters, timeout=self.s.rescan_interval, return_when=asyncio.FIRST_COMPLETED
                )
                for w in waiters:
                    w.cancel()
                if stop.is_set():
                    break
                self._wake.clear()
                await self.rescan()
        finally:
            await self.stop()

    # ----- publishing ---------------------------------------------------------------------

    async def rescan(self) -> None:
        """Re-read the GPUs (a new MIG layout) and republish what changed."""
        try:
            inv = await asyncio.to_thread(self._read)
        except nvml.NvmlError as err:
            log.warning("cannot re-read the GPUs: %s", err)
            return
        self.inventory = inv
        self.published = slices.allocatable(inv)
        await self.publish()

    async def _handover(self, inv: Inventory) -> handover.Handover:
        """Read what the device plugin still serves or holds on the node and decide."""
        if not self.s.handover_check:
            return handover.Handover(blocked=None, withheld=frozenset(), reasons=())
        allocatable = await self.api.node_allocatable()
        held: list[handover.Held] = []
        if not handover.device_plugin_resources(allocatable) and (
            self.s.pod_resources_socket.exists()
        ):
            client = podresources.Client(str(self.s.pod_resources_socket))
            try:
                held = [
                    handover.Held(a.resource, a.device_id, f"{a.namespace}/{a.pod}")
                    for a in await client.list()
                ]
            except (grpc.aio.AioRpcError, OSError, TimeoutError) as err:
                return handover.Handover(
                    blocked=(
                        f"publishing no devices: cannot list the kubelet's pod resources at "
                        f"{self.s.pod_resources_socket} ({err}) to leave out GPUs a device "
                        "plugin's pod still holds"
                    ),
                    withheld=frozenset(),
                    reasons=(),
                )
            finally:
                await client.close()
        return handover.decide(self.s.node_name, allocatable, held, inv)

    async def publish(self) -> None:
        assert self.inventory is not None
        async with self._publish_lock:
            decision = await self._handover(self.inventory)
            if decision.summary != self.handover.summary:
                if decision.summary is not None:
                    log.warning("%s", decision.summary)
                else:
                    log.info("the device plugin serves and holds nothing here: publishing all")
            self.handover = decision
            if decision.blocked is not None:
                devices: list[dict[str, Any]] = []
            else:
                devices = slices.devices(self.inventory, self.unhealthy | decision.withheld)
            current = await self.api.published()
            generation, wanted = slices.plan(self.s.node_name, current, devices, self.generation)
            if generation != self.generation or not current:
                await self.api.sync(wanted)
                self.publishes += 1
                log.info(
                    "published %d devices (pool %s generation %d)",
                    len(devices),
                    self.s.node_name,
                    generation,
                )
            self.generation = generation

    # ----- the DRA service ----------------------------------------------------------------

    async def _prepare(self, uid: str, namespace: str, name: str) -> tuple[checkpoint.Device, ...]:
        done = self.checkpoint.claims.get(uid)
        if done is not None and done.state == checkpoint.PREPARE_COMPLETED:
            if done.mps_uuids:
                await self._ensure_mps(uid, done.mps_uuids, done.mps_commands)
            return done.devices  # idempotent: the kubelet asks again after its restart
        claim = await self.api.claim(namespace, name)
        if claim is None:
            raise prepare.PrepareError(f"ResourceClaim {namespace}/{name} not found")
        if (claim.get("metadata") or {}).get("uid") != uid:
            raise prepare.PrepareError(
                f"ResourceClaim {namespace}/{name} has UID "
                f"{(claim.get('metadata') or {}).get('uid')}, the kubelet asked for {uid}"
            )
        assert self.inventory is not None
        dev_root = Path(self.s.dev_root_view)
        plan = prepare.plan(
            claim,
            self.published,
            self.inventory,
            self.s.gates,
            dev_root=self.s.dev_root,
            driver_root=self.s.driver_root,
            present_control_nodes=common.present(dev_root, common.CONTROL_DEVICE_NODES),
            driver_files=common.find_driver_files(self.s.driver_root_view),
            mps_root=self.s.mps_root,
        )
        record = checkpoint.Claim(
            state=checkpoint.PREPARE_STARTED,
            name=name,
            namespace=namespace,
            devices=tuple(
                checkpoint.Device(d.request, d.pool, d.device, d.uuid, d.cdi_ids)
                for d in plan.devices
            ),
            time_sliced=tuple(a.uuid for a in plan.sharing),
            mps_uuids=plan.mps.uuids if plan.mps else (),
            mps_commands=plan.mps.commands if plan.mps else (),
        )
        self._record(uid, record)
        for action in plan.sharing:
            await self.time_slicer.apply(action.uuid, action.sharing.interval)
        if plan.mps is not None:
            await self._ensure_mps(uid, plan.mps.uuids, plan.mps.commands)
        common.write_spec(self.s.cdi_root / prepare.spec_file_name(uid), plan.spec)
        self._record(uid, replace(record, state=checkpoint.PREPARE_COMPLETED))
        log.info("prepared %s/%s: %s", namespace, name, [d.device for d in plan.devices])
        return record.devices

    # ----- MPS control daemons (one per MPS-shared claim) ------------------------------------

    def _daemon(
        self, uid: str, uuids: tuple[str, ...], commands: tuple[str, ...]
    ) -> mps_daemon.Daemon:
        return mps_daemon.Daemon(
            name=uid,
            uuids=list(uuids),
            commands=list(commands),
            root=self.s.mps_root_view,
            simulated=self.simulated,
        )

    async def _ensure_mps(
        self, uid: str, uuids: tuple[str, ...], commands: tuple[str, ...]
    ) -> None:
        """Start the claim's control daemon unless it runs and answers (after a restart of
        this plugin a real daemon still runs; a simulated one is started again)."""
        root = self.s.mps_root_view
        if uid in self.mps_daemons:
            with contextlib.suppress(mps.ControlError):
                await mps.ask(root, uid, mps.HEALTH_COMMAND)
                return
        daemon = self._daemon(uid, uuids, commands)
        if not self.simulated:
            with contextlib.suppress(mps.ControlError):
                await mps.ask(root, uid, mps.HEALTH_COMMAND)
                self.mps_daemons[uid] = daemon  # a daemon from before this plugin's restart
                return
        await mps_daemon.mount_shm(root / uid, simulated=self.simulated)
        try:
            await daemon.start()
        except mps_daemon.DaemonError as err:
            raise RuntimeError(
                f"MPS control daemon {prepare.mps_daemon_name(uid)}: {err}"
            ) from None
        self.mps_daemons[uid] = daemon
        log.info("MPS control daemon %s runs on %s", prepare.mps_daemon_name(uid), list(uuids))

    async def _stop_mps(self, uid: str, record: checkpoint.Claim) -> None:
        daemon = self.mps_daemons.pop(uid, None) or self._daemon(
            uid, record.mps_uuids, record.mps_commands
        )
        await daemon.stop()
        root = self.s.mps_root_view / uid
        await mps_daemon.unmount_shm(mps.shm_dir(root), simulated=self.simulated)
        shutil.rmtree(root, ignore_errors=True)
        log.info("stopped MPS control daemon %s", prepare.mps_daemon_name(uid))

    async def _unprepare(self, uid: str) -> None:
        record = self.checkpoint.claims.get(uid)
        (self.s.cdi_root / prepare.spec_file_name(uid)).unlink(missing_ok=True)
        if record is not None:
            others = {
                u for k, c in self.checkpoint.claims.items() if k != uid for u in c.time_sliced
            }
            for gpu in record.time_sliced:
                if gpu not in others:
                    await self.time_slicer.reset(gpu)
            if record.mps_uuids or uid in self.mps_daemons:
                await self._stop_mps(uid, record)
            self._record(uid, None)
            log.info("unprepared %s/%s", record.namespace, record.name)
