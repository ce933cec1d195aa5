"""The toolkit agent's settings from upstream's environment contract (`nvidia-ctk-installer`).

Names and defaults as upstream reads them (the first name of each list wins):
RUNTIME (docker) | ROOT/TOOLKIT_INSTALL_DIR (/usr/local/nvidia) | TOOLKIT_PID_FILE/PID_FILE
(/run/nvidia/toolkit/toolkit.pid) | NO_DAEMON | RUNTIME_CONFIG/CONTAINERD_CONFIG/DOCKER_CONFIG |
RUNTIME_DROP_IN_CONFIG, RUNTIME_DROP_IN_CONFIG_HOST_PATH | RUNTIME_SOCKET/CONTAINERD_SOCKET/
DOCKER_SOCKET | RUNTIME_RESTART_MODE (containerd, docker: signal; crio: systemd) |
RUNTIME_ENABLE_CDI (default: CDI_ENABLED) | HOST_ROOT_MOUNT (/host) | NVIDIA_RUNTIME_NAME/
CONTAINERD_RUNTIME_CLASS/DOCKER_RUNTIME_NAME (nvidia) | NVIDIA_RUNTIME_SET_AS_DEFAULT/
CONTAINERD_SET_AS_DEFAULT/DOCKER_SET_AS_DEFAULT (true) | CONTAINERD_RUNTIME_TYPE |
RUNTIME_CONFIG_SOURCE (`file=<path>` entries) | CRIO_CONFIG_MODE (config), CRIO_HOOKS_DIR,
CRIO_HOOK_FILENAME | NVIDIA_DRIVER_ROOT/DRIVER_ROOT, DRIVER_ROOT_CTR_PATH (/run/nvidia/driver),
NVIDIA_DEV_ROOT/DEV_ROOT, DEV_ROOT_CTR_PATH |
NVIDIA_CONTAINER_RUNTIME_MODE, ..._MODES_CDI_DEFAULT_KIND, ..._MODES_CDI_ANNOTATION_PREFIXES,
..._RUNTIMES, ..._DEBUG, ..._LOG_LEVEL, ..._HOOK_SKIP_MODE_DETECTION,
ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED (true), ..._AS_VOLUME_MOUNTS | CDI_ENABLED/
ENABLE_CDI, CDI_OUTPUT_DIR (/var/run/cdi), CDI_KIND (management.nvidia.com/gpu) | ENABLE_NRI_PLUGIN.

Ours: RUNTIME_CONFIG_HOST_PATH (the config's path on the host, for messages; default: the runtime's
usual directory when the config is mounted under /runtime/config-dir), RUNTIME_CONFIG_BACKUP_DIR
(`<ROOT>/runtime-config-backup`), RUNTIME_CONFIG_DRIFT_INTERVAL (seconds, 5; 0: no drift checks),
CDI_SPEC_TIMEOUT (seconds, 60: how long the management CDI spec may stay ungenerated before the
agent exits with the reason; 0: retry forever), RUNTIME_CONFIG_IO_TIMEOUT (seconds, 60: how long
reading or writing the runtime config may keep failing, a full or read-only disk, a permission or
I/O error, before the agent exits with the reason; 0: retry forever), NODE_NAME (for the node's
Events).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.agents.container_toolkit import backup, install, runtimes

RUNTIMES = ("containerd", "crio", "docker")
DEFAULT_CONFIG = {
    "containerd": "/etc/containerd/config.toml",
    "crio": "/etc/crio/crio.conf",
    "docker": "/etc/docker/daemon.json",
}
DEFAULT_DROP_IN = {
    "containerd": "/etc/containerd/conf.d/99-nvidia.toml",
    "crio": "/etc/crio/crio.conf.d/99-nvidia.conf",
}
DEFAULT_SOCKET = {
    "containerd": "/run/containerd/containerd.sock",
    "crio": "/var/run/crio/crio.sock",
    "docker": "/var/run/docker.sock",
}
DEFAULT_RESTART = {"containerd": "signal", "crio": "systemd", "docker": "signal"}
# Where the operator mounts the config's directory in the toolkit container.
OPERATOR_CONFIG_DIR = "/runtime/config-dir/"
DEFAULT_DRIVER_ROOT = "/run/nvidia/driver"
DEFAULT_DRIFT_INTERVAL = 5.0
DEFAULT_CDI_SPEC_TIMEOUT = 60.0
DEFAULT_IO_TIMEOUT = 60.0
TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


class SettingsError(ValueError):
    """A setting with a bad value; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    runtime: str = "containerd"
    root: str = "/usr/local/nvidia"
    pid_file: str = "/run/nvidia/toolkit/toolkit.pid"
    no_daemon: bool = False
    config: str = "/etc/containerd/config.toml"  # as this container sees it
    config_host: str = "/etc/containerd/config.toml"  # for messages
    drop_in: str | None = "/etc/containerd/conf.d/99-nvidia.toml"
    drop_in_host: str | None = "/etc/containerd/conf.d/99-nvidia.toml"
    source: str | None = None
    socket: str = "/run/containerd/containerd.sock"
    restart_mode: str = "signal"
    host_root: str = "/host"
    runtime_name: str = "nvidia"
    set_as_default: bool = True
    runtime_type: str = "io.containerd.runc.v2"
    enable_cdi_in_runtime: bool = False
    crio_mode: str = "config"
    crio_hook: str = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
    driver_root: str = DEFAULT_DRIVER_ROOT
    driver_root_ctr: str = DEFAULT_DRIVER_ROOT
    dev_root: str = DEFAULT_DRIVER_ROOT
    dev_root_ctr: str = DEFAULT_DRIVER_ROOT
    runtime_mode: str = ""
    cdi_default_kind: str = ""
    annotation_prefixes: tuple[str, ...] = ()
    low_level_runtimes: tuple[str, ...] = ()
    runtime_debug: str = ""
    runtime_log_level: str = ""
    hook_skip_mode_detection: bool = True
    accept_envvar_unprivileged: bool = True
    accept_volume_mounts: bool = False
    cdi_enabled: bool = False
    cdi_output_dir: str = "/var/run/cdi"
    cdi_kind: str = "management.nvidia.com/gpu"
    nri: bool = False
    backup_dir: str = "/usr/local/nvidia/" + backup.DIR_NAME
    drift_interval: float = DEFAULT_DRIFT_INTERVAL
    cdi_spec_timeout: float = DEFAULT_CDI_SPEC_TIMEOUT
    io_timeout: float = DEFAULT_IO_TIMEOUT
    node_name: str = ""
    warnings: tuple[str, ...] = field(default=())

    @property
    def runtime_dir(self) -> str:
        """`<root>/toolkit`, where the handlers' binaries are (a host path: the operator mounts
        ROOT at the same path in the container, as upstream recommends)."""
        return posixpath.join(self.root, install.TOOLKIT_SUBDIR)

    def handlers(self) -> tuple[runtimes.Handler, ...]:
        return runtimes.handlers(self.runtime_dir, self.runtime_name, self.set_as_default)


