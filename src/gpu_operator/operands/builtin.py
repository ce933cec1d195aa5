"""Operand containers that run our image: what each builtin agent needs on a real node.

A values section pointed at the operator image (the chart's `agents.builtin` / `<section>.builtin`,
or a ClusterPolicy naming that image) runs our agent under NVIDIA's entry-point name
(`agents/entrypoints.py`). The pod template is NVIDIA's, written for NVIDIA's images, which run as
root and set the NVIDIA runtime's variables in their own image; ours runs as UID 65532 (for the
operator) and sets neither. So every container running our image gets, on top of the template:

- `runAsUser: 0`, `runAsGroup: 0`: node agents act on root-owned host files and devices (R3 in
  the real-NVML review); the privileges the template grants stay as upstream's (NVIDIA's
  containers are privileged for the same reasons), except where ours needs none (`NEEDS`);
- the NVIDIA runtime's variables where the agent reads GPUs through it and NVIDIA's image sets
  them (R2): `NVIDIA_VISIBLE_DEVICES=all`, `NVIDIA_DRIVER_CAPABILITIES=utility`;
- a command where NVIDIA's template has none and relies on its image's entrypoint (the exporter).

The operator image is the operator's own `OPERATOR_IMAGE` (the chart sets it); images are
compared without tag or digest, so another version of our image counts too. Without
`OPERATOR_IMAGE` nothing is recognised as ours and templates stay NVIDIA's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_operator.operands import podspec
from gpu_operator.operands.facts import ClusterFacts

OPERATOR_IMAGE_ENV = "OPERATOR_IMAGE"
ROOT = {"runAsUser": 0, "runAsGroup": 0}
# Root without any capability: enough to write an emptyDir and signal a process of the same user.
ROOT_UNPRIVILEGED = {
    **ROOT,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
NVML_ENV = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "utility"))


@dataclass(frozen=True)
class Needs:
    """What one builtin agent's container gets when it runs our image, and why."""

    agent: str
    why: str
    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    # True: the template's own securityContext (privileged, as upstream's) plus root;
    # False: root with every capability dropped (the template grants none either).
    keep_privileges: bool = True


_PLUGIN = Needs(
    "device plugin",
    "root: its socket goes into the kubelet's device-plugins directory (root, 0750) and NVML's "
    "MIG instance lookups need a privileged user; privileged (as upstream) for the device nodes "
    "it checks and hands out",
)
_CONFIG_MANAGER = Needs(
    "config manager",
    "root without capabilities: it writes the config symlink into an emptyDir and signals the "
    "plugin or GFD process, which runs as root (same user: no CAP_KILL needed); no NVML, no host",
    keep_privileges=False,
)
_MPS = Needs(
    "MPS control daemon",
    "root, privileged (as upstream): it mounts a tmpfs at <mps root>/shm (CAP_SYS_ADMIN) and "
    "starts nvidia-cuda-mps-control for the GPUs, which needs the device nodes",
)
_GFD = Needs(
    "GPU feature discovery",
    "root: NVML's MIG instance and memory queries need a privileged user; NVML through the NVIDIA "
    "runtime, so NVIDIA_VISIBLE_DEVICES/NVIDIA_DRIVER_CAPABILITIES as NVIDIA's image sets them; "
    "privileged as upstream",
    env=NVML_ENV,
)
_EXPORTER = Needs(
    "GPU metrics exporter",
    "root: the kubelet's pod-resources socket is root's, and NVML's per-process and MIG reads "
    "need a privileged user; NVML through the NVIDIA runtime (its variables, as NVIDIA's image "
    "sets them); the command, because NVIDIA's template relies on its image's entrypoint",
    command=("dcgm-exporter",),
    env=NVML_ENV,
)
_MIG = Needs(
    "MIG manager",
    "root, privileged (as upstream): MIG create/destroy needs the mig/config capability (root "
    "only), mode changes and GPU resets need root, and it stops host services through "
    "chroot /host systemctl; NVML and nvidia-smi through the NVIDIA runtime (its variables)",
    env=NVML_ENV,
)
_NODE_STATUS = Needs(
    "node status exporter",
    "root, privileged (as upstream): it reads the validator's markers and checks the driver with "
    "NVML loaded from the driver root it mounts (/run/nvidia/driver), which needs the device nodes",
)
_VALIDATOR = Needs(
    "validator",
    "root (as upstream's validation containers): it runs the driver's nvidia-smi in the driver "
    "root, writes and (preStop) removes root-owned markers under /run/nvidia/validations",
)
_DRIVER_MANAGER = Needs(
    "driver manager",
    "root, privileged (as upstream): it unloads kernel modules and unmounts the driver root on "
    "the host, and evicts GPU pods through the API",
)
_VFIO = Needs(
    "VFIO manager",
    "root, privileged (as upstream): it binds GPUs to vfio-pci through the host's sysfs",
)
_VGPU_DM = Needs(
    "vGPU device manager",
    "root, privileged (as upstream): it creates and removes vGPUs through the host's sysfs",
)
_SANDBOX_PLUGIN = Needs(
    "sandbox device plugin",
    "root, privileged (as upstream): its socket goes into the kubelet's device-plugins directory "
    "and it hands out /dev/vfio devices",
)
_TOOLKIT = Needs(
    "container toolkit",
    "root, privileged (as upstream): it installs the runtime under the host's /usr/local/nvidia, "
    "edits the host's runtime config, signals the runtime (hostPID) and loads NVML from the "
    "driver root for the management CDI spec",
)
_GUARD = Needs(
    "runtime-config guard",
    "root without privileges but SYS_CHROOT: it copies and restores the host's runtime config "
    "files (root's, through hostPath mounts) and restarts the runtime by a signal (same user, "
    "hostPID) or chroot /host systemctl",
    keep_privileges=False,
)

