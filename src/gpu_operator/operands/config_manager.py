"""The config-manager init container and sidecar shared by the device plugin, GFD and MPS daemon.

They pick a named config from the ConfigMap `devicePlugin.config.name` by the node label
`nvidia.com/device-plugin.config` and signal the operand when the choice changes.
"""

from __future__ import annotations

from gpu_operator import api
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj, container, env, mount, set_env

INIT = "config-manager-init"
SIDECAR = "config-manager"
CONFIG_FILE = "/config/config.yaml"
AVAILABLE_DIR = "/available-configs"
NODE_LABEL = "nvidia.com/device-plugin.config"
# The config manager reports a config it refuses as an Event on the node (in this namespace).
EVENTS_RULE = common.rule([""], ["events"], ("create",))


def containers(process_to_signal: str) -> tuple[Obj, Obj]:
    """The init (one-shot) and sidecar (watching) config-manager containers, image unset."""

    def build(name: str, oneshot: bool) -> Obj:
        return container(
            name,
            command=["config-manager"],
            env_vars=[
                env("ONESHOT", str(oneshot).lower()),
                env("KUBECONFIG", ""),
                common.node_name_env(),
                env("NODE_LABEL", NODE_LABEL),
                env("CONFIG_FILE_SRCDIR", AVAILABLE_DIR),
                env("CONFIG_FILE_DST", CONFIG_FILE),
                env("DEFAULT_CONFIG", ""),
                env("FALLBACK_STRATEGIES", "empty"),
                env("SEND_SIGNAL", str(not oneshot).lower()),
                env("SIGNAL", "1"),
                env("PROCESS_TO_SIGNAL", process_to_signal),
            ],
            mounts=[mount("available-configs", AVAILABLE_DIR), mount("config", "/config")],
        )

    return build(INIT, True), build(SIDECAR, False)


def wire(ds: Obj, policy: api.ClusterPolicy, main: Obj) -> None:
    """Keep and fill the config-manager containers when a config is named, else drop them."""
    config = policy.spec.devicePlugin.config
    if config is None or not config.name:
        common.remove_container(ds, INIT)
        common.remove_container(ds, SIDECAR)
        return
    for name in (INIT, SIDECAR):
        ctr = common.find_container(ds, name)
        assert ctr is not None
        ctr["image"] = main["image"]
        ctr["imagePullPolicy"] = main["imagePullPolicy"]
        set_env(ctr, "DEFAULT_CONFIG", config.default or "")
    set_env(main, "CONFIG_FILE", CONFIG_FILE)
    common.add_mount(main, mount("config", "/config"))
    # The symlink /config/config.yaml points into /available-configs, so the operand needs
    # both mounts to read it (as upstream's shared config mounts give it).
    common.add_mount(main, mount("available-configs", AVAILABLE_DIR))
    common.add_volume(ds, {"name": "config", "emptyDir": {}})
    common.add_volume(ds, {"name": "available-configs", "configMap": {"name": config.name}})
    pod = common.pod_spec(ds)
    # The sidecar signals the operand's process, so the pod shares one PID namespace (unless
    # it already shares the host's).
    if not pod.get("hostPID"):
        pod["shareProcessNamespace"] = True
