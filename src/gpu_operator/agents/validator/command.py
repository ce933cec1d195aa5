"""The validator's settings from upstream's environment variables (the same names as its flags'
env sources), and one run with the real container and API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping

from gpu_operator.agents.validator import components, host, runner, workload

log = logging.getLogger("gpu_operator.agents.validator")

# Upstream's defaults, and the bounds we add to its unbounded waits.
DEFAULTS = {
    "OUTPUT_DIR": components.VALIDATIONS_DIR,
    "SLEEP_INTERVAL_SECONDS": "5",
    "WITH_WAIT": "false",
    "WITH_WORKLOAD": "true",
    "MIG_STRATEGY": "single",
    "HOST_ROOT": "/",
    "DRIVER_INSTALL_DIR": "/run/nvidia/driver",
    "DRIVER_INSTALL_DIR_CTR_PATH": "/run/nvidia/driver",
    "WITH_WAIT_RETRIES": "60",
    "POD_CREATION_WAIT_RETRIES": "60",
    "POD_CREATION_SLEEP_INTERVAL_SECONDS": "5",
    "GPU_RESOURCE_DISCOVERY_WAIT_RETRIES": "30",
    "GPU_RESOURCE_DISCOVERY_INTERVAL_SECONDS": "5",
    "TERMINATION_MESSAGE_PATH": "/dev/termination-log",
}
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off", "")


class SettingsError(ValueError):
    """An environment variable with a value the validator cannot use (names it)."""


def _value(env: Mapping[str, str], name: str) -> str:
    return str(env.get(name, DEFAULTS.get(name, ""))).strip()


def _bool(env: Mapping[str, str], name: str) -> bool:
    value = _value(env, name).lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name}: expected true or false, got {env.get(name)!r}")


def _number(env: Mapping[str, str], name: str, *, integer: bool = False) -> float:
    raw = _value(env, name)
    try:
        number = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number of seconds"
        raise SettingsError(f"{name}: expected {kind}, got {raw!r}") from None
    if number < 0 or (integer and number < 1):
        raise SettingsError(f"{name}: expected a positive value, got {raw!r}")
    return number


def settings_from(env: Mapping[str, str]) -> runner.Settings:
    """Settings from upstream's env names (COMPONENT, WITH_WAIT, NODE_NAME, ...)."""
    secrets = tuple(s.strip() for s in _value(env, "VALIDATOR_IMAGE_PULL_SECRETS").split(","))
    return runner.Settings(
        component=_value(env, "COMPONENT"),
        node_name=_value(env, "NODE_NAME"),
        namespace=_value(env, "OPERATOR_NAMESPACE"),
        with_wait=_bool(env, "WITH_WAIT"),
        with_workload=_bool(env, "WITH_WORKLOAD"),
        output_dir=_value(env, "OUTPUT_DIR"),
        cleanup_all=_bool(env, "CLEANUP_ALL"),
        mig_strategy=_value(env, "MIG_STRATEGY"),
        host_root=_value(env, "HOST_ROOT"),
        driver_install_dir=_value(env, "DRIVER_INSTALL_DIR"),
        driver_install_dir_ctr_path=_value(env, "DRIVER_INSTALL_DIR_CTR_PATH"),
        disable_dev_char_symlinks=_bool(env, "DISABLE_DEV_CHAR_SYMLINK_CREATION"),
        skip_gpu_init=_bool(env, "DRIVER_VALIDATION_SKIP_GPU_INIT"),
        skip_validation=_bool(env, "SKIP_VALIDATION"),
        gpu_direct_rdma=_bool(env, "GPU_DIRECT_RDMA_ENABLED"),
        use_host_mofed=_bool(env, "USE_HOST_MOFED"),
        workload=workload.WorkloadSpec(
            image=_value(env, "VALIDATOR_IMAGE"),
            pull_policy=_value(env, "VALIDATOR_IMAGE_PULL_POLICY"),
            pull_secrets=tuple(s for s in secrets if s),
            runtime_class=_value(env, "VALIDATOR_RUNTIME_CLASS"),
        ),
        sleep_interval=_number(env, "SLEEP_INTERVAL_SECONDS"),
        wait_retries=int(_number(env, "WITH_WAIT_RETRIES", integer=True)),
        pod_retries=int(_number(env, "POD_CREATION_WAIT_RETRIES", integer=True)),
        pod_interval=_number(env, "POD_CREATION_SLEEP_INTERVAL_SECONDS"),
        resource_retries=int(_number(env, "GPU_RESOURCE_DISCOVERY_WAIT_RETRIES", integer=True)),
        resource_interval=_number(env, "GPU_RESOURCE_DISCOVERY_INTERVAL_SECONDS"),
    )


def execute(env: Mapping[str, str], kubeconfig: str | None = None) -> int:
    """Run one validation in this process's container; the exit code."""
    try:
        settings = settings_from(env)
    except SettingsError as err:
        log.error("validator: %s", err)
        return runner.EXIT_USAGE
    container = host.LocalContainer(_value(env, "TERMINATION_MESSAGE_PATH"))
    return asyncio.run(_run(settings, container, kubeconfig))


async def _run(
    settings: runner.Settings, container: host.LocalContainer, kubeconfig: str | None
) -> int:
    from gpu_operator.kube import client as kube_client
    from gpu_operator.kube import validator_api

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    cluster: validator_api.ValidatorApi | None = None
    try:
        cluster = validator_api.ValidatorApi(kube_client.connect(kubeconfig))
    except Exception as err:  # outside a cluster the file and program checks still work
        log.warning("validator: no Kubernetes API (%s)", err)
    try:
        return await runner.Validator(settings, container, cluster, stop).run()
    finally:
        if cluster is not None:
            await cluster.close()