# By container name (the operand templates' names, upstream's).
NEEDS: Mapping[str, Needs] = {
    "nvidia-device-plugin": _PLUGIN,
    "config-manager": _CONFIG_MANAGER,
    "config-manager-init": _CONFIG_MANAGER,
    "mps-control-daemon-mounts": _MPS,
    "mps-control-daemon-ctr": _MPS,
    "gpu-feature-discovery": _GFD,
    "nvidia-dcgm-exporter": _EXPORTER,
    "nvidia-dcgm-exporter-dra": _EXPORTER,  # a GPUCluster's (operands/dra_driver.py)
    "nvidia-mig-manager": _MIG,
    "nvidia-node-status-exporter": _NODE_STATUS,
    "nvidia-operator-validator": _VALIDATOR,
    "nvidia-sandbox-validator": _VALIDATOR,
    "k8s-driver-manager": _DRIVER_MANAGER,
    "nvidia-vfio-manager": _VFIO,
    "nvidia-vgpu-device-manager": _VGPU_DM,
    "nvidia-sandbox-device-plugin-ctr": _SANDBOX_PLUGIN,
    "nvidia-container-toolkit-ctr": _TOOLKIT,
    "runtime-config-save": _GUARD,
    "runtime-config-guard": _GUARD,
}
# The validation init containers (`driver-validation`, `toolkit-validation`, `vfio-pci-...`).
VALIDATION = _VALIDATOR
GUARD_CAPABILITIES = ("SYS_CHROOT",)


def image_name(ref: str) -> str:
    """An image reference without digest or tag (`registry:5000/a/b:v1` -> `registry:5000/a/b`)."""
    name = ref.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def operator_image(facts: ClusterFacts) -> str | None:
    value = facts.operator_env.get(OPERATOR_IMAGE_ENV, "").strip()
    return value or None


def runs_ours(image: str, facts: ClusterFacts) -> bool:
    """Whether `image` is the operator image (any tag or digest)."""
    ours = operator_image(facts)
    return bool(ours and image and image_name(image) == image_name(ours))


def needs_for(name: str) -> Needs | None:
    if name in NEEDS:
        return NEEDS[name]
    if "validation" in name:
        return VALIDATION
    return None


def apply(ds: podspec.Obj, facts: ClusterFacts) -> None:
    """Give every container of `ds` that runs our image what its agent needs (see above)."""
    if operator_image(facts) is None:
        return
    for ctr in podspec.all_containers(ds):
        if not runs_ours(str(ctr.get("image", "")), facts):
            continue
        needs = needs_for(str(ctr["name"]))
        security = dict(ctr.get("securityContext") or {})
        if needs is not None and not needs.keep_privileges:
            security.pop("privileged", None)
            security.update(ROOT_UNPRIVILEGED)
            if needs is _GUARD:
                security["capabilities"] = {"drop": ["ALL"], "add": list(GUARD_CAPABILITIES)}
        else:
            security.update(ROOT)
        ctr["securityContext"] = security
        if needs is None:
            continue
        if needs.command is not None and not ctr.get("command"):
            ctr["command"] = list(needs.command)
        for name, value in needs.env:
            if podspec.get_env(ctr, name) is None:
                podspec.set_env(ctr, name, value)
