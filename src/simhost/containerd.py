"""The container runtime of each simulated node: containerd (or CRI-O) serving the handlers its
configuration names, and the NVIDIA container runtime deciding what a container gets.

Contract C2 of the node chain: one `SimulatedContainerd` (`SimulatedCrio` on CRI-O pools) per
node, reachable as `Programs.runtime(node)`. It reads the node's configuration at boot and on
`restart()` / `signal(SIGHUP)` (runtime_config has the rules); a configuration that does not
load takes the runtime down, and the node goes NotReady ("container runtime is down") until a
valid one and a restart. The kubelet reaches it through kubesim's CRI hook (`NodeRuntimes`):

- a sandbox whose handler is not served fails as containerd fails it (`no runtime for "nvidia" is
  configured`); a handler whose BinaryName does not exist on the node fails as the shim fails
  to exec it (after an uninstall that left the config behind, for example);
- at container creation, CDI devices from the kubelet (device plugin `cdi-cri` / `cdi.k8s.io/`
  annotations) are resolved from the node's spec directories when `enable_cdi` is on
  ("unresolvable CDI devices ..." otherwise);
- a handler whose binary is the NVIDIA runtime applies its mode (from the toolkit's config.toml
  or the `.cdi`/`.legacy` binary): cdi mode turns NVIDIA_VISIBLE_DEVICES into names of its default
  kind (`management.nvidia.com/gpu=<id>`) that must resolve; legacy mode runs
  nvidia-container-cli, which needs the driver loaded and mounts the driver's files.

What each container got is recorded (`injected(view)`), so the demo's `nvidia-smi`, `vectorAdd`
and `dcgmproftester*` exist exactly where the runtime put GPUs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import logging
import posixpath
import signal as signals
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import kubesim
from gpu_operator.nvml import mock
from simhost import cdi_registry
from simhost import runtime_config as rc

log = logging.getLogger("gpu_operator.demo.containerd")

NVIDIA_RUNTIME = "nvidia-container-runtime"
TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
DEFAULT_CAPABILITIES = ("utility", "compute")
CRIO_HOOK_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
# How many containers' injections a runtime remembers.
MAX_RECORDS = 20_000
# Which driver library each capability brings (the legacy hook mounts these).
CAPABILITY_LIBRARIES = {"utility": ("libnvidia-ml.so.*",), "compute": ("libcuda.so.*",)}

# The environment some images declare (their Dockerfile ENV), which the runtime puts first in a
# container's environment: CUDA base images and what is built on them ask for every GPU, so a
# pod of such an image under the NVIDIA runtime in legacy mode gets all GPUs unless the device
# plugin says otherwise (a well-known surprise). NVIDIA's operator image, which has carried the
# validator since 25.10, is distroless and declares NVIDIA_VISIBLE_DEVICES=void: its toolkit check
# and CUDA workload ask for every GPU in their own container env.
_CUDA_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
IMAGE_ENV: dict[str, dict[str, str]] = {
    "nvcr.io/nvidia/cuda": _CUDA_ENV,
    "nvidia/cuda": _CUDA_ENV,
    "docker.io/nvidia/cuda": _CUDA_ENV,
    "nvcr.io/nvidia/k8s/cuda-sample": _CUDA_ENV,
    "nvcr.io/nvidia/gpu-operator": {"NVIDIA_VISIBLE_DEVICES": "void"},
}
# id ("0", "GPU-...", "0:1", "MIG-...") -> UUID, for the node's GPUs and MIG devices.
DeviceTable = Callable[[], Mapping[str, str]]
# Called with (up, reason) when the runtime comes up or goes down.
StateListener = Callable[[bool, str], None]


@dataclass(frozen=True)
class Injection:
    """What the runtime put into one container: GPUs (all, or by id as named) and the
    container paths of the driver files it mounted."""

    handler: str
    mode: str  # "cdi" (the CRI runtime's), "nvidia-cdi", "legacy"
    cdi_devices: tuple[str, ...] = ()
    all_gpus: bool = False
    gpu_ids: tuple[str, ...] = ()
    uuids: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()

    @property
    def nvidia_smi(self) -> bool:
        """Whether `nvidia-smi` is in the container."""
        return any(posixpath.basename(m) == "nvidia-smi" for m in self.mounts)

    @property
    def libraries(self) -> tuple[str, ...]:
        """The driver libraries mounted (libcuda, libnvidia-ml, ...)."""
        return tuple(m for m in self.mounts if ".so" in posixpath.basename(m))

    @property
    def has_gpus(self) -> bool:
        return self.all_gpus or bool(self.gpu_ids)


@dataclass
class _Collected:
    cdi_devices: list[str] = field(default_factory=list)
    all_gpus: bool = False
    gpu_ids: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)

    def add_ids(self, ids: Iterable[str]) -> None:
        for device_id in ids:
            if device_id == "all":
                self.all_gpus = True
            elif device_id not in self.gpu_ids:
                self.gpu_ids.append(device_id)

    def add_cdi(self, resolution: cdi_registry.Resolution, mode: str) -> None:
        self.modes.append(mode)
        named = False
        for name in resolution.devices:
            if name not in self.cdi_devices:
                self.cdi_devices.append(name)
            kind, _, device = name.partition("=")
            vendor, _, cdi_class = kind.partition("/")
            if cdi_class == "gpu" and vendor.endswith("nvidia.com"):
                self.add_ids([device])
                named = True
        if not named:
            # Per-claim specs (the DRA plugin's `k8s.gpu.nvidia.com/claim`) name no GPU in the
            # device name: the GPUs are those the spec's NVIDIA_VISIBLE_DEVICES lists, whose
            # device nodes it adds.
            for item in resolution.env:
                key, _, value = item.partition("=")
                if key == VISIBLE_DEVICES:
                    self.add_ids(visible_devices({key: value}) or [])
        self.mounts += [m for m in resolution.mounts if m not in self.mounts]


def device_table(machine: mock.MockMachine) -> dict[str, str]:
    """Every name a container can give a node's GPUs and MIG devices (index, `i:j`, UUID) ->
    the device's UUID."""
    table: dict[str, str] = {}
    for gpu in machine.gpus:
        table[str(gpu.index)] = table[gpu.uuid] = gpu.uuid
        for position, (_gi, ci) in enumerate(gpu.mig_devices()):
            table[f"{gpu.index}:{position}"] = table[ci.uuid] = ci.uuid
    return table


