"""How containerd, CRI-O and the NVIDIA runtime read their configuration on a simulated node.

Pure readers over a node's root directory: they return what the daemon would serve (runtime
handlers and their binaries, the default handler, CDI) or raise `ConfigError` with what the
daemon logs when it refuses to start. The rules they follow, from the daemons' sources:

containerd
- The CRI plugin's table depends on the file's `version`: 1 (or none) `plugins.cri`, 2
  `plugins."io.containerd.grpc.v1.cri"`, 3 `plugins."io.containerd.cri.v1.runtime"`. containerd
  2.x reads all three (it migrates older files); 1.7 knows versions 1 and 2 only, so a version 3
  file gives it the CRI defaults.
- `imports` are processed after the file that names them, each file once. 2.x makes a relative
  path relative to the importing file's directory and then expands globs (sorted); 1.7 expands a
  glob as written (relative to its working directory, `/`) and only makes plain paths relative.
- Merging: 2.x merges plugin tables key by key (a later file overrides single values and adds
  runtimes); 1.7 replaces a plugin's whole table with the last file's (an import that defines only
  the `nvidia` runtime drops `runc`, a well-known trap, hence `containerd config dump` in the
  toolkit).
- Defaults: handler `runc` (runtime_type `io.containerd.runc.v2`) as the default; `enable_cdi`
  true on 2.x (containerd PR 9621) and false on 1.7; CDI specs in `/etc/cdi` and `/var/run/cdi`.
- A default handler missing from the runtimes table makes the CRI plugin fail to load: the
  kubelet then has no runtime to talk to.

CRI-O reads `/etc/crio/crio.conf`, then every file of `/etc/crio/crio.conf.d/` in lexical order
(later values win, tables merge). Its default handler is `crun`; CDI is always on. A handler
whose `runtime_path` does not exist is ignored with a warning, except the default one, which
stops CRI-O from starting.

The NVIDIA runtime reads the `config.toml` the toolkit installs next to it
(`<dir>/.config/nvidia-container-runtime/config.toml`, else `/etc/nvidia-container-runtime/`).
"""

from __future__ import annotations

import glob
import hashlib
import posixpath
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simhost import cdi_registry

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_IN_DIR = "/etc/crio/crio.conf.d"
NVIDIA_RUNTIME_SYSTEM_CONFIG = "/etc/nvidia-container-runtime/config.toml"
CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
RUNC_TYPE = "io.containerd.runc.v2"
_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


class ConfigError(Exception):
    """A configuration the daemon refuses; the message is what it logs."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Runtime:
    """One runtime handler: its type and the OCI runtime binary ("" = found in $PATH)."""

    name: str
    runtime_type: str
    binary: str = ""


@dataclass(frozen=True)
class CriConfig:
    """What a CRI runtime serves after reading its configuration."""

    default_runtime: str
    runtimes: Mapping[str, Runtime]
    enable_cdi: bool
    cdi_spec_dirs: tuple[str, ...] = cdi_registry.DEFAULT_SPEC_DIRS
    # Node paths of the files read, in order.
    files: tuple[str, ...] = ()
    version: int = 0
    warnings: tuple[str, ...] = ()


def _host(root: Path, node_path: str) -> Path:
    return root / node_path.lstrip("/")


def _position(err: tomllib.TOMLDecodeError) -> tuple[int, int, str]:
    text = str(err)
    match = _POSITION.search(text)
    if match is None:
        return 1, 1, text
    return int(match.group(1)), int(match.group(2)), text[: match.start()]


def _read_toml(root: Path, node_path: str, modern: bool) -> dict[str, Any]:
    try:
        return tomllib.loads(_host(root, node_path).read_text())
    except tomllib.TOMLDecodeError as err:
        row, column, why = _position(err)
        if modern:
            raise ConfigError(
                f"failed to unmarshal TOML at row {row} column {column}: {why}"
            ) from None
        raise ConfigError(f"failed to load TOML: {node_path}: ({row}, {column}): {why}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"failed to load TOML: {node_path}: {err}") from None


def deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `other` into `into` table by table (single values and arrays are replaced)."""
    for key, value in other.items():
        current = into.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            deep_merge(current, value)
        elif isinstance(value, Mapping):
            into[key] = deep_merge({}, value)
        else:
            into[key] = value
    return into


def _glob(root: Path, pattern: str) -> list[str]:
    host_pattern = str(_host(root, pattern))
    prefix = str(root).rstrip("/")
    return sorted(p[len(prefix) :] or "/" for p in glob.glob(host_pattern))