def _first(env: Mapping[str, str], names: Sequence[str]) -> tuple[str, str] | None:
    for name in names:
        if name in env:
            return name, env[name]
    return None


def _str(env: Mapping[str, str], names: Sequence[str], default: str) -> str:
    found = _first(env, names)
    return found[1] if found is not None else default


def _bool(env: Mapping[str, str], names: Sequence[str], default: bool) -> bool:
    found = _first(env, names)
    if found is None or not found[1].strip():
        return default
    value = found[1].strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise SettingsError(f"{found[0]}: expected true or false, not {found[1]!r}")


def _list(env: Mapping[str, str], names: Sequence[str]) -> tuple[str, ...]:
    found = _first(env, names)
    if found is None:
        return ()
    return tuple(p.strip() for p in found[1].split(",") if p.strip())


def _source(env: Mapping[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """RUNTIME_CONFIG_SOURCE: the first `file=` entry; `command` (a `config dump` of the runtime
    binary) cannot run from our image and is skipped with a warning."""
    raw = env.get("RUNTIME_CONFIG_SOURCE", "")
    warnings: list[str] = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        if part.startswith("file="):
            return part[len("file=") :], tuple(warnings)
        if part == "command":
            warnings.append("RUNTIME_CONFIG_SOURCE: 'command' is not supported here; reading files")
            continue
        raise SettingsError(
            f"RUNTIME_CONFIG_SOURCE: unknown source {part!r} (command or file=PATH)"
        )
    return None, tuple(warnings)


def from_env(env: Mapping[str, str]) -> Settings:
    """Settings from a container environment; SettingsError names the variable."""
    runtime = _str(env, ["RUNTIME"], "docker")
    if runtime not in RUNTIMES:
        raise SettingsError(f"RUNTIME: unknown runtime {runtime!r} (one of {', '.join(RUNTIMES)})")
    root = _str(env, ["TOOLKIT_INSTALL_DIR", "ROOT"], "/usr/local/nvidia") or ""
    if not root:
        raise SettingsError("ROOT: the install root must be set")
    pid_file = _str(env, ["TOOLKIT_PID_FILE", "PID_FILE"], "/run/nvidia/toolkit/toolkit.pid")
    if posixpath.basename(pid_file) != install.PID_FILE_NAME:
        raise SettingsError(f"TOOLKIT_PID_FILE: invalid toolkit.pid path {pid_file!r}")
    config = _str(env, ["RUNTIME_CONFIG", f"{runtime.upper()}_CONFIG"], DEFAULT_CONFIG[runtime])
    # The operator mounts the config's host directory at /runtime/config-dir: the file keeps its
    # name, and the directory is the runtime's usual one unless the env says otherwise.
    config_host = env.get("RUNTIME_CONFIG_HOST_PATH") or (
        posixpath.join(posixpath.dirname(DEFAULT_CONFIG[runtime]), posixpath.basename(config))
        if config.startswith(OPERATOR_CONFIG_DIR)
        else config
    )
    drop_in: str | None = _str(env, ["RUNTIME_DROP_IN_CONFIG"], DEFAULT_DROP_IN.get(runtime, ""))
    drop_in = drop_in or None
    drop_in_host = env.get("RUNTIME_DROP_IN_CONFIG_HOST_PATH") or drop_in
    socket = _str(env, ["RUNTIME_SOCKET", f"{runtime.upper()}_SOCKET"], DEFAULT_SOCKET[runtime])
    restart = (
        _str(env, ["RUNTIME_RESTART_MODE"], DEFAULT_RESTART[runtime]) or DEFAULT_RESTART[runtime]
    )
    if restart not in ("signal", "systemd", "none"):
        raise SettingsError(
            f"RUNTIME_RESTART_MODE: invalid restart mode {restart!r} (signal, systemd or none)"
        )
    if runtime == "crio" and restart == "signal":
        raise SettingsError(
            "RUNTIME_RESTART_MODE: restarting crio with a signal is not supported (systemd or none)"
        )
    crio_mode = _str(env, ["CRIO_CONFIG_MODE"], "config") or "config"
    if crio_mode not in ("config", "hook"):
        raise SettingsError(
            f"CRIO_CONFIG_MODE: invalid cri-o config mode {crio_mode!r} (config or hook)"
        )
    hooks_dir = _str(env, ["CRIO_HOOKS_DIR"], "/usr/share/containers/oci/hooks.d")
    hook_file = _str(env, ["CRIO_HOOK_FILENAME"], "oci-nvidia-hook.json")
    driver_root = _str(env, ["NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"], DEFAULT_DRIVER_ROOT)
    driver_root_ctr = _str(env, ["DRIVER_ROOT_CTR_PATH"], DEFAULT_DRIVER_ROOT)
    dev_root = _str(env, ["NVIDIA_DEV_ROOT", "DEV_ROOT"], "") or driver_root
    dev_root_ctr = _str(env, ["DEV_ROOT_CTR_PATH"], "") or driver_root_ctr
    cdi_enabled = _bool(env, ["CDI_ENABLED", "ENABLE_CDI"], False)
    cdi_output_dir = _str(env, ["CDI_OUTPUT_DIR"], "/var/run/cdi")
    warnings: list[str] = []
    if cdi_enabled and not cdi_output_dir:
        warnings.append("CDI_OUTPUT_DIR is empty: skipping the CDI spec generation")
        cdi_enabled = False
    source, source_warnings = _source(env)
    warnings += source_warnings
    interval_text = env.get("RUNTIME_CONFIG_DRIFT_INTERVAL", "")
    try:
        interval = float(interval_text) if interval_text.strip() else DEFAULT_DRIFT_INTERVAL
        if interval < 0:
            raise ValueError(interval_text)
    except ValueError:
        raise SettingsError(
            "RUNTIME_CONFIG_DRIFT_INTERVAL: expected seconds (0 turns drift checks off), "
            f"not {interval_text!r}"
        ) from None
    cdi_spec_timeout = _seconds(
        env, "CDI_SPEC_TIMEOUT", DEFAULT_CDI_SPEC_TIMEOUT, "0 retries forever"
    )
    return Settings(
        runtime=runtime,
        root=root,
        pid_file=pid_file,
        no_daemon=_bool(env, ["NO_DAEMON"], False),
        config=config,
        config_host=config_host,
        drop_in=drop_in if runtime != "docker" else None,
        drop_in_host=drop_in_host if runtime != "docker" else None,
        source=source,
        socket=socket,
        restart_mode=restart,
        host_root=_str(env, ["HOST_ROOT_MOUNT"], "/host"),
        runtime_name=_str(
            env,
            ["NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS", "DOCKER_RUNTIME_NAME"],
            runtimes.DEFAULT_NAME,
        )
        or runtimes.DEFAULT_NAME,
        set_as_default=_bool(
            env,
            ["NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT", "DOCKER_SET_AS_DEFAULT"],
            True,
        ),
        runtime_type=_str(env, ["CONTAINERD_RUNTIME_TYPE"], "io.containerd.runc.v2"),
        enable_cdi_in_runtime=_bool(env, ["RUNTIME_ENABLE_CDI"], cdi_enabled),
        crio_mode=crio_mode,
        crio_hook=posixpath.join(hooks_dir, hook_file),
        driver_root=driver_root,
        driver_root_ctr=driver_root_ctr,
        dev_root=dev_root,
        dev_root_ctr=dev_root_ctr,
        runtime_mode=_str(env, ["NVIDIA_CONTAINER_RUNTIME_MODE"], ""),
        cdi_default_kind=_str(env, ["NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND"], ""),
        annotation_prefixes=_list(env, ["NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES"]),
        low_level_runtimes=_list(env, ["NVIDIA_CONTAINER_RUNTIME_RUNTIMES"]),
        runtime_debug=_str(env, ["NVIDIA_CONTAINER_RUNTIME_DEBUG"], ""),
        runtime_log_level=_str(env, ["NVIDIA_CONTAINER_RUNTIME_LOG_LEVEL"], ""),
        hook_skip_mode_detection=_bool(
            env, ["NVIDIA_CONTAINER_RUNTIME_HOOK_SKIP_MODE_DETECTION"], True
        ),
        accept_envvar_unprivileged=_bool(
            env, ["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"], True
        ),
        accept_volume_mounts=_bool(env, ["ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"], False),
        cdi_enabled=cdi_enabled,
        cdi_output_dir=cdi_output_dir,
        cdi_kind=_str(env, ["CDI_KIND"], "management.nvidia.com/gpu"),
        nri=_bool(env, ["ENABLE_NRI_PLUGIN"], False),
        backup_dir=env.get("RUNTIME_CONFIG_BACKUP_DIR") or posixpath.join(root, backup.DIR_NAME),
        drift_interval=interval,
        cdi_spec_timeout=cdi_spec_timeout,
        io_timeout=_seconds(
            env, "RUNTIME_CONFIG_IO_TIMEOUT", DEFAULT_IO_TIMEOUT, "0 retries forever"
        ),
        node_name=env.get("NODE_NAME", ""),
        warnings=tuple(warnings),
    )


def _seconds(env: Mapping[str, str], name: str, default: float, zero: str) -> float:
    """A non-negative number of seconds from `name`; SettingsError names the variable."""
    text = env.get(name, "")
    try:
        value = float(text) if text.strip() else default
        if value < 0 or value != value:
            raise ValueError(text)
    except ValueError:
        raise SettingsError(f"{name}: expected seconds ({zero}), not {text!r}") from None
    return value


def read_driver_ready(text: str) -> dict[str, str]:
    """The `KEY=VALUE` lines of the validator's `driver-ready` file (what upstream's entrypoint
    sources before starting the toolkit)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            out[key.strip()] = value.strip().strip('"')
    return out