def image_env(image: str) -> dict[str, str]:
    """The environment an image declares (empty for images the demo knows nothing about)."""
    repository = image.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return dict(IMAGE_ENV.get(repository, {}))


def process_env(view: kubesim.ContainerView) -> dict[str, str]:
    """A container's environment as the runtime builds it: the image's, then the pod's."""
    return {**image_env(str(view.container.get("image", ""))), **view.env}


def is_nvidia_runtime(binary: str) -> bool:
    """Whether a handler's binary is the NVIDIA container runtime (any of its three flavours)."""
    return posixpath.basename(binary).startswith(NVIDIA_RUNTIME)


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """NVIDIA_VISIBLE_DEVICES as the runtime reads it: None when it asks for nothing (unset,
    empty, `void`), [] for `none` (the driver without devices), else the ids or `all`."""
    value = env.get(VISIBLE_DEVICES)
    if value is None or value.strip() in ("", "void"):
        return None
    if value.strip() == "none":
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


class SimulatedRuntime:
    """What containerd and CRI-O have in common: config, state, handlers, the CRI calls."""

    name = "runtime"
    socket_node_path = "/run/runtime.sock"

    def __init__(
        self,
        node: str,
        root: Path,
        *,
        version: str,
        devices: DeviceTable | None = None,
        on_state: StateListener | None = None,
    ) -> None:
        self.node = node
        self.root = root
        self.version = version
        self.devices = devices
        self.on_state = on_state
        self.config: rc.CriConfig | None = None
        self.error: str | None = None
        self.up = False
        self.restarts = 0
        self.journal: list[str] = []
        self._injections: dict[tuple[str, str], Injection | None] = {}

    # ----- process lifecycle ------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        """The runtime's CRI socket on this machine (the node's socket path)."""
        return self.root / self.socket_node_path.lstrip("/")

    def start(self) -> bool:
        """Start the daemon: read the configuration and serve it, or stay down with the error
        it logs. Returns whether it is up."""
        try:
            config = self.load()
        except rc.ConfigError as err:
            self._down(err.message)
            return False
        self.config = config
        self.error = None
        for warning in config.warnings:
            self._log(f"level=warning msg={warning!r}")
        handlers = ", ".join(
            f"{h}={r.binary or r.name}" for h, r in sorted(config.runtimes.items())
        )
        self._log(
            f'level=info msg="{self.name} {self.version} serving" files={list(config.files)} '
            f"default_runtime={config.default_runtime} handlers=[{handlers}] "
            f"enable_cdi={str(config.enable_cdi).lower()}"
        )
        was_up, self.up = self.up, True
        self._open_socket()
        if not was_up and self.on_state is not None:
            self.on_state(True, "")
        return True

    def stop(self) -> None:
        """Stop the daemon (`systemctl stop`): nothing is served until it starts again."""
        self._down("stopped")

    def restart(self) -> bool:
        """What `systemctl restart` does: stop, then start with the configuration now on disk.
        Running containers keep running (their shims outlive the daemon)."""
        self.restarts += 1
        self._log(f'level=info msg="Stopping {self.name}" restart={self.restarts}')
        return self.start()

    def signal(self, signum: int) -> None:
        """Deliver a signal to the daemon: SIGHUP and the terminating signals restart it with
        the configuration on disk; others are ignored."""
        if signum in (signals.SIGHUP, signals.SIGTERM, signals.SIGINT, signals.SIGKILL):
            self._log(f'level=info msg="received signal {signals.Signals(signum).name}"')
            self.restart()

    def _down(self, reason: str) -> None:
        self.error = reason
        self.config = None
        if reason != "stopped":
            self._log(f"level=fatal msg={reason!r}")
        self._close_socket()
        was_up, self.up = self.up, False
        if was_up and self.on_state is not None:
            self.on_state(False, reason)

    def _open_socket(self) -> None:
        # A socket file nobody listens on: tools that check for the socket find it, and
        # nothing can talk to (or signal) this process through it.
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or len(str(path).encode()) > 107:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.closing(sock), contextlib.suppress(OSError):
            sock.bind(str(path))

    def _close_socket(self) -> None:
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

    def _log(self, line: str) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        text = f'time="{stamp}" {line}'
        self.journal.append(text)
        log.info("%s on %s: %s", self.name, self.node, line)
        journal = self.root / "var" / "log" / f"{self.name}.log"
        with contextlib.suppress(OSError):
            journal.parent.mkdir(parents=True, exist_ok=True)
            with journal.open("a") as out:
                out.write(text + "\n")

    # ----- what it serves ---------------------------------------------------------------------

    def load(self) -> rc.CriConfig:
        raise NotImplementedError

    def handlers(self) -> dict[str, str]:
        """Runtime handler -> its binary ("" where none is configured: found in $PATH)."""
        if self.config is None:
            return {}
        return {name: r.binary for name, r in self.config.runtimes.items()}

    @property
    def enable_cdi(self) -> bool:
        return self.config is not None and self.config.enable_cdi

    @property
    def default_runtime(self) -> str:
        return self.config.default_runtime if self.config is not None else ""

    # ----- CRI --------------------------------------------------------------------------------

    def _serving(self) -> rc.CriConfig:
        if self.config is None or not self.up:
            raise kubesim.CriError(
                'connection error: desc = "transport: Error while dialing: dial unix '
                f'{self.socket_node_path}: connect: connection refused"',
                code="Unavailable",
            )
        return self.config

    def no_handler_message(self, handler: str, sandbox_id: str) -> str:
        raise NotImplementedError

    def missing_binary_message(self, binary: str, container_id: str) -> str:
        raise NotImplementedError

    def start_failed(self, why: str) -> str:
        """How a failure inside the OCI runtime reaches the kubelet from this runtime."""
        raise NotImplementedError

    def cdi_failed(self, unresolved: Sequence[str]) -> str:
        raise NotImplementedError

    def _binary_missing(self, binary: str) -> bool:
        return binary.startswith("/") and not (self.root / binary.lstrip("/")).exists()

    def run_sandbox(self, sandbox: kubesim.PodSandbox) -> None:
        """RunPodSandbox: the handler must be served and its OCI runtime must exist."""
        config = self._serving()
        handler = sandbox.handler or config.default_runtime
        runtime = config.runtimes.get(handler)
        if runtime is None:
            raise kubesim.CriError(self.no_handler_message(handler, sandbox.id))
        if self._binary_missing(runtime.binary):
            raise kubesim.CriError(self.missing_binary_message(runtime.binary, sandbox.id))

    def create_container(self, view: kubesim.ContainerView) -> None:
        """CreateContainer (and the OCI runtime's create on start): CDI devices, the NVIDIA
        runtime's mode, the legacy hook; records what the container got."""
        config = self._serving()
        handler = view.runtime_handler or config.default_runtime
        runtime = config.runtimes.get(handler)
        uid = str(view.pod["metadata"].get("uid", ""))
        key = (uid, view.container_name)
        self._injections.pop(key, None)
        if runtime is None:
            raise kubesim.CriError(self.no_handler_message(handler, uid))
        if self._binary_missing(runtime.binary):
            raise kubesim.StartContainerError(self.missing_binary_message(runtime.binary, uid))
        got = _Collected()
        if config.enable_cdi and view.cdi_devices:
            resolution = cdi_registry.Registry.load(self.root, config.cdi_spec_dirs).resolve(
                view.cdi_devices
            )
            if resolution.unresolved:
                raise kubesim.CriError(self.cdi_failed(resolution.unresolved))
            got.add_cdi(resolution, "cdi")
        if is_nvidia_runtime(runtime.binary):
            self._nvidia_runtime(view, runtime.binary, config, got)
        elif self._oci_hook_installed():
            self._legacy(process_env(view), rc.NvidiaRuntimeConfig(), "legacy", got)
        self._injections[key] = self._injection(handler, got)
        while len(self._injections) > MAX_RECORDS:  # the oldest containers are long gone
            del self._injections[next(iter(self._injections))]

    def injected(self, view: kubesim.ContainerView) -> Injection | None:
        """What the runtime put into this container when it created it (None: no GPUs and no
        driver files)."""
        uid = str(view.pod["metadata"].get("uid", ""))
        return self._injections.get((uid, view.container_name))

    def _oci_hook_installed(self) -> bool:
        return False

    def _injection(self, handler: str, got: _Collected) -> Injection | None:
        if not got.all_gpus and not got.gpu_ids and not got.mounts:
            return None
        table = dict(self.devices()) if self.devices is not None else {}
        if got.all_gpus:
            uuids = [u for u in dict.fromkeys(table.values()) if u.startswith("GPU-")]
        else:
            uuids = [table.get(i, i) for i in got.gpu_ids]
        return Injection(
            handler=handler,
            mode=got.modes[-1] if got.modes else "legacy",
            cdi_devices=tuple(got.cdi_devices),
            all_gpus=got.all_gpus,
            gpu_ids=tuple(got.gpu_ids),
            uuids=tuple(dict.fromkeys(uuids)),
            mounts=tuple(got.mounts),
        )

    def _nvidia_runtime(
        self, view: kubesim.ContainerView, binary: str, config: rc.CriConfig, got: _Collected
    ) -> None:
        try:
            settings = rc.load_nvidia_runtime(self.root, binary)
        except rc.ConfigError as err:
            raise kubesim.StartContainerError(self.start_failed(err.message)) from None
        name = posixpath.basename(binary)
        mode = "cdi" if name.endswith(".cdi") else "legacy" if name.endswith(".legacy") else ""
        mode = mode or settings.mode
        env = process_env(view)
        requested = visible_devices(env) or []
        if mode == "auto" and requested and all("=" in r for r in requested):
            mode = "cdi"  # auto picks CDI when the container names CDI devices
        if mode == "cdi":
            names = [r if "=" in r else f"{settings.default_kind}={r}" for r in requested]
            if not config.enable_cdi:
                # The runtime reads CDI annotations itself when the CRI runtime does not.
                annotations = getattr(view.allocation, "annotations", None) or {}
                for key in sorted(annotations):
                    if key.startswith(settings.annotation_prefixes):
                        names += [n.strip() for n in annotations[key].split(",") if n.strip()]
            if not names:
                return
            resolution = cdi_registry.Registry.load(self.root, settings.spec_dirs).resolve(names)
            if resolution.unresolved:
                why = (
                    "could not apply required modification to OCI specification: error "
                    "modifying OCI spec: failed to inject CDI devices: "
                    + cdi_registry.unresolvable_message(resolution.unresolved)
                )
                raise kubesim.StartContainerError(self.start_failed(why))
            got.add_cdi(resolution, "nvidia-cdi")
            return
        self._legacy(env, settings, "auto" if mode == "auto" else "legacy", got)

    def _legacy(
        self,
        env: Mapping[str, str],
        settings: rc.NvidiaRuntimeConfig,
        mode: str,
        got: _Collected,
    ) -> None:
        """nvidia-container-cli through the prestart hook: the driver must be loaded, the ids
        must exist; it mounts the driver's files by capability."""
        requested = visible_devices(env)
        if requested is None:
            return  # the hook leaves containers that ask for nothing alone
        detected = "Auto-detected mode as 'legacy'\n" if mode == "auto" else ""
        if not (self.root / DRIVER_VERSION_FILE.lstrip("/")).is_file():
            raise kubesim.StartContainerError(
                self._hook_failed(
                    f"{detected}nvidia-container-cli: initialization error: nvml error: "
                    "driver not loaded"
                )
            )
        table = dict(self.devices()) if self.devices is not None else {}
        for device_id in requested:
            if device_id != "all" and device_id not in table:
                raise kubesim.StartContainerError(
                    self._hook_failed(
                        f"{detected}nvidia-container-cli: device error: {device_id}: unknown device"
                    )
                )
        got.modes.append("legacy")
        got.add_ids(requested)
        got.mounts += [m for m in self._driver_files(env, settings) if m not in got.mounts]

    def _hook_failed(self, stderr: str) -> str:
        return self.start_failed(
            "runc create failed: unable to start container process: error during container "
            "init: error running hook #0: error running hook: exit status 1, stdout: , "
            f"stderr: {stderr}"
        )

    def _driver_files(self, env: Mapping[str, str], settings: rc.NvidiaRuntimeConfig) -> list[str]:
        """Container paths of the driver files the legacy hook mounts for the capabilities."""
        caps_value = env.get(DRIVER_CAPABILITIES, ",".join(DEFAULT_CAPABILITIES))
        caps = {c.strip() for c in caps_value.split(",") if c.strip()}
        if "all" in caps:
            caps = set(CAPABILITY_LIBRARIES)
        driver_root = self.root / settings.driver_root.lstrip("/")
        files = []
        if "utility" in caps and (driver_root / "usr/bin/nvidia-smi").is_file():
            files.append("/usr/bin/nvidia-smi")
        for cap in sorted(caps & set(CAPABILITY_LIBRARIES)):
            for pattern in CAPABILITY_LIBRARIES[cap]:
                for found in sorted(glob.glob(str(driver_root / LIBRARY_DIR / pattern))):
                    files.append(f"/{LIBRARY_DIR}/{posixpath.basename(found)}")
        return files