def resolve_imports(root: Path, parent: str, imports: list[Any], *, modern: bool) -> list[str]:
    """Node paths of a file's imports, as the containerd version resolves them."""
    out: list[str] = []
    for item in imports:
        path = str(item)
        if modern:
            path = posixpath.normpath(path)
            if not posixpath.isabs(path):
                path = posixpath.join(posixpath.dirname(parent), path)
            out.extend(_glob(root, path) if "*" in path else [path])
        elif "*" in path:
            # 1.x globs relative to containerd's working directory, `/` under systemd.
            out.extend(_glob(root, path if posixpath.isabs(path) else "/" + path))
        else:
            path = posixpath.normpath(path)
            if not posixpath.isabs(path):
                path = posixpath.join(posixpath.dirname(parent), path)
            out.append(path)
    return out


def _cri_table(data: Mapping[str, Any], version: int, modern: bool) -> dict[str, Any] | None:
    if not modern and version > 2:
        return None  # 1.7 knows no version 3 plugin names
    plugins = data.get("plugins")
    if not isinstance(plugins, Mapping):
        return None
    table = plugins.get(CRI_PLUGIN.get(version, CRI_PLUGIN[3]))
    return dict(table) if isinstance(table, Mapping) else None


def _runtimes(raw: Any, *, kind: str) -> dict[str, Runtime]:
    runtimes: dict[str, Runtime] = {}
    if not isinstance(raw, Mapping):
        return runtimes
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            continue
        if kind == "containerd":
            options = entry.get("options")
            binary = options.get("BinaryName", "") if isinstance(options, Mapping) else ""
            runtime_type = str(entry.get("runtime_type") or RUNC_TYPE)
        else:
            binary = entry.get("runtime_path", "")
            runtime_type = str(entry.get("runtime_type") or "oci")
        runtimes[str(name)] = Runtime(str(name), runtime_type, str(binary or ""))
    return runtimes


def _spec_dirs(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, list) and raw:
        return tuple(str(d) for d in raw)
    return cdi_registry.DEFAULT_SPEC_DIRS


def load_containerd(
    root: Path, containerd_version: str, path: str = CONTAINERD_CONFIG
) -> CriConfig:
    """What containerd `containerd_version` (e.g. "2.0.5", "1.7.27") serves with the config
    at `path` on the node; ConfigError when it would not start or its CRI plugin would fail."""
    modern = major_version(containerd_version) >= 2
    pending = [path]
    loaded: list[str] = []
    table: dict[str, Any] = {}
    top_version = 0
    warnings: list[str] = []
    while pending:
        current = pending.pop(0)
        if current in loaded:
            continue
        host = _host(root, current)
        if not host.is_file():
            if modern:
                # containerd 2.x ignores a missing file and keeps what it merged so far.
                if current != path:
                    warnings.append(f"open {current}: no such file or directory")
                break
            if current == path:
                break  # 1.7 runs with its defaults when the main file is missing
            raise ConfigError(
                f"failed to load TOML: {current}: open {current}: no such file or directory"
            )
        data = _read_toml(root, current, modern)
        version = int(data.get("version") or 1)
        if not loaded:
            top_version = version
        section = _cri_table(data, version, modern)
        if section is not None:
            table = deep_merge(table, section) if modern else section
        imports = data.get("imports") or []
        loaded.append(current)
        pending.extend(resolve_imports(root, current, list(imports), modern=modern))
    containerd = table.get("containerd") if isinstance(table.get("containerd"), Mapping) else {}
    assert isinstance(containerd, Mapping)
    default = str(containerd.get("default_runtime_name") or "runc")
    runtimes = {"runc": Runtime("runc", RUNC_TYPE)}
    configured = containerd.get("runtimes")
    if configured is not None:
        # 1.7 decodes the table over its defaults' map only where the key is absent.
        runtimes = {**(runtimes if modern else {}), **_runtimes(configured, kind="containerd")}
    if default not in runtimes:
        plugin = "io.containerd.cri.v1.runtime" if modern else "io.containerd.grpc.v1.cri"
        raise ConfigError(
            f"failed to load plugin {plugin}: invalid plugin config: no corresponding runtime "
            f"configured in `containerd.runtimes` for `containerd` "
            f'`default_runtime_name = "{default}"`'
        )
    enable_cdi = table.get("enable_cdi")
    return CriConfig(
        default_runtime=default,
        runtimes=runtimes,
        enable_cdi=modern if enable_cdi is None else bool(enable_cdi),
        cdi_spec_dirs=_spec_dirs(table.get("cdi_spec_dirs")),
        files=tuple(loaded),
        version=top_version,
        warnings=tuple(warnings),
    )


