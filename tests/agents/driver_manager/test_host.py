"""The driver manager's host: a node root laid out as the simulated host driver contract says
(C1), unloaded through the simulated kernel, and the pure parts of the real Linux host."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from vm_hosts import host as make_host

from gpu_operator.agents.driver_manager import host as host_mod
from gpu_operator.agents.driver_manager import plan
from simhost import driver_host
from simhost import pci as simulated


@pytest.fixture
def node(tmp_path: Path) -> driver_host.NodeRootHost:
    make_host(tmp_path, "t4x4")
    return driver_host.NodeRootHost(tmp_path)


def load_driver(h: driver_host.NodeRootHost, version: str = "580.95.05") -> None:
    """What the driver container loads (nvidia, then its users)."""
    h.kernel.load_nvidia(version=version)
    for module in ("nvidia_uvm", "nvidia_modeset"):
        h.kernel.load(module)


def preinstall(root: Path) -> None:
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)


def test_a_fresh_node_has_no_driver(node: driver_host.NodeRootHost) -> None:
    facts = host_mod.observe(node)
    assert facts == plan.HostFacts()


def test_a_preinstalled_driver_answers_with_its_version(node: driver_host.NodeRootHost) -> None:
    preinstall(node.root)
    assert node.host_driver_version() is None  # nvidia-smi fails without a loaded driver
    node.kernel.load_nvidia(version="550.127.05")
    assert node.host_driver_version() == "550.127.05"


def test_the_operator_drivers_nvidia_smi_is_not_a_host_driver(
    node: driver_host.NodeRootHost,
) -> None:
    smi = node.root / "run" / "nvidia" / "driver" / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("")
    load_driver(node)
    assert node.host_driver_version() is None
    assert plan.NVIDIA in host_mod.observe(node).loaded_modules


def test_modules_come_out_users_first(node: driver_host.NodeRootHost) -> None:
    load_driver(node)
    with pytest.raises(host_mod.HostError, match="Module nvidia is in use by: "):
        node.unload("nvidia")
    for module in ("nvidia_modeset", "nvidia_uvm", "nvidia"):
        node.unload(module)
    assert not node.loaded("nvidia")
    assert not (node.root / "proc" / "driver" / "nvidia" / "version").exists()


def test_a_process_holding_the_driver_keeps_it_loaded(node: driver_host.NodeRootHost) -> None:
    load_driver(node)
    node.kernel.hold("nvidia")
    assert node.refcnt("nvidia") == 3  # nvidia_uvm, nvidia_modeset and the holder
    for module in ("nvidia_modeset", "nvidia_uvm"):
        node.unload(module)
    with pytest.raises(host_mod.HostError, match="rmmod: ERROR: Module nvidia is in use"):
        node.unload("nvidia")
    node.kernel.release("nvidia")
    node.unload("nvidia")


def test_processes_on_the_gpus_keep_the_cuda_modules_in_use(tmp_path: Path) -> None:
    make_host(tmp_path, "t4x4")
    running: list[str] = ["pid 4242 on GPU 0"]
    h = driver_host.NodeRootHost(tmp_path, lambda: list(running))
    load_driver(h)
    h.unload("nvidia_modeset")  # no CUDA process holds it
    with pytest.raises(host_mod.HostError, match=r"nvidia_uvm is in use \(GPU processes: pid 4242"):
        h.unload("nvidia_uvm")
    running.clear()
    h.unload("nvidia_uvm")
    h.unload("nvidia")


def test_unloading_a_module_that_is_not_loaded_says_so(node: driver_host.NodeRootHost) -> None:
    with pytest.raises(host_mod.HostError, match="Module nouveau is not currently loaded"):
        node.unload("nouveau")


def test_unmounting_the_driver_root_removes_the_containers_files(
    node: driver_host.NodeRootHost,
) -> None:
    root = node.root / "run" / "nvidia" / "driver"
    assert node.unmount_driver_root() == []
    # A hostPath directory the kubelet made below the mount point stays (it is the host's).
    (root / "lib" / "firmware").mkdir(parents=True)
    assert node.unmount_driver_root() == []
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "nvidia-smi").write_text("")
    (root / "usr" / "lib").mkdir()
    (root / "lib64").symlink_to("usr/lib")
    assert node.unmount_driver_root() == [host_mod.DRIVER_ROOT]
    assert not (root / "usr" / "bin" / "nvidia-smi").exists()
    assert not (root / "lib64").is_symlink()
    assert (root / "lib" / "firmware").is_dir()


def test_pid_and_state_files(node: driver_host.NodeRootHost) -> None:
    run = node.root / "run" / "nvidia"
    run.mkdir(parents=True)
    assert node.stored_digest() is None
    assert not node.remove_pid_file()
    (run / "nvidia-driver.state").write_text("abc123\n")
    (run / "nvidia-driver.pid").write_text("4242\n")
    assert node.stored_digest() == "abc123"
    assert node.remove_pid_file()
    assert not (run / "nvidia-driver.pid").exists()


def test_mellanox_devices_and_mofed(node: driver_host.NodeRootHost) -> None:
    assert not node.mellanox_present()
    device = node.root / "sys" / "bus" / "pci" / "devices" / "0000:81:00.0"
    device.mkdir(parents=True)
    for name, value in (
        ("vendor", "0x15b3"),
        ("device", "0x101b"),
        ("class", "0x020000"),
        ("subsystem_vendor", "0x15b3"),
        ("subsystem_device", "0x0007"),
    ):
        (device / name).write_text(value + "\n")  # fmt: skip
    assert node.mellanox_present()
    assert node.mofed_ready(use_host_mofed=True)  # the demo's hosts list mlx5_core
    assert not node.mofed_ready(use_host_mofed=False)
    marker = node.root / "run" / "mellanox" / "drivers" / ".driver-ready"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    assert node.mofed_ready(use_host_mofed=False)


def test_observe_reports_what_the_plan_needs(node: driver_host.NodeRootHost) -> None:
    load_driver(node)
    node.kernel.load("nvidia_vgpu_vfio")
    (node.root / "run" / "nvidia").mkdir(parents=True)
    (node.root / "run" / "nvidia" / "nvidia-driver.state").write_text("d1")
    facts = host_mod.observe(node)
    assert facts.loaded_modules == {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_vgpu_vfio"}
    assert facts.stored_digest == "d1"
    assert facts.host_driver_version is None


def test_the_simulated_kernel_is_the_hosts_kernel(node: driver_host.NodeRootHost) -> None:
    assert isinstance(node.kernel, simulated.SimulatedKernel)
    assert node.kernel.root == node.root
    assert node.pod_resources_socket == node.root / host_mod.POD_RESOURCES_SOCKET.lstrip("/")


# ----- the real host's pure parts ---------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
80 22 0:50 / /run/nvidia/driver rw - overlay overlay rw
81 80 0:51 / /run/nvidia/driver/dev rw - devtmpfs udev rw
82 81 0:52 / /run/nvidia/driver/dev/shm rw - tmpfs tmpfs rw
83 80 0:53 / /run/nvidia/driver/my\\040dir rw - tmpfs tmpfs rw
84 22 0:54 / /run/nvidia/driver-other rw - tmpfs tmpfs rw
"""