class SimulatedContainerd(SimulatedRuntime):
    """containerd on a simulated node (`version`: 2.x reads config version 3, 1.7 version 2)."""

    name = "containerd"
    socket_node_path = "/run/containerd/containerd.sock"

    def __init__(
        self,
        node: str,
        root: Path,
        *,
        version: str = "2.0.5",
        config_path: str = rc.CONTAINERD_CONFIG,
        devices: DeviceTable | None = None,
        on_state: StateListener | None = None,
    ) -> None:
        super().__init__(node, root, version=version, devices=devices, on_state=on_state)
        self.config_path = config_path

    def load(self) -> rc.CriConfig:
        return rc.load_containerd(self.root, self.version, self.config_path)

    def signal(self, signum: int) -> None:
        # containerd does not handle SIGHUP: the process exits and systemd (Restart=always)
        # starts it again, which re-reads the config; that is how the toolkit's "signal"
        # restart mode takes effect.
        super().signal(signum)

    @property
    def modern(self) -> bool:
        return rc.major_version(self.version) >= 2

    def no_handler_message(self, handler: str, sandbox_id: str) -> str:
        why = f'no runtime for "{handler}" is configured'
        if self.modern:
            return f'unable to get OCI runtime for sandbox "{sandbox_id}": {why}'
        return f"failed to get sandbox runtime: {why}"

    def missing_binary_message(self, binary: str, container_id: str) -> str:
        return self.start_failed(
            "unable to retrieve OCI runtime error (open /run/containerd/io.containerd.runtime."
            f"v2.task/k8s.io/{container_id}/log.json: no such file or directory): fork/exec "
            f"{binary}: no such file or directory"
        )

    def start_failed(self, why: str) -> str:
        return (
            f"failed to create containerd task: failed to create shim task: OCI runtime create "
            f"failed: {why}: unknown"
        )

    def cdi_failed(self, unresolved: Sequence[str]) -> str:
        return (
            "failed to create containerd container: CDI device injection failed: "
            + cdi_registry.unresolvable_message(unresolved)
        )


