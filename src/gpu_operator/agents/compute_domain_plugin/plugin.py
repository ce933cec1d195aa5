"""The compute-domain kubelet plugin's I/O: NVML (the clique), the kubelet's sockets, the API
server (slices, claims, domains, the node label), the checkpoint and CDI files."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from gpu_operator import nvml
from gpu_operator.agents import cdi as common
from gpu_operator.agents.compute_domain_plugin import devices
from gpu_operator.agents.dra import serving
from gpu_operator.agents.dra.serving import StartError as StartError
from gpu_operator.agents.dra_kubelet_plugin import checkpoint
from gpu_operator.api import computedomain as cdapi
from gpu_operator.kube.computedomains import ComputeDomainApi
from gpu_operator.kube.resource_slices import SliceApi

log = logging.getLogger("gpu_operator.agents.compute_domain_plugin")

DOMAINS_DIR = "domains"
CRASH_GATE = "CrashOnNVLinkFabricErrors"


@dataclass
class Settings(serving.KubeletPluginSettings):
    driver: ClassVar[str] = devices.DRIVER
    dev_root: str = "/"
    proc_root: Path = Path("/")
    crash_on_fabric_errors: bool = False

    def domain_dir(self, uid: str) -> tuple[Path, str]:
        """The domain's IMEX config directory: as this process sees it, and as the node path."""
        view = self.plugin_dir / DOMAINS_DIR / uid
        node = f"{self.kubelet_root.rstrip('/')}/plugins/{devices.DRIVER}/{DOMAINS_DIR}/{uid}"
        return view, node


def read_fabric(lib: nvml.Nvml) -> list[Any]:
    infos: list[Any] = []
    for index in range(lib.device_count()):
        try:
            infos.append(lib.device_by_index(index).fabric_info())
        except nvml.NvmlError:
            infos.append(None)  # not supported by this GPU or driver
    return infos


