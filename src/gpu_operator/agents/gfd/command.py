"""Wire GFD from command-line options: config precedence, backend, sink, then the loop.

Precedence is upstream's: an explicitly set flag or env var beats the config file, which beats
the defaults. Errors the user can fix (unknown machine, bad config) exit 2 with one line.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents import mock_backend
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import output, runner
from gpu_operator.agents.gfd import vgpu as gfd_vgpu
from gpu_operator.agents.gfd.facts import VgpuFacts

log = logging.getLogger("gpu_operator.agents.gfd")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


@dataclass
class Options:
    """The command line as given; None means "not set", so the config file decides."""

    backend: str = "nvml"
    machine: str | None = None
    machine_file: Path | None = None
    seed: int | None = None
    config_file: Path | None = None
    oneshot: bool | None = None
    no_timestamp: bool | None = None
    sleep_interval: str | None = None
    output: str | None = None
    machine_type_file: str | None = None
    mig_strategy: str | None = None
    fail_on_init_error: bool | None = None
    use_node_feature_api: bool | None = None
    node_labels: bool = False
    node_name: str | None = None
    namespace: str | None = None
    pod_name: str | None = None
    kubeconfig: Path | None = None


def _overrides(o: Options) -> dict[str, object]:
    pairs: dict[str, object | None] = {
        "flags.migStrategy": o.mig_strategy,
        "flags.failOnInitError": o.fail_on_init_error,
        "flags.useNodeFeatureAPI": o.use_node_feature_api,
        "flags.gfd.oneshot": o.oneshot,
        "flags.gfd.noTimestamp": o.no_timestamp,
        "flags.gfd.sleepInterval": o.sleep_interval,
        "flags.gfd.outputFile": o.output,
        "flags.gfd.machineTypeFile": o.machine_type_file,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def build_settings(o: Options) -> runner.Settings:
    """The effective config (file + overrides); ConfigError names the bad field."""
    base = pc.load(o.config_file) if o.config_file is not None else pc.PluginConfig()
    overrides = _overrides(o)
    config = runner.apply_overrides(base, overrides)
    return runner.Settings(config=config, config_path=o.config_file, overrides=overrides)


def open_backend(o: Options, settings: runner.Settings) -> Callable[[], nvml.Nvml]:
    """A factory for the chosen NVML backend; fills in machine facts for mock machines."""
    if o.backend == "mock":
        try:
            machine = mock_backend.machine(o.machine, o.machine_file, o.seed)
        except mock_backend.MachineChoiceError as err:
            raise UsageError(str(err)) from None
        if o.machine_type_file is None:
            settings.machine_type = machine.spec.product_name or "unknown"
        vg = machine.spec.vgpu
        if vg is not None:
            settings.vgpu = VgpuFacts(vg.host_driver_version, vg.host_driver_branch)
        return machine.nvml
    if o.backend == "nvml":
        if o.machine is not None or o.machine_file is not None:
            raise UsageError("--machine and --machine-file need --backend mock")
        from gpu_operator.nvml import real

        settings.vgpu = gfd_vgpu.probe()
        return real.RealNvml
    raise UsageError(f"--backend: unknown backend {o.backend!r} (expected nvml or mock)")


def open_sink(o: Options, settings: runner.Settings) -> output.Sink:
    """stdout / file when `--output` is given, else node labels or NodeFeature, else the file."""
    flags = settings.config.flags
    target = flags.gfd.output_file
    if o.output is None and (o.node_labels or flags.use_node_feature_api):
        from gpu_operator.kube import node_features

        if not o.node_name:
            raise UsageError("NODE_NAME (--node-name) is required to write labels to the API")
        api = node_features.client(o.kubeconfig)
        if o.node_labels:
            return node_features.NodeLabelWriter(api, o.node_name)
        if not o.namespace:
            raise UsageError("NAMESPACE (--namespace) is required for the NodeFeature object")
        return _NodeFeatureSink(api, o.node_name, o.namespace, o.pod_name)
    if target in ("", "-"):
        return output.StdoutSink()
    return output.FileSink(target)


class _NodeFeatureSink:
    """Resolves owner references lazily (it needs the API) before the first write."""

    def __init__(self, api: object, node: str, namespace: str, pod: str | None) -> None:
        from gpu_operator.kube import node_features

        self._nf = node_features
        self._writer = node_features.NodeFeatureWriter(api, node, namespace)  # type: ignore[arg-type]
        self._pod = pod

    async def write(self, labels: dict[str, str]) -> None:
        if self._pod is not None:
            self._writer.owners = await self._nf.owner_references(
                self._writer.api, self._writer.namespace, self._pod
            )
            self._pod = None
        await self._writer.write(labels)

    async def remove(self) -> None:
        await self._writer.remove()


def execute(o: Options) -> int:
    """Run GFD for `o`; returns the process exit status."""
    try:
        settings = build_settings(o)
        open_nvml = open_backend(o, settings)
        sink = open_sink(o, settings)
    except (UsageError, pc.ConfigError) as err:
        print(f"gpu-feature-discovery: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(runner.run(open_nvml, sink, settings))
    except (runner.InitFailed, runner.CollectFailed) as err:
        print(f"gpu-feature-discovery: {err}", file=sys.stderr)
        return EXIT_FAILED
    except pc.ConfigError as err:  # a SIGHUP reload found a bad file
        print(f"gpu-feature-discovery: {err}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:
        log.debug("GFD failed", exc_info=True)
        print(f"gpu-feature-discovery: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
