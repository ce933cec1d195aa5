"""Running one validation: remove the marker, check, write the marker; every wait bounded.

A failure raises `ValidationFailed` inside and comes out of `Validator.run` as exit code 1, an
ERROR log line (the last one) and the container's termination message, so `kubectl describe`,
the pod status and the operator's status all quote the same first failing link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.agents.validator import components, workload
from gpu_operator.agents.validator.components import ValidationFailed
from gpu_operator.agents.validator.protocols import Cluster, Container, Obj, ProgramResult
from gpu_operator.operands import readiness

log = logging.getLogger("gpu_operator.agents.validator")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEVICE_PLUGIN_APP = "nvidia-device-plugin-daemonset"
# Components whose marker carries nothing, so it may be written without a check (upstream).
SKIPPABLE = ("toolkit", "cuda", "plugin")
DEV_CHAR_CTR_PATH = "/host-dev-char"
DEV_CHAR_HINT = (
    "creating the /dev/char symlinks for the NVIDIA devices failed; they work around containerd "
    "with systemd cgroups losing GPU access (NVIDIA/gpu-operator#430). To skip them, set "
    "validator.driver.env DISABLE_DEV_CHAR_SYMLINK_CREATION=true in the ClusterPolicy"
)


@dataclass(frozen=True)
class Settings:
    """One validation run (upstream's flags and env, plus the bounds of every wait)."""

    component: str
    node_name: str = ""
    namespace: str = ""
    with_wait: bool = False
    with_workload: bool = True
    output_dir: str = components.VALIDATIONS_DIR
    cleanup_all: bool = False
    mig_strategy: str = "single"
    host_root: str = "/"
    driver_install_dir: str = "/run/nvidia/driver"
    driver_install_dir_ctr_path: str = "/run/nvidia/driver"
    disable_dev_char_symlinks: bool = False
    skip_gpu_init: bool = False
    skip_validation: bool = False  # toolkit, cuda, plugin: write the marker without checking
    gpu_direct_rdma: bool = False
    use_host_mofed: bool = False
    workload: workload.WorkloadSpec = field(default_factory=lambda: workload.WorkloadSpec(""))
    # WITH_WAIT retries `sleep_interval` apart (upstream retries forever: bounded here).
    sleep_interval: float = 5.0
    wait_retries: int = 60
    # Upstream's counts: a workload pod gets 60 x 5 s, GPU resources 30 x 5 s.
    pod_retries: int = 60
    pod_interval: float = 5.0
    resource_retries: int = 30
    resource_interval: float = 5.0

    def waited(self, retries: int, interval: float) -> str:
        return f"{retries * interval:g} s"


@dataclass
class _Poll:
    """What one check of a wait saw."""

    ok: bool
    detail: str


class Validator:
    """Validates `settings.component` in `container`, using `cluster` for the API."""

    def __init__(
        self,
        settings: Settings,
        container: Container,
        cluster: Cluster | None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.container = container
        self.cluster = cluster
        self.stop = stop or asyncio.Event()
        self.component = settings.component
        # WSL2 has no /dev/char symlinks to make.
        self._wsl = False

    # ----- entry point ------------------------------------------------------------------------

    async def run(self) -> int:
        """Validate; 0 when the marker is written, 1 on a failure, 2 on bad settings."""
        problem = self._usage_problem()
        if problem is not None:
            return self._fail(problem, EXIT_USAGE)
        where = f" on node {self.settings.node_name}" if self.settings.node_name else ""
        log.info("%s: validating%s", self.component, where)
        try:
            self._prepare_output_dir()
            await self._validate(self.component)
        except ValidationFailed as failure:
            return self._fail(str(failure), EXIT_FAILED)
        except OSError as err:
            return self._fail(f"{self.component}: {err}", EXIT_FAILED)
        except Exception as err:  # an API call that failed: still one line, and the message
            log.debug("%s: unexpected error", self.component, exc_info=True)
            return self._fail(f"{self.component}: {type(err).__name__}: {err}", EXIT_FAILED)
        log.info("%s: validation successful", self.component)
        return EXIT_OK

    def _usage_problem(self) -> str | None:
        s = self.settings
        if s.component not in components.COMPONENTS:
            return f"validator: {components.unknown_component(s.component)}"
        needs_namespace = s.component in ("cuda", "plugin")
        if needs_namespace and not s.namespace:
            return f"{s.component}: OPERATOR_NAMESPACE (--namespace) is required"
        if s.component in ("plugin", "mofed") and not s.node_name:
            return f"{s.component}: NODE_NAME (--node-name) is required"
        if s.component in ("cuda", "plugin") and s.with_workload and not s.workload.image:
            return f"{s.component}: VALIDATOR_IMAGE is required for the workload pod"
        if s.component in ("cuda", "plugin", "mofed") and self.cluster is None:
            return f"{s.component}: this validation needs the Kubernetes API"
        return None

    def _fail(self, text: str, code: int) -> int:
        with contextlib.suppress(OSError):
            self.container.write_termination_message(text + "\n")
        log.error("%s", text)
        return code

    async def _validate(self, component: str) -> None:
        if self.settings.skip_validation:
            if component not in SKIPPABLE:
                raise ValidationFailed(
                    component, "SKIP_VALIDATION is only for " + ", ".join(SKIPPABLE)
                )
            log.warning(
                "%s: SKIP_VALIDATION is set: writing the marker without checking", component
            )
            self._clear(component)
            self._write(component)
            return
        checks: dict[str, Callable[[], Awaitable[None]]] = {
            "driver": self._driver,
            "toolkit": self._toolkit,
            "cuda": self._cuda,
            "plugin": self._plugin,
            "mofed": self._mofed,
        }
        check = checks.get(component)
        if check is not None:
            await check()
        else:
            await self._module(component)

    # ----- markers ----------------------------------------------------------------------------

    def _validations(self) -> Path:
        return self.container.path(self.settings.output_dir)

    def _prepare_output_dir(self) -> None:
        directory = self._validations()
        if self.settings.cleanup_all and directory.is_dir():
            for entry in directory.iterdir():
                if entry.is_file() or entry.is_symlink():
                    entry.unlink(missing_ok=True)
        directory.mkdir(parents=True, exist_ok=True)

    def _clear(self, component: str) -> None:
        (self._validations() / components.marker(component)).unlink(missing_ok=True)

    def _write(self, component: str, text: str = "") -> None:
        target = self._validations() / components.marker(component)
        partial = target.with_name(f".{target.name}.tmp")
        partial.write_text(text)
        partial.replace(target)  # readers never see a half-written marker
        log.info("%s: wrote %s", component, posixpath.join(self.settings.output_dir, target.name))

    # ----- waiting ----------------------------------------------------------------------------

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _wait(
        self,
        component: str,
        what: str,
        check: Callable[[], Awaitable[_Poll]],
        *,
        retries: int,
        interval: float,
        wait: bool = True,
    ) -> _Poll:
        """Check until it passes: once without `wait`, else up to `retries` times, `interval`
        apart. Each new state is logged once; a stop request ends the wait as a failure."""
        logged = ""
        attempts = max(retries, 1) if wait else 1
        poll = _Poll(False, "")
        for attempt in range(attempts):
            poll = await check()
            if poll.ok:
                return poll
            if poll.detail != logged:
                log.info("%s: waiting for %s: %s", component, what, poll.detail)
                logged = poll.detail
            if attempt + 1 < attempts:
                await self._sleep(interval)
                if self.stop.is_set():
                    raise ValidationFailed(
                        component, f"stopped while waiting for {what}: {poll.detail}"
                    )
        return poll

    def _echo(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines():
            log.info("%s", line)

    # ----- files and programs -----------------------------------------------------------------

    def _file(self, container_path: str) -> Path | None:
        """The path if the container has that file (None otherwise)."""
        try:
            path = self.container.path(container_path)
            return path if path.is_file() else None
        except OSError:
            return None

    def _read(self, container_path: str) -> str | None:
        path = self._file(container_path)
        if path is None:
            return None
        try:
            return path.read_text()
        except OSError:
            return None

    def _executable(self, container_path: str) -> bool:
        path = self._file(container_path)
        if path is None:
            return False
        info = path.stat()
        return stat.S_ISREG(info.st_mode) and info.st_size > 0 and bool(info.st_mode & 0o111)

    def _find(self, root: str, name: str, directories: Sequence[str]) -> str | None:
        for directory in directories:
            candidate = posixpath.normpath(posixpath.join(root, directory.lstrip("/"), name))
            if self._file(candidate) is not None:
                return candidate
        return None

    async def _run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ProgramResult:
        return await self.container.run(list(argv), env)

    def _smi_args(self) -> list[str]:
        # Without GPU initialisation (GPUs bound to vfio-pci), only the version is asked for.
        return ["--version"] if self.settings.skip_gpu_init else []

    # ----- driver -----------------------------------------------------------------------------

    async def _driver(self) -> None:
        s = self.settings
        self._clear("driver")
        info = await self._host_driver()
        if info is None:
            managed = await self._driver_managed()
            if managed:
                await self._driver_container_ready()
            else:
                log.info(
                    "driver: no driver DaemonSet of the operator; checking %s only",
                    s.driver_install_dir_ctr_path,
                )
            await self._driver_root_smi()
            if managed:
                await self._driver_extras()
            dev = posixpath.join(s.driver_install_dir_ctr_path, "dev")
            try:
                dev_in_root = self.container.path(dev).is_dir()
            except OSError:
                dev_in_root = False
            info = components.driver_info(
                is_host_driver=False,
                host_root=s.host_root,
                install_dir=s.driver_install_dir,
                dev_in_driver_root=dev_in_root,
            )
        self._dev_char_symlinks(info)
        self._write("driver", components.driver_ready_text(info))
        kind = "the host's driver" if info.is_host_driver else "the driver container's driver"
        log.info("driver: ready: %s (NVIDIA_DRIVER_ROOT=%s)", kind, info.driver_root)

    async def _host_driver(self) -> components.DriverInfo | None:
        s = self.settings
        host = components.HOST_ROOT_CTR_PATH
        wsl = self._file(posixpath.join(host, components.WSL_NVIDIA_SMI.lstrip("/")))
        if wsl is not None and wsl.stat().st_size > 0:
            log.info(
                "driver: WSL2 detected (%s): the driver is the host's", components.WSL_NVIDIA_SMI
            )
            self._wsl = True
            return components.driver_info(
                is_host_driver=True, host_root=s.host_root, install_dir="", dev_in_driver_root=False
            )
        found = next(
            (
                p
                for p in components.HOST_NVIDIA_SMI_PATHS
                if self._executable(posixpath.join(host, p.lstrip("/")))
            ),
            None,
        )
        if found is None:
            log.info(
                "driver: no driver on the host (no executable nvidia-smi in its %s)",
                ", ".join(posixpath.dirname(p) for p in components.HOST_NVIDIA_SMI_PATHS),
            )
            return None
        result = await self._run(["chroot", host, found, *self._smi_args()])
        if result.code != 0:
            log.info(
                "driver: the host's %s failed (exit code %d: %s); looking for a driver container",
                found,
                result.code,
                components.output_tail(result.output),
            )
            return None
        self._echo(result.stdout)
        log.info("driver: the host has a driver (%s works)", found)
        return components.driver_info(
            is_host_driver=True, host_root=s.host_root, install_dir="", dev_in_driver_root=False
        )

    async def _driver_managed(self) -> bool:
        s = self.settings
        if self.cluster is None or not s.namespace:
            # Without the API the driver container's own marker is still the best evidence.
            return True
        selector = {components.DRIVER_COMPONENT_LABEL: components.DRIVER_COMPONENT}
        try:
            daemonsets = await self.cluster.daemonsets(s.namespace, selector)
        except Exception as err:  # any API failure: say which call and why
            raise ValidationFailed(
                "driver", f"cannot list the driver DaemonSets in {s.namespace}: {err}"
            ) from err
        return any(components.owned_by_operator(ds) for ds in daemonsets)

    async def _driver_container_ready(self) -> None:
        s = self.settings
        ready = posixpath.join(s.output_dir, components.DRIVER_CTR_READY)

        async def check() -> _Poll:
            present = self._file(ready) is not None
            return _Poll(present, "" if present else f"{ready} is not there yet")

        poll = await self._wait(
            "driver",
            "the driver container",
            check,
            retries=s.wait_retries,
            interval=s.sleep_interval,
            wait=s.with_wait,
        )
        if poll.ok:
            log.info("driver: the driver container is ready (%s)", ready)
            return
        waited = f" after {s.waited(s.wait_retries, s.sleep_interval)}" if s.with_wait else ""
        evidence = await self._pod_evidence(
            {components.DRIVER_COMPONENT_LABEL: components.DRIVER_COMPONENT}, "driver"
        )
        raise ValidationFailed(
            "driver",
            f"{ready} not present{waited}: the driver container on this node is not ready "
            f"({evidence})",
        )

    async def _pod_evidence(self, labels: Mapping[str, str], what: str) -> str:
        """What the operand pod on this node is doing, for a failure message."""
        s = self.settings
        if self.cluster is None:
            return f"no Kubernetes API to look at the {what} pod"
        if not s.namespace or not s.node_name:
            return f"without NODE_NAME and OPERATOR_NAMESPACE the {what} pod is not looked up"
        try:
            pods = await self.cluster.pods(s.namespace, labels, s.node_name)
        except Exception as err:  # evidence is best effort; the failure stands either way
            return f"the {what} pods could not be listed: {err}"
        if not pods:
            return f"no {what} pod runs on node {s.node_name}"
        pod = pods[0]
        name = (pod.get("metadata") or {}).get("name", "?")
        problem = readiness.pod_problem(pod)
        if problem is None:
            return f"pod {name} is running and ready"
        return f"pod {name}: {problem[1]}"

    async def _driver_root_smi(self) -> None:
        s = self.settings
        root = s.driver_install_dir_ctr_path
        last: list[ProgramResult] = []

        async def check() -> _Poll:
            smi = self._find(root, "nvidia-smi", components.DRIVER_ROOT_BIN_DIRS)
            if smi is None:
                dirs = ", ".join(components.DRIVER_ROOT_BIN_DIRS[1:])
                return _Poll(False, f"no nvidia-smi in the driver root {root} ({dirs})")
            library = self._find(root, components.NVML_LIBRARY, components.DRIVER_ROOT_LIB_DIRS)
            if library is None:
                return _Poll(False, f"no {components.NVML_LIBRARY} in the driver root {root}")
            result = await self._run([smi, *self._smi_args()], {"LD_PRELOAD": library})
            last[:] = [result]
            if result.code != 0:
                tail = components.output_tail(result.output)
                return _Poll(False, f"{smi} failed (exit code {result.code}): {tail}")
            return _Poll(True, smi)

        log.info("driver: validating the driver installed in %s", root)
        poll = await self._wait(
            "driver",
            "the driver container's nvidia-smi",
            check,
            retries=s.wait_retries,
            interval=s.sleep_interval,
            wait=s.with_wait,
        )
        if not poll.ok:
            raise ValidationFailed("driver", poll.detail)
        if last:
            self._echo(last[0].stdout)

    async def _driver_extras(self) -> None:
        text = self._read(posixpath.join(self.settings.output_dir, components.DRIVER_CTR_READY))
        for component in components.driver_features(text or ""):
            log.info("driver: the driver container installed %s; validating it", component)
            await self._module(component)

    def _dev_char_symlinks(self, info: components.DriverInfo) -> None:
        s = self.settings
        if s.disable_dev_char_symlinks or self._wsl:
            log.info("driver: not creating /dev/char symlinks (disabled)")
            return
        if info.is_host_driver or info.dev_root_ctr_path == components.HOST_ROOT_CTR_PATH:
            dev = posixpath.join(components.HOST_ROOT_CTR_PATH, "dev")
        else:
            dev = posixpath.join(s.driver_install_dir_ctr_path, "dev")
        try:
            made = _link_char_devices(
                self.container.path(dev), self.container.path(DEV_CHAR_CTR_PATH)
            )
        except OSError as err:
            raise ValidationFailed("driver", f"{err}: {DEV_CHAR_HINT}") from err
        if made:
            log.info("driver: %d /dev/char symlinks to the NVIDIA devices in %s", made, dev)
        else:
            log.info("driver: no NVIDIA character devices in %s: no /dev/char symlinks", dev)

    # ----- driver modules, toolkit, mofed ------------------------------------------------------

    async def _module(self, component: str) -> None:
        s = self.settings
        module = components.MODULES[component]
        self._clear(component)

        async def check() -> _Poll:
            text = self._read("/proc/modules")
            if text is None:
                return _Poll(False, "/proc/modules cannot be read")
            if module in components.loaded_modules(text):
                return _Poll(True, module)
            return _Poll(False, f"kernel module {module} is not loaded")

        poll = await self._wait(
            component,
            f"kernel module {module}",
            check,
            retries=s.wait_retries,
            interval=s.sleep_interval,
            wait=s.with_wait,
        )
        if not poll.ok:
            raise ValidationFailed(component, poll.detail)
        log.info("%s: kernel module %s is loaded", component, module)
        self._write(component)

    async def _toolkit(self) -> None:
        s = self.settings
        self._clear("toolkit")
        last: list[ProgramResult] = []

        async def check() -> _Poll:
            result = await self._run(["nvidia-smi"])
            last[:] = [result]
            if result.code == 0:
                return _Poll(True, "")
            if result.code == 127:
                missing = components.output_tail(result.output)
                return _Poll(
                    False,
                    f"nvidia-smi is not in this container ({missing}): the container runtime "
                    "injected no driver (is the runtime class configured on this node?)",
                )
            tail = components.output_tail(result.output)
            return _Poll(
                False, f"nvidia-smi failed in this container (exit code {result.code}): {tail}"
            )

        log.info("toolkit: running nvidia-smi in this container")
        poll = await self._wait(
            "toolkit",
            "nvidia-smi",
            check,
            retries=s.wait_retries,
            interval=s.sleep_interval,
            wait=s.with_wait,
        )
        if not poll.ok:
            raise ValidationFailed("toolkit", poll.detail)
        self._echo(last[0].stdout)
        self._write("toolkit")

    async def _mofed(self) -> None:
        s = self.settings
        if not s.gpu_direct_rdma:
            log.info("mofed: GPUDirect RDMA is disabled; nothing to validate")
            return
        assert self.cluster is not None  # _usage_problem checked
        node = await self.cluster.node(s.node_name) or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        if labels.get(components.MELLANOX_LABEL) != "true":
            log.info(
                "mofed: no Mellanox device on this node (%s); nothing to validate",
                components.MELLANOX_LABEL,
            )
            return
        self._clear("mofed")

        async def check() -> _Poll:
            if s.use_host_mofed:
                text = self._read("/proc/modules") or ""
                loaded = components.MOFED_MODULE in components.loaded_modules(text)
                return _Poll(loaded, f"kernel module {components.MOFED_MODULE} is not loaded")
            ready = self._file(components.MOFED_DRIVER_READY) is not None
            return _Poll(ready, f"{components.MOFED_DRIVER_READY} is not there yet")

        poll = await self._wait(
            "mofed",
            "the MOFED driver",
            check,
            retries=s.wait_retries,
            interval=s.sleep_interval,
            wait=s.with_wait,
        )
        if not poll.ok:
            raise ValidationFailed("mofed", poll.detail)
        self._write("mofed")

    # ----- workloads --------------------------------------------------------------------------

    async def _cuda(self) -> None:
        s = self.settings
        self._clear("cuda")
        if s.with_workload:
            assert self.cluster is not None

            def build(ds: Obj | None) -> Obj:
                return workload.cuda_pod(s.workload, s.namespace, s.node_name, ds)

            await self._workload("cuda", workload.CUDA_APP, workload.CUDA_INIT, build)
        else:
            log.info("cuda: workload validation disabled (WITH_WORKLOAD=false)")
        self._write("cuda")

    async def _plugin(self) -> None:
        s = self.settings
        self._clear("plugin")
        assert self.cluster is not None
        cluster = self.cluster
        seen: list[Obj] = []

        async def check() -> _Poll:
            node = await cluster.node(s.node_name)
            if node is None:
                return _Poll(False, f"node {s.node_name} not found")
            seen[:] = [node]
            count = components.gpu_count((node.get("status") or {}).get("capacity") or {})
            if count >= 1:
                return _Poll(True, f"{count} GPU devices")
            return _Poll(
                False, f"node {s.node_name} has no nvidia.com/gpu or nvidia.com/mig-* capacity"
            )

        poll = await self._wait(
            "plugin",
            "the device plugin's GPUs",
            check,
            retries=s.resource_retries,
            interval=s.resource_interval,
        )
        if not poll.ok:
            evidence = await self._pod_evidence({"app": DEVICE_PLUGIN_APP}, "device plugin")
            raise ValidationFailed(
                "plugin",
                f"{poll.detail} after {s.waited(s.resource_retries, s.resource_interval)}: the "
                f"device plugin has not registered the GPUs ({evidence})",
            )
        log.info("plugin: node %s advertises %s", s.node_name, poll.detail)
        if s.with_workload:
            allocatable = (seen[0].get("status") or {}).get("allocatable") or {}
            resource = components.workload_resource(allocatable)
            if resource is None:
                raise ValidationFailed(
                    "plugin", f"node {s.node_name} has no allocatable GPU resource"
                )

            def build(ds: Obj | None) -> Obj:
                return workload.plugin_pod(s.workload, s.namespace, s.node_name, resource, ds)

            await self._workload("plugin", workload.PLUGIN_APP, workload.PLUGIN_INIT, build)
        self._write("plugin")

    async def _workload(
        self, component: str, app: str, init: str, build: Callable[[Obj | None], Obj]
    ) -> None:
        """Replace the previous workload pod of this node, then wait for the new one."""
        s = self.settings
        cluster = self.cluster
        assert cluster is not None
        ds = await cluster.daemonset(s.namespace, workload.VALIDATOR_DS)
        if ds is None:
            log.warning(
                "%s: DaemonSet %s/%s not found; the workload pod gets no owner",
                component,
                s.namespace,
                workload.VALIDATOR_DS,
            )
        for old in await cluster.pods(s.namespace, {"app": app}, s.node_name):
            name = old["metadata"]["name"]
            log.info("%s: deleting the previous workload pod %s", component, name)
            await cluster.delete_pod(s.namespace, name)
        created = await cluster.create_pod(build(ds))
        name = created["metadata"]["name"]
        log.info("%s: created workload pod %s on node %s", component, name, s.node_name)
        verdicts: list[workload.Verdict] = []

        async def check() -> _Poll:
            pod = await cluster.pod(s.namespace, name)
            if pod is None:
                verdict = workload.Verdict("failed", "the pod was deleted before it finished")
            else:
                verdict = workload.pod_verdict(pod, await cluster.events(s.namespace, name))
            verdicts[:] = [verdict]
            return _Poll(verdict.done, verdict.detail)

        poll = await self._wait(
            component, f"pod {name}", check, retries=s.pod_retries, interval=s.pod_interval
        )
        verdict = verdicts[-1] if verdicts else workload.Verdict("running", poll.detail)
        if verdict.state == "failed":
            raise ValidationFailed(component, f"pod {name} failed: {verdict.detail}")
        if verdict.state != "succeeded":
            waited = s.waited(s.pod_retries, s.pod_interval)
            raise ValidationFailed(
                component, f"pod {name} did not succeed within {waited}: {verdict.detail}"
            )
        output = components.workload_result(await cluster.pod_log(s.namespace, name, init))
        log.info(
            "%s: pod %s succeeded%s", component, name, f" ({init}: {output})" if output else ""
        )


def _link_char_devices(dev: Path, dev_char: Path) -> int:
    """Link `<dev_char>/<major>:<minor>` to each NVIDIA character device under `dev`, as
    `nvidia-ctk system create-dev-char-symlinks` does; returns how many links exist."""
    if not dev.is_dir():
        return 0
    devices = [p for p in sorted(dev.glob("nvidia*")) if not p.is_dir()]
    caps = dev / "nvidia-caps"
    if caps.is_dir():
        devices += sorted(caps.iterdir())
    made = 0
    for device in devices:
        info = device.stat()
        if not stat.S_ISCHR(info.st_mode):
            continue
        dev_char.mkdir(parents=True, exist_ok=True)
        link = dev_char / f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"
        target = os.path.relpath(f"/dev/{device.relative_to(dev)}", "/dev/char")
        if link.is_symlink() and os.readlink(link) == target:
            made += 1
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        made += 1
    return made
