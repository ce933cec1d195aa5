"""The plugin's effective settings: config file, then environment, then command line.

Precedence is upstream's (CLI > env > file > defaults): the file is loaded first and every option
that was explicitly given (flag or environment variable) overwrites its config key. Paths the plugin
reads or writes on the node are separate fields, so a simulated node (kubesim) can map them into
its host filesystem.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import health

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_KUBELET_SOCKET = DEFAULT_PLUGIN_DIR / "kubelet.sock"
DEFAULT_CDI_ROOT = Path("/var/run/cdi")
MPS_CONTAINER_ROOT = Path("/mps")
RETRY_INTERVAL = 30.0

# Command-line option -> config key it overrides (only when given).
OVERRIDES: dict[str, str] = {
    "mig_strategy": "flags.migStrategy",
    "fail_on_init_error": "flags.failOnInitError",
    "nvidia_driver_root": "flags.nvidiaDriverRoot",
    "dev_root": "flags.nvidiaDevRoot",
    "mps_root": "flags.mpsRoot",
    "gds_enabled": "flags.gdsEnabled",
    "mofed_enabled": "flags.mofedEnabled",
    "gdrcopy_enabled": "flags.gdrcopyEnabled",
    "device_discovery_strategy": "flags.deviceDiscoveryStrategy",
    "pass_device_specs": "flags.plugin.passDeviceSpecs",
    "device_list_strategy": "flags.plugin.deviceListStrategy",
    "device_id_strategy": "flags.plugin.deviceIDStrategy",
    "cdi_annotation_prefix": "flags.plugin.cdiAnnotationPrefix",
    "nvidia_cdi_hook_path": "flags.plugin.nvidiaCTKPath",
    "container_driver_root": "flags.plugin.containerDriverRoot",
    "shared_devices_allocation_policy": "flags.plugin.sharedDevicesAllocationPolicy",
    "imex_channel_ids": "imex.channelIDs",
    "imex_required": "imex.required",
}


def split_list(value: str) -> list[str]:
    """A comma-separated option (`cdi-annotations,cdi-cri`), as Go's string-slice flags read it."""
    return [part.strip() for part in value.split(",") if part.strip()]


def overrides_from(options: dict[str, Any]) -> dict[str, object]:
    """Config keys for the options that were given (None means "not given")."""
    out: dict[str, object] = {}
    for name, key in OVERRIDES.items():
        value = options.get(name)
        if value is None:
            continue
        if name == "device_list_strategy" and isinstance(value, str):
            value = split_list(value)
        if name == "imex_channel_ids" and isinstance(value, str):
            value = [int(v) if v.isdigit() else v for v in split_list(value)]
        out[key] = value
    return out


def apply_overrides(config: pc.PluginConfig, overrides: dict[str, object]) -> pc.PluginConfig:
    """Overlay dotted-path overrides on a config and validate the result (ConfigError)."""
    data = config.model_dump(by_alias=True)
    for path, value in overrides.items():
        node = data
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return pc.parse(data, "command line")


@dataclass
class Settings:
    """Everything the plugin needs besides NVML."""

    config: pc.PluginConfig = field(default_factory=pc.PluginConfig)
    config_path: Path | None = None
    overrides: dict[str, object] = field(default_factory=dict)
    # None: do not register (upstream's `--kubelet-socket ""`, for tests).
    kubelet_socket: Path | None = DEFAULT_KUBELET_SOCKET
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    cdi_root: Path = DEFAULT_CDI_ROOT
    # Where this process sees the driver root, /dev, /sys and the MPS root (the container view).
    driver_root_view: Path = Path("/driver-root")
    dev_root_view: Path = Path("/")
    sys_root: Path = Path("/")
    # procfs for /proc/driver/nvidia-caps/mig-minors (the kernel's: any container sees it).
    proc_root: Path = Path("/")
    mps_root_view: Path = MPS_CONTAINER_ROOT
    health_policy: health.XidPolicy = field(default_factory=health.XidPolicy)
    health_recovery: bool = True
    recheck_interval: float = 1.0
    retry_interval: float = RETRY_INTERVAL
    kubelet_poll_interval: float = 0.5
    mps_wait_timeout: float = 300.0
    mps_poll_interval: float = 1.0
    cdi_disable_hooks: bool = False

    def reload(self) -> None:
        """Re-read the config file and re-apply the overrides (SIGHUP); ConfigError if bad."""
        base = pc.load(self.config_path) if self.config_path is not None else pc.PluginConfig()
        self.config = apply_overrides(base, self.overrides)


