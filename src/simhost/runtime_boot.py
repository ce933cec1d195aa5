"""The container runtime a simulated node boots with: its original configuration and binaries.

Each node image brings its runtime already configured, with sections only the node owns: the
CNI plugin and config directories, the registry host configs (`config_path =
"/etc/containerd/certs.d"`), runc's `SystemdCgroup = true`, the sandbox (pause) image. The GPU
Operator's toolkit adds its handlers next to these and must leave them byte for byte as they
were (`ORIGINALS` has the exact bytes so tests can compare). Layouts:

- containerd 2.x: `/etc/containerd/config.toml` version 3 (`io.containerd.cri.v1.*` plugins), in
  the single-quoted style `containerd config default` prints;
- containerd 1.7: version 2 (`io.containerd.grpc.v1.cri`);
- CRI-O: `/etc/crio/crio.conf` plus the packaged `/etc/crio/crio.conf.d/10-crio.conf` with its
  crun and runc handlers;
- Docker (cri-dockerd): `/etc/docker/daemon.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from simhost import runtime_config as rc

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"

CONTAINERD_V3 = """\
version = 3
root = '/var/lib/containerd'
state = '/run/containerd'
oom_score = 0

[grpc]
  address = '/run/containerd/containerd.sock'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10'

    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '/etc/containerd/certs.d'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    max_container_log_line_size = 16384

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dir = '/opt/cni/bin'
      conf_dir = '/etc/cni/net.d'
"""

CONTAINERD_V2 = """\
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
oom_score = 0

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.10"
    enable_selinux = false

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      snapshotter = "overlayfs"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/certs.d"
"""

# A registry mirror only the node owns (containerd's hosts.toml under config_path).
CONTAINERD_HOSTS = """\
server = "https://registry-1.docker.io"

[host."https://mirror.gcr.io"]
  capabilities = ["pull", "resolve"]
"""

CRIO_CONF = """\
# CRI-O configuration of the node image. Drop-ins in /etc/crio/crio.conf.d override it.
[crio]
  log_dir = "/var/log/crio/pods"

  [crio.api]
    listen = "/var/run/crio/crio.sock"

  [crio.runtime]
    cgroup_manager = "systemd"
    conmon_cgroup = "pod"

  [crio.image]
    pause_image = "registry.k8s.io/pause:3.10"

  [crio.network]
    network_dir = "/etc/cni/net.d/"
    plugin_dirs = ["/opt/cni/bin/"]
"""

CRIO_PACKAGED_DROP_IN = """\
[crio.runtime]
default_runtime = "crun"

[crio.runtime.runtimes.crun]
runtime_path = "/usr/libexec/crio/crun"
runtime_root = "/run/crun"
monitor_path = "/usr/libexec/crio/conmon"
allowed_annotations = [
    "io.containers.trace-syscall",
]

[crio.runtime.runtimes.runc]
runtime_path = "/usr/libexec/crio/runc"
runtime_root = "/run/runc"
monitor_path = "/usr/libexec/crio/conmon"
"""

DOCKER_DAEMON = (
    json.dumps(
        {
            "exec-opts": ["native.cgroupdriver=systemd"],
            "log-driver": "json-file",
            "log-opts": {"max-size": "100m"},
            "storage-driver": "overlay2",
            "registry-mirrors": ["https://mirror.gcr.io"],
        },
        indent=2,
    )
    + "\n"
)

CNI_CONFLIST = (
    json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "podnet",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": True,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.128.0.0/16"}]]},
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )
    + "\n"
)
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")

# Node path -> exact bytes, per runtime layout ("containerd-2", "containerd-1", "cri-o",
# "docker").
ORIGINALS: dict[str, dict[str, str]] = {
    "containerd-2": {
        rc.CONTAINERD_CONFIG: CONTAINERD_V3,
        "/etc/containerd/certs.d/docker.io/hosts.toml": CONTAINERD_HOSTS,
    },
    "containerd-1": {
        rc.CONTAINERD_CONFIG: CONTAINERD_V2,
        "/etc/containerd/certs.d/docker.io/hosts.toml": CONTAINERD_HOSTS,
    },
    "cri-o": {
        rc.CRIO_CONFIG: CRIO_CONF,
        f"{rc.CRIO_DROP_IN_DIR}/10-crio.conf": CRIO_PACKAGED_DROP_IN,
    },
    "docker": {"/etc/docker/daemon.json": DOCKER_DAEMON},
}
BINARIES: dict[str, tuple[str, ...]] = {
    "containerd-2": ("/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc"),
    "containerd-1": ("/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc"),
    "cri-o": (
        "/usr/bin/crio",
        "/usr/libexec/crio/crun",
        "/usr/libexec/crio/runc",
        "/usr/libexec/crio/conmon",
    ),
    "docker": ("/usr/bin/dockerd", "/usr/bin/cri-dockerd", "/usr/bin/containerd", "/usr/sbin/runc"),
}


def layout(runtime: str, version: str) -> str:
    """The key of ORIGINALS for a pool's runtime and version."""
    if runtime == "containerd":
        return "containerd-2" if rc.major_version(version) >= 2 else "containerd-1"
    return runtime


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def write(root: Path, runtime: str, version: str) -> dict[str, str]:
    """Write the node's original runtime configuration, the runtime's binaries and the CNI
    setup under its root; returns the configuration files written (node path -> text)."""
    key = layout(runtime, version)
    files = ORIGINALS[key]
    for node_path, text in files.items():
        target = root / node_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for binary in BINARIES[key]:
        _executable(root / binary.lstrip("/"), f"#!/bin/sh\n# {binary} {version} (simulated)\n")
    for plugin in CNI_PLUGINS:
        _executable(root / "opt" / "cni" / "bin" / plugin, f"#!/bin/sh\n# CNI {plugin}\n")
    conflist = root / "etc" / "cni" / "net.d" / "10-podnet.conflist"
    conflist.parent.mkdir(parents=True, exist_ok=True)
    conflist.write_text(CNI_CONFLIST)
    return dict(files)