class SimulatedCrio(SimulatedRuntime):
    """CRI-O on a simulated node: `/etc/crio/crio.conf` plus its drop-ins; SIGHUP reloads."""

    name = "crio"
    socket_node_path = "/var/run/crio/crio.sock"

    def __init__(
        self,
        node: str,
        root: Path,
        *,
        version: str = "1.32.1",
        devices: DeviceTable | None = None,
        on_state: StateListener | None = None,
    ) -> None:
        super().__init__(node, root, version=version, devices=devices, on_state=on_state)

    def load(self) -> rc.CriConfig:
        return rc.load_crio(self.root)

    def no_handler_message(self, handler: str, sandbox_id: str) -> str:
        runtimes = self.config.runtimes if self.config is not None else {}
        return (
            f"failed to find runtime handler {handler} from runtime list "
            f"{rc.crio_runtime_list(runtimes)}"
        )

    def missing_binary_message(self, binary: str, container_id: str) -> str:
        return self.start_failed(f"fork/exec {binary}: no such file or directory")

    def start_failed(self, why: str) -> str:
        return f"container create failed: {why}"

    def cdi_failed(self, unresolved: Sequence[str]) -> str:
        return "CDI device injection failed: " + cdi_registry.unresolvable_message(unresolved)

    def _oci_hook_installed(self) -> bool:
        """The toolkit's OCI hook mode: a hook file that runs the NVIDIA hook for every
        container (it acts on those that ask for GPUs)."""
        for directory in CRIO_HOOK_DIRS:
            host = self.root / directory.lstrip("/")
            if not host.is_dir():
                continue
            for entry in host.iterdir():
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    if entry.suffix == ".json" and "nvidia-container" in entry.read_text():
                        return True
        return False


class NodeRuntimes:
    """kubesim's CRI hook for the demo: each node's simulated runtime (nodes without one, e.g.
    Docker pools, create everything unchecked)."""

    def __init__(self) -> None:
        self.runtimes: dict[str, SimulatedRuntime] = {}

    def add(self, runtime: SimulatedRuntime) -> SimulatedRuntime:
        self.runtimes[runtime.node] = runtime
        return runtime

    def get(self, node: str) -> SimulatedRuntime | None:
        return self.runtimes.get(node)

    def run_sandbox(self, sandbox: kubesim.PodSandbox) -> None:
        runtime = self.runtimes.get(sandbox.node)
        if runtime is not None:
            runtime.run_sandbox(sandbox)

    def create_container(self, view: kubesim.ContainerView) -> None:
        runtime = self.runtimes.get(view.node_name)
        if runtime is not None:
            runtime.create_container(view)