def load_crio(
    root: Path, path: str = CRIO_CONFIG, drop_in_dir: str = CRIO_DROP_IN_DIR
) -> CriConfig:
    """What CRI-O serves with its main file and drop-ins on the node; ConfigError when it
    would not start."""
    files: list[str] = []
    if _host(root, path).is_file():
        files.append(path)
    drop_ins = _host(root, drop_in_dir)
    if drop_ins.is_dir():
        files += [
            posixpath.join(drop_in_dir, entry.name)
            for entry in sorted(drop_ins.iterdir())
            if entry.is_file()
        ]
    merged: dict[str, Any] = {}
    for node_path in files:
        try:
            data = tomllib.loads(_host(root, node_path).read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"failed to update config from file {node_path}: {err}") from None
        deep_merge(merged, data)
    crio = merged.get("crio") if isinstance(merged.get("crio"), Mapping) else {}
    assert isinstance(crio, Mapping)
    runtime = crio.get("runtime") if isinstance(crio.get("runtime"), Mapping) else {}
    assert isinstance(runtime, Mapping)
    default = str(runtime.get("default_runtime") or "crun")
    runtimes = {default: Runtime(default, "oci")}
    runtimes.update(_runtimes(runtime.get("runtimes"), kind="crio"))
    warnings: list[str] = []
    for name, handler in list(runtimes.items()):
        if not handler.binary.startswith("/") or _host(root, handler.binary).exists():
            continue
        why = (
            f"invalid runtime_path for runtime '{name}': "
            f'"stat {handler.binary}: no such file or directory"'
        )
        if name == default:
            raise ConfigError(f"validating runtime config: runtime validation: {why}")
        warnings.append(f'Runtime handler "{name}" is being ignored due to: {why}')
        del runtimes[name]
    return CriConfig(
        default_runtime=default,
        runtimes=runtimes,
        enable_cdi=True,
        cdi_spec_dirs=_spec_dirs(runtime.get("cdi_spec_dirs")),
        files=tuple(files),
        warnings=tuple(warnings),
    )


def crio_runtime_list(runtimes: Mapping[str, Runtime]) -> str:
    """CRI-O prints its handler table as a Go map of pointers: `map[crun:0xc000... ]`."""
    items = []
    for name in sorted(runtimes):
        offset = int(hashlib.sha256(name.encode()).hexdigest()[:6], 16) * 16
        items.append(f"{name}:0x{0xC000000000 + offset:x}")
    return "map[" + " ".join(items) + "]"


@dataclass(frozen=True)
class NvidiaRuntimeConfig:
    """The NVIDIA container runtime's settings that decide what it injects."""

    mode: str = "auto"
    default_kind: str = "nvidia.com/gpu"
    annotation_prefixes: tuple[str, ...] = ("cdi.k8s.io/",)
    spec_dirs: tuple[str, ...] = cdi_registry.DEFAULT_SPEC_DIRS
    # `[nvidia-container-cli] root`: where the legacy hook finds the driver's files.
    driver_root: str = "/"
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def nvidia_runtime_config_path(binary: str) -> str:
    """Where the toolkit installs the runtime's own config, beside the binary."""
    return posixpath.join(
        posixpath.dirname(binary), ".config", "nvidia-container-runtime", "config.toml"
    )


def load_nvidia_runtime(root: Path, binary: str) -> NvidiaRuntimeConfig:
    """The NVIDIA runtime's config for a binary on the node (defaults without a file)."""
    for candidate in (nvidia_runtime_config_path(binary), NVIDIA_RUNTIME_SYSTEM_CONFIG):
        host = _host(root, candidate)
        if not host.is_file():
            continue
        try:
            data = tomllib.loads(host.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"error loading config {candidate}: {err}") from None
        runtime = data.get("nvidia-container-runtime") or {}
        modes = (runtime.get("modes") or {}).get("cdi") or {}
        cli = data.get("nvidia-container-cli") or {}
        return NvidiaRuntimeConfig(
            mode=str(runtime.get("mode") or "auto"),
            default_kind=str(modes.get("default-kind") or "nvidia.com/gpu"),
            annotation_prefixes=tuple(modes.get("annotation-prefixes") or ("cdi.k8s.io/",)),
            spec_dirs=tuple(modes.get("spec-dirs") or cdi_registry.DEFAULT_SPEC_DIRS),
            driver_root=str(cli.get("root") or "/"),
            path=candidate,
        )
    return NvidiaRuntimeConfig()


def major_version(version: str) -> int:
    """The major version of `2.0.5` / `v1.7.27` / `containerd://2.0.5`."""
    return version_tuple(version)[0]


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a runtime version string; ValueError when it has none."""
    text = version.rsplit("//", 1)[-1].lstrip("v")
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"expected a version like 2.0.5, got {version!r}")
    return int(match.group(1)), int(match.group(2))
