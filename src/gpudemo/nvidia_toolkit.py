"""NVIDIA's container toolkit as it behaves, for demo nodes whose toolkit pod runs NVIDIA's image
(`--nvidia-toolkit`; by default the demo runs our toolkit agent in every toolkit pod).

What it does, as NVIDIA's `nvidia-ctk-installer` does on containerd: it installs the runtime
(stand-in binaries here), writes the management CDI spec, then reads `/etc/containerd/config.toml`,
adds its runtimes (`nvidia`, `nvidia-cdi`, `nvidia-legacy`, the default runtime when asked) and
writes the file back re-serialised (comments, quoting and layout are lost), and restarts
containerd. When its pod stops it does not bring the original back: this is the behaviour AKS's
guide warns about, which the runtime-config guard (`agents/container_toolkit/guard.py`) answers.
Only containerd is simulated; CRI-O and Docker nodes run our agent.
"""

from __future__ import annotations

import logging
import tomllib

from gpu_operator.agents.container_toolkit import containerd as ctk_containerd
from gpu_operator.agents.container_toolkit import runner, settings
from gpu_operator.agents.container_toolkit import tomltext as tt
from gpu_operator.nvml import mock
from gpudemo import install
from gpudemo import toolkit as toolkit_demo
from kubesim import PodContext
from simhost import containerd

log = logging.getLogger("gpu_operator.demo.nvidia_toolkit")


def is_ours(image: str) -> bool:
    """Whether a container runs the operator image (any tag)."""
    repository = image.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return repository == install.OPERATOR_IMAGE


def handles(ctx: PodContext, runtime: containerd.SimulatedRuntime | None) -> bool:
    """A toolkit container of NVIDIA's image on a containerd node."""
    return (
        toolkit_demo.handles(ctx)
        and not is_ours(str(ctx.container.get("image", "")))
        and isinstance(runtime, containerd.SimulatedContainerd)
    )


def rewrite(text: str, s: settings.Settings) -> str:
    """The config with NVIDIA's runtimes added, re-serialised as NVIDIA's toolkit writes it."""
    data = tomllib.loads(text) if text.strip() else {}
    version = ctk_containerd.detect_version(data, text, s.config_host, template=False)
    plugin = ctk_containerd.CRI_PLUGIN[version]
    options = ctk_containerd.Options(
        s.handlers(), enable_cdi=s.enable_cdi_in_runtime, runtime_type=s.runtime_type
    )
    cri = ctk_containerd._cri(data, plugin)
    tree = ctk_containerd._merge(cri, ctk_containerd._settings(cri, options, version))
    data.setdefault("plugins", {})[plugin] = tree
    if "version" not in data:
        data = {"version": version, **data}
    return tt.dumps(data)


async def run(
    ctx: PodContext,
    machine: mock.MockMachine | None,
    runtime: containerd.SimulatedRuntime | None,
) -> int:
    try:
        s = settings.from_env(toolkit_demo.environment(ctx))
    except settings.SettingsError as err:
        log.error("nvidia-ctk-installer: %s", err)
        return 2
    agent = runner.Agent(
        s,
        restarter=toolkit_demo.RuntimeRestarter(
            runtime, s.restart_mode, runner.SERVICES[s.runtime]
        ),
        view=toolkit_demo._view(ctx),
        open_nvml=machine.nvml if machine is not None else toolkit_demo._no_gpus,
        stand_ins=True,
        sys_root=ctx.node_root,
    )
    log.info("Starting nvidia-ctk-installer (NVIDIA's toolkit, simulated): runtime %s", s.runtime)
    agent.install()
    agent.generate_cdi()
    config = ctx.path(s.config)
    before = config.read_text() if config.exists() else ""
    config.write_text(rewrite(before, s))
    log.info("Wrote updated config to %s (in place)", s.config_host)
    await agent.restart()
    ctx.set_ready(True)
    log.info("Waiting for signal")
    await ctx.stopping.wait()
    # NVIDIA's installer leaves the rewritten config behind: nothing brings the original back.
    log.info("Shutting down (the runtime config is left as written)")
    return 0
