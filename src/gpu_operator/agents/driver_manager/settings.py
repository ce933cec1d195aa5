"""The driver manager's environment, read as upstream's `k8s-driver-manager` reads it. Pure.

Upstream parses booleans like Go's `strconv.ParseBool` (an empty value is false) and
`DRAIN_TIMEOUT_SECONDS` as a Go duration (`300s`, `5m`, `1h30m`; a bare `0` is the only value
without a unit), despite its name. The `DRIVER_MANAGER_*` names are ours: upstream hard-codes
those waits (5 minutes per operand, 5 s polls, 60 s before exiting on a preinstalled driver, no
limit for MOFED). A bad value is a `SettingsError` naming the variable; nothing is done then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_operator.upgrade import selectors as selector_mod

DEFAULT_NAMESPACE = "gpu-operator"
# Go's strconv.ParseBool spellings.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# Go's time.ParseDuration units, in seconds.
_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([^0-9.]*)")
# A qualified label key: an optional DNS-subdomain prefix and a name of at most 63 characters.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SettingsError(ValueError):
    """An environment variable holds a value the driver manager cannot use (one line)."""


@dataclass(frozen=True)
class Settings:
    """Upstream's env contract with its defaults, plus our bounded-wait knobs (seconds)."""

    node_name: str
    enable_auto_drain: bool = True
    enable_gpu_pod_eviction: bool = True
    drain_use_force: bool = False
    drain_pod_selector: str = ""
    drain_timeout: float = 0.0  # 0: no limit
    drain_delete_emptydir_data: bool = False
    operator_namespace: str = DEFAULT_NAMESPACE
    node_label_for_gpu_pod_eviction: str = ""
    gpu_direct_rdma_enabled: bool = False
    use_host_mofed: bool = False
    kubeconfig: str = ""
    force_reinstall: bool = False
    driver_config_digest: str = ""
    # Ours (DRIVER_MANAGER_*).
    operand_wait_timeout: float = 300.0
    poll_interval: float = 5.0
    preinstalled_exit_delay: float = 60.0
    mofed_wait_timeout: float = 0.0  # 0: no limit, as upstream


def parse_bool(name: str, value: str) -> bool:
    """A Go `strconv.ParseBool` value; empty means false (as upstream's CLI library reads it)."""
    if value == "" or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise SettingsError(f"{name}: {value!r} is not a boolean (use true or false)")


def parse_duration(name: str, value: str) -> float:
    """A Go `time.ParseDuration` value in seconds (`90s`, `5m`, `1h30m`, `1.5h`, `0`)."""
    hint = "a Go duration such as 300s, 5m or 1h30m; 0 for no limit"
    text = value.strip()
    if text in ("0", "+0"):
        return 0.0
    if text.startswith("-"):
        raise SettingsError(f"{name}: {value!r} is negative ({hint})")
    text = text.removeprefix("+")
    if not text:
        raise SettingsError(f"{name}: {value!r} is not a duration ({hint})")
    total = 0.0
    position = 0
    while position < len(text):
        match = _DURATION_PART.match(text, position)
        assert match is not None  # the pattern matches the empty string
        number, unit = match.groups()
        if not number.strip(".") or match.end() == position:
            raise SettingsError(f"{name}: {value!r} is not a duration ({hint})")
        if not unit:
            raise SettingsError(f"{name}: {value!r} has no unit ({hint})")
        if unit not in _UNITS:
            raise SettingsError(f"{name}: unknown unit {unit!r} in {value!r} ({hint})")
        total += float(number) * _UNITS[unit]
        position = match.end()
    return total


def format_duration(seconds: float) -> str:
    """Seconds as a short Go-style duration (`5m0s`, `30s`, `1.5s`), or `no limit` for 0."""
    if seconds <= 0:
        return "no limit"
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


def check_label_key(name: str, key: str) -> None:
    """A label key the API server accepts (`prefix/name`), else SettingsError."""
    prefix, _, label = key.rpartition("/")
    if (
        not _LABEL_NAME.match(label)
        or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)))
        or (not prefix and "/" in key)
    ):
        raise SettingsError(f"{name}: {key!r} is not a valid label key (e.g. example.com/gpu-app)")


def parse(env: Mapping[str, str], defaults: Settings | None = None) -> Settings:
    """Settings from the environment; `defaults` supplies the values of unset variables."""
    base = defaults or Settings(node_name="")
    node_name = env.get("NODE_NAME", base.node_name).strip()
    if not node_name:
        raise SettingsError(
            "NODE_NAME is required: the node this pod runs on (fieldRef spec.nodeName)"
        )

    def flag(key: str, default: bool) -> bool:
        return parse_bool(key, env[key]) if key in env else default

    def duration(key: str, default: float) -> float:
        # An empty value keeps the default, as upstream's CLI library does for durations.
        return parse_duration(key, env[key]) if env.get(key, "") != "" else default

    pod_selector = env.get("DRAIN_POD_SELECTOR_LABEL", base.drain_pod_selector).strip()
    try:
        selector_mod.parse(pod_selector)
    except selector_mod.SelectorError as err:
        raise SettingsError(f"DRAIN_POD_SELECTOR_LABEL: {err}") from None
    custom_label = env.get(
        "NODE_LABEL_FOR_GPU_POD_EVICTION", base.node_label_for_gpu_pod_eviction
    ).strip()
    if custom_label:
        check_label_key("NODE_LABEL_FOR_GPU_POD_EVICTION", custom_label)
    poll = duration("DRIVER_MANAGER_POLL_INTERVAL", base.poll_interval)
    if poll <= 0:
        raise SettingsError("DRIVER_MANAGER_POLL_INTERVAL: must be more than 0 (e.g. 5s)")
    return Settings(
        node_name=node_name,
        enable_auto_drain=flag("ENABLE_AUTO_DRAIN", base.enable_auto_drain),
        enable_gpu_pod_eviction=flag("ENABLE_GPU_POD_EVICTION", base.enable_gpu_pod_eviction),
        drain_use_force=flag("DRAIN_USE_FORCE", base.drain_use_force),
        drain_pod_selector=pod_selector,
        drain_timeout=duration("DRAIN_TIMEOUT_SECONDS", base.drain_timeout),
        drain_delete_emptydir_data=flag(
            "DRAIN_DELETE_EMPTYDIR_DATA", base.drain_delete_emptydir_data
        ),
        # Upstream would use an empty namespace as "all namespaces"; the default is meant.
        operator_namespace=env.get("OPERATOR_NAMESPACE", "").strip() or base.operator_namespace,
        node_label_for_gpu_pod_eviction=custom_label,
        gpu_direct_rdma_enabled=flag("GPU_DIRECT_RDMA_ENABLED", base.gpu_direct_rdma_enabled),
        use_host_mofed=flag("USE_HOST_MOFED", base.use_host_mofed),
        kubeconfig=env.get("KUBECONFIG", base.kubeconfig),
        force_reinstall=flag("FORCE_REINSTALL", base.force_reinstall),
        driver_config_digest=env.get("DRIVER_CONFIG_DIGEST", base.driver_config_digest).strip(),
        operand_wait_timeout=duration(
            "DRIVER_MANAGER_OPERAND_WAIT_TIMEOUT", base.operand_wait_timeout
        ),
        poll_interval=poll,
        preinstalled_exit_delay=duration(
            "DRIVER_MANAGER_PREINSTALLED_EXIT_DELAY", base.preinstalled_exit_delay
        ),
        mofed_wait_timeout=duration("DRIVER_MANAGER_MOFED_WAIT_TIMEOUT", base.mofed_wait_timeout),
    )