def build(config_path: Path | None, options: dict[str, Any], **paths_and_knobs: Any) -> Settings:
    """Settings from a config file and the given options (ConfigError names the bad key)."""
    overrides = overrides_from(options)
    settings = Settings(config_path=config_path, overrides=overrides, **paths_and_knobs)
    settings.reload()
    return settings


# Environment variable -> (option name, is boolean), as upstream's flags read them.
ENV_OPTIONS: dict[str, tuple[str, bool]] = {
    "MIG_STRATEGY": ("mig_strategy", False),
    "FAIL_ON_INIT_ERROR": ("fail_on_init_error", True),
    "NVIDIA_DRIVER_ROOT": ("nvidia_driver_root", False),
    "NVIDIA_DEV_ROOT": ("dev_root", False),
    "MPS_ROOT": ("mps_root", False),
    "GDS_ENABLED": ("gds_enabled", True),
    "MOFED_ENABLED": ("mofed_enabled", True),
    "GDRCOPY_ENABLED": ("gdrcopy_enabled", True),
    "DEVICE_DISCOVERY_STRATEGY": ("device_discovery_strategy", False),
    "PASS_DEVICE_SPECS": ("pass_device_specs", True),
    "DEVICE_LIST_STRATEGY": ("device_list_strategy", False),
    "DEVICE_ID_STRATEGY": ("device_id_strategy", False),
    "CDI_ANNOTATION_PREFIX": ("cdi_annotation_prefix", False),
    "NVIDIA_CTK_PATH": ("nvidia_cdi_hook_path", False),
    "NVIDIA_CDI_HOOK_PATH": ("nvidia_cdi_hook_path", False),
    "CONTAINER_DRIVER_ROOT": ("container_driver_root", False),
    "DRIVER_ROOT_CTR_PATH": ("container_driver_root", False),
    "SHARED_DEVICES_ALLOCATION_POLICY": ("shared_devices_allocation_policy", False),
    "IMEX_CHANNEL_IDS": ("imex_channel_ids", False),
    "IMEX_REQUIRED": ("imex_required", True),
}
_TRUE = frozenset({"1", "t", "true"})
_FALSE = frozenset({"0", "f", "false"})


def parse_bool(name: str, value: str) -> bool:
    """A boolean the way Go's strconv.ParseBool reads it (ConfigError otherwise)."""
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise pc.ConfigError(f"{name}: invalid boolean {value!r} (expected true or false)")


def options_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The plugin options set in a container's environment (later names in ENV_OPTIONS win)."""
    options: dict[str, Any] = {}
    for name, (option, boolean) in ENV_OPTIONS.items():
        if name in env:
            options[option] = parse_bool(name, env[name]) if boolean else env[name]
    return options


def from_environment(
    env: Mapping[str, str], resolve: Callable[[str], Path], **knobs: Any
) -> Settings:
    """Settings for a plugin whose container environment is `env` and whose container paths
    `resolve` maps to this machine (kubesim: `ctx.env` and `ctx.path`).

    The paths are the plugin pod's mounts: the kubelet's device-plugin directory, `/var/run/cdi`,
    the driver root at `containerDriverRoot`, the MPS root at `/mps`, the host's `/` at `/host`
    (for sysfs). Config file: `CONFIG_FILE`. ConfigError names a bad key or variable.
    """

    def optional(path: str) -> Path | None:
        try:
            return resolve(path)
        except FileNotFoundError:
            return None

    socket_env = env.get("KUBELET_SOCKET", str(DEFAULT_KUBELET_SOCKET))
    kubelet = resolve(socket_env) if socket_env else None
    plugin_dir = kubelet.parent if kubelet is not None else resolve(str(DEFAULT_PLUGIN_DIR))
    config_file = env.get("CONFIG_FILE")
    defaults: dict[str, Any] = {
        "kubelet_socket": kubelet,
        "plugin_dir": plugin_dir,
        "health_policy": health.parse_policy(
            env.get(health.DISABLE_ENV), env.get(health.ENABLE_ENV)
        ),
        "cdi_disable_hooks": parse_bool("CDI_DISABLE_HOOKS", env.get("CDI_DISABLE_HOOKS", "false")),
    }
    for field_name, container_path in (
        ("cdi_root", str(DEFAULT_CDI_ROOT)),
        ("mps_root_view", str(MPS_CONTAINER_ROOT)),
        ("sys_root", "/host"),
    ):
        where = optional(container_path)
        if where is not None:
            defaults[field_name] = where
    defaults.update(knobs)
    s = build(resolve(config_file) if config_file else None, options_from_env(env), **defaults)
    driver = optional(s.config.flags.plugin.container_driver_root)
    if driver is not None and "driver_root_view" not in knobs:
        s.driver_root_view = driver
    if driver is not None and "dev_root_view" not in knobs:
        s.dev_root_view = driver
    return s