class Plugin(serving.KubeletPlugin):
    log = log
    prepare_errors = (devices.PrepareError,)
    prepare_error_level = logging.INFO
    unprepare_errors = (Exception,)

    def __init__(
        self,
        settings: Settings,
        open_nvml: Callable[[], nvml.Nvml],
        slices: SliceApi,
        domains: ComputeDomainApi,
    ) -> None:
        super().__init__(settings)
        self.s = settings
        self.open_nvml = open_nvml
        self.slices = slices
        self.domains = domains
        self.clique = ""
        self.generation = 0

    def _major(self) -> int | None:
        try:
            text = (self.s.proc_root / "proc/devices").read_text()
        except OSError:
            return None
        return devices.channel_major(text)

    async def start(self) -> None:
        lib = self.open_nvml()
        lib.init()
        try:
            fabric = await asyncio.to_thread(read_fabric, lib)
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()
        self.clique, problems = devices.clique(fabric)
        for problem in problems:
            log.warning("node %s: %s", self.s.node_name, problem)
        if problems and self.s.crash_on_fabric_errors:
            raise StartError(f"{CRASH_GATE}: node {self.s.node_name}: " + "; ".join(problems))
        log.info("node %s: clique %r", self.s.node_name, self.clique or "none")
        self._open_checkpoint("")
        current = await self.slices.published()
        generations = [
            int((s.get("spec") or {}).get("pool", {}).get("generation") or 0) for s in current
        ]
        wanted = devices.slices(self.s.node_name, self.clique, max([0, *generations]) + 1)
        same = (
            len(current) == 1
            and (current[0].get("spec") or {}).get("devices") == (wanted[0]["spec"]["devices"])
        )
        if not same:
            await self.slices.sync(wanted)
        await self._serve()

    async def stop(self) -> None:
        await self._stop_serving()

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # ----- the DRA service ----------------------------------------------------------------

    async def _prepare(self, uid: str, ns: str, name: str) -> tuple[checkpoint.Device, ...]:
        done = self.checkpoint.claims.get(uid)
        if done is not None and done.state == checkpoint.PREPARE_COMPLETED:
            return done.devices
        claim = await self.domains.claim(ns, name)
        if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
            raise devices.PrepareError(f"ResourceClaim {ns}/{name} (UID {uid}) not found")
        prepared: list[checkpoint.Device] = []
        specs: list[tuple[str, dict[str, Any]]] = []
        for req in devices.requests(claim):
            if req.device not in (devices.channel_name(0), devices.DAEMON_DEVICE):
                raise devices.PrepareError(
                    f"ResourceClaim {ns}/{name}: device {req.device} is not one of this node's"
                )
            domain = await self.domains.domain_by_uid(req.domain)
            if domain is None:
                raise devices.PrepareError(
                    f"ResourceClaim {ns}/{name}: ComputeDomain with UID {req.domain} not found"
                )
            dmeta = domain["metadata"]
            ref = f"ComputeDomain {dmeta['namespace']}/{dmeta['name']}"
            major = self._major()
            if req.kind == cdapi.CHANNEL_CONFIG_KIND:
                if dmeta["namespace"] != ns:
                    raise devices.PrepareError(
                        f"ResourceClaim {ns}/{name} is in another namespace than {ref}"
                    )
                other = await self.domains.set_node_label(
                    self.s.node_name, req.domain, present=True
                )
                if other is not None:
                    raise devices.PrepareError(
                        f"node {self.s.node_name} already serves ComputeDomain UID {other}: one "
                        "compute domain per node"
                    )
                if not devices.node_ready(domain, self.s.node_name):
                    raise devices.PrepareError(
                        f"{ref}: waiting for the IMEX daemon on node {self.s.node_name} to be ready"
                    )
                if major is None:
                    raise devices.PrepareError(
                        f"node {self.s.node_name}: no {devices.PROC_DEVICES_NAME} line in "
                        "/proc/devices: the driver offers no IMEX channels"
                    )
                spec = devices.channel_spec(uid, req, major, self.s.dev_root)
            else:
                view, node_path = self.s.domain_dir(req.domain)
                view.mkdir(parents=True, exist_ok=True)
                spec = devices.daemon_spec(
                    uid, req, domain, self.clique, node_path, major, self.s.dev_root
                )
            specs.append((req.device, spec))
            prepared.append(
                checkpoint.Device(
                    req.request.split("/", 1)[0],
                    req.pool,
                    req.device,
                    req.domain,
                    (devices.cdi_id(uid, req.device),),
                )
            )
        record = checkpoint.Claim(checkpoint.PREPARE_STARTED, name, ns, tuple(prepared))
        self._record(uid, record)
        merged = {
            "cdiVersion": common.CDI_VERSION,
            "kind": devices.CDI_KIND,
            "devices": [d for _, s in specs for d in s["devices"]],
        }
        common.write_spec(self.s.cdi_root / devices.spec_file_name(uid), merged)
        self._record(uid, replace(record, state=checkpoint.PREPARE_COMPLETED))
        log.info("prepared %s/%s: %s", ns, name, [d.device for d in prepared])
        return record.devices

    async def _unprepare(self, uid: str) -> None:
        record = self.checkpoint.claims.get(uid)
        (self.s.cdi_root / devices.spec_file_name(uid)).unlink(missing_ok=True)
        if record is None:
            return
        for dev in record.devices:
            domain = dev.uuid  # the domain UID is kept where the GPU plugin keeps a GPU UUID
            if dev.device == devices.DAEMON_DEVICE:
                view, _ = self.s.domain_dir(domain)
                shutil.rmtree(view, ignore_errors=True)
                continue
            still = any(
                k != uid and d.uuid == domain and d.device != devices.DAEMON_DEVICE
                for k, c in self.checkpoint.claims.items()
                for d in c.devices
            )
            if not still:
                await self.domains.set_node_label(self.s.node_name, domain, present=False)
        self._record(uid, None)
        log.info("unprepared %s/%s", record.namespace, record.name)