def test_mount_points_under_the_driver_root_deepest_first() -> None:
    assert host_mod.mount_points_under(MOUNTINFO, "/run/nvidia/driver") == [
        "/run/nvidia/driver/dev/shm",
        "/run/nvidia/driver/dev",
        "/run/nvidia/driver/my dir",
        "/run/nvidia/driver",
    ]
    assert host_mod.mount_points_under(MOUNTINFO, "/run/nvidia/none") == []


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (errno.EBUSY, "rmmod: ERROR: Module nvidia is in use"),
        (errno.ENOENT, "rmmod: ERROR: Module nvidia is not currently loaded"),
        (errno.EPERM, "rmmod: ERROR: could not remove module nvidia: Operation not permitted"),
    ],
)
def test_rmmod_messages(code: int, text: str) -> None:
    assert host_mod.rmmod_message("nvidia", code) == text


def test_a_real_host_without_nvidia_smi_has_no_host_driver(tmp_path: Path) -> None:
    linux = host_mod.LinuxHost(host_root=tmp_path, root=tmp_path)
    assert linux.host_driver_version() is None
    assert not linux.loaded("nvidia")
    assert linux.stored_digest() is None
    assert linux.pod_resources_socket == tmp_path / host_mod.POD_RESOURCES_SOCKET.lstrip("/")
