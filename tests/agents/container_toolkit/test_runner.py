"""The agent's life on a temp node root: install, CDI spec, configure and restart, drift
re-applied with an Event, restore on stop (and on cancellation), failures said plainly."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from waiting import DEADLINE, eventually, within

from gpu_operator import nvml
from gpu_operator.agents.container_toolkit import runner, settings
from gpu_operator.nvml import mock

from .nodes import ERRNOS, DiskFault

SAMPLES = Path(__file__).parent / "samples"
ENV = {
    "RUNTIME": "containerd",
    "ROOT": "/usr/local/nvidia",
    "CDI_ENABLED": "true",
    "NVIDIA_RUNTIME_SET_AS_DEFAULT": "false",
    "NVIDIA_CONTAINER_RUNTIME_MODE": "cdi",
    "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND": "management.nvidia.com/gpu",
    "RUNTIME_CONFIG": "/runtime/config-dir/config.toml",
    "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.toml",
    "RUNTIME_DROP_IN_CONFIG_HOST_PATH": "/etc/containerd/conf.d/99-nvidia.toml",
    "RUNTIME_SOCKET": "/runtime/sock-dir/containerd.sock",
    "DRIVER_ROOT_CTR_PATH": "/driver-root",
    "RUNTIME_CONFIG_DRIFT_INTERVAL": "0.05",
}
# The toolkit pod's mounts: container path -> node path.
MOUNTS = {
    "/runtime/config-dir.d": "/etc/containerd/conf.d",
    "/runtime/config-dir": "/etc/containerd",
    "/runtime/sock-dir": "/run/containerd",
    "/driver-root": "/run/nvidia/driver",
}


class FakeRestarter:
    """Counts restarts (stands for the C2 runtime's `signal(SIGHUP)`)."""

    description = "SIGHUP to containerd (fake)"

    def __init__(self) -> None:
        self.count = 0

    async def restart(self) -> None:
        self.count += 1


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def event(self, type_: str, reason: str, message: str) -> None:
        self.seen.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.seen]


async def until(
    condition: Callable[[], bool],
    what: str,
    timeout: float = DEADLINE,
    state: Callable[[], object] | None = None,
) -> None:
    await eventually(condition, what, timeout=timeout, interval=0.01, state=state)


class Node:
    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.config = root / "etc/containerd/config.toml"
        self.drop_in = root / "etc/containerd/conf.d/99-nvidia.toml"
        self.spec = root / "var/run/cdi/management.nvidia.com-gpu.yaml"
        self.config.parent.mkdir(parents=True)
        self.original = (SAMPLES / "containerd-v3.toml").read_bytes()
        self.config.write_bytes(self.original)
        self.restarter = FakeRestarter()
        self.events = Events()
        self.settings = settings.from_env({**ENV, **(env or {})})
        self.ready = asyncio.Event()

    def disk(self) -> list[Path]:
        """The runtime's config directory and the toolkit's backup (see nodes.DiskFault)."""
        return [self.root / "etc", self.root / "usr/local/nvidia/runtime-config-backup"]

    def view(self, path: str) -> Path:
        for ctr, host in MOUNTS.items():
            if path == ctr or path.startswith(ctr + "/"):
                return self.root / (host + path[len(ctr) :]).lstrip("/")
        return self.root / path.lstrip("/")

    def agent(
        self, open_nvml: Callable[[], nvml.Nvml] | None = None, restore_budget: float = 5.0
    ) -> runner.Agent:
        machine = mock.MockMachine.from_preset("t4x4", seed=1)
        return runner.Agent(
            self.settings,
            restarter=self.restarter,
            view=self.view,
            open_nvml=open_nvml or machine.nvml,
            events=self.events,
            stand_ins=True,
            backoff=runner.Backoff(0.02, 0.1),
            restore_budget=restore_budget,
        )


async def test_the_agent_configures_watches_and_restores_the_node(tmp_path: Path) -> None:
    node = Node(tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(node.agent().run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    assert b'"/etc/containerd/conf.d/*.toml"' in node.config.read_bytes()
    assert b"nvidia-container-runtime.cdi" in node.drop_in.read_bytes()
    assert (tmp_path / "usr/local/nvidia/toolkit/nvidia-container-runtime").is_file()
    assert [d["name"] for d in yaml.safe_load(node.spec.read_text())["devices"]][-1] == "all"
    assert node.restarter.count == 1
    assert node.events.reasons() == ["RuntimeConfigured"]

    node.drop_in.unlink()  # behind our back
    await until(
        lambda: "RuntimeConfigDrift" in node.events.reasons(),
        "the drift event",
        state=node.events.reasons,
    )
    assert node.drop_in.is_file()
    drift = next(m for _, r, m in node.events.seen if r == "RuntimeConfigDrift")
    assert drift.startswith("/etc/containerd/conf.d/99-nvidia.toml: ")
    assert "added runtime handler nvidia-cdi" in drift
    assert node.restarter.count == 2

    stop.set()
    assert await within(task, "the agent to exit") == runner.EXIT_OK
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()
    assert not node.spec.exists()
    assert node.events.reasons()[-1] == "RuntimeConfigRestored"
    assert node.restarter.count == 3
    assert not (tmp_path / "run/nvidia/toolkit/toolkit.pid").exists()


async def test_a_cancelled_agent_still_restores_the_config(tmp_path: Path) -> None:
    node = Node(tmp_path)
    task = asyncio.create_task(node.agent().run(asyncio.Event(), on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()


async def test_without_a_driver_the_agent_is_not_ready_until_the_cdi_spec_can_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    loaded = False
    machine = mock.MockMachine.from_preset("t4x4", seed=1)

    def open_nvml() -> nvml.Nvml:
        if not loaded:
            raise nvml.DriverNotLoaded("Driver Not Loaded")
        return machine.nvml()

    stop = asyncio.Event()
    task = asyncio.create_task(node.agent(open_nvml).run(stop, on_ready=node.ready.set))
    await until(
        lambda: "Driver Not Loaded" in caplog.text,
        "the CDI error in the log",
        state=lambda: caplog.messages,
    )
    assert "cannot generate the management CDI spec: failed to initialize NVML" in caplog.text
    assert not node.ready.is_set()
    # The runtime is configured meanwhile (after the failed CDI attempt), while not ready.
    await until(node.drop_in.is_file, "the runtime drop-in config")
    assert not node.ready.is_set()
    loaded = True
    await within(node.ready.wait(), "the agent to be ready")
    assert node.spec.is_file()
    stop.set()
    await within(task, "the agent to exit")


async def test_a_cdi_spec_that_stays_ungenerated_ends_the_agent_with_the_reason_and_keeps_config(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, {"CDI_SPEC_TIMEOUT": "0.2"})

    def open_nvml() -> nvml.Nvml:
        raise nvml.DriverNotLoaded("Driver Not Loaded")

    agent = node.agent(open_nvml)
    code = await within(agent.run(asyncio.Event(), on_ready=node.ready.set), "the agent to give up")
    assert code == runner.EXIT_FAILED
    assert not node.ready.is_set()
    assert agent.failure is not None
    assert agent.failure.startswith(
        "the management CDI spec /var/run/cdi/management.nvidia.com-gpu.yaml could not be "
        "generated for 0.2 s: failed to initialize NVML: Driver Not Loaded"
    )
    assert node.events.reasons()[-1] == "CDISpecGenerationFailed"
    # Not an uninstall: the handlers stay for the next pod, which then restarts nothing.
    assert node.drop_in.is_file()
    assert node.config.read_bytes() != node.original


async def test_cdi_spec_timeout_zero_retries_forever(tmp_path: Path) -> None:
    node = Node(tmp_path, {"CDI_SPEC_TIMEOUT": "0"})
    attempts = 0

    def open_nvml() -> nvml.Nvml:
        nonlocal attempts
        attempts += 1
        raise nvml.DriverNotLoaded("Driver Not Loaded")

    stop = asyncio.Event()
    agent = node.agent(open_nvml)
    task = asyncio.create_task(agent.run(stop, on_ready=node.ready.set))
    await until(lambda: attempts >= 3, "three CDI attempts", state=lambda: attempts)
    assert not task.done()
    stop.set()
    assert await within(task, "the agent to exit") == runner.EXIT_OK
    assert agent.failure is None


async def test_a_second_instance_on_the_node_exits_with_the_lock_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    stop = asyncio.Event()
    first = asyncio.create_task(node.agent().run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    assert await node.agent().run(asyncio.Event()) == runner.EXIT_FAILED
    assert "another instance of the toolkit container is already running" in caplog.text
    stop.set()
    await within(first, "the first agent to exit")


async def test_an_unreadable_config_fails_with_an_event_naming_the_file(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.config.write_text("version = 3\n[plugins\n")
    assert await node.agent().run(asyncio.Event()) == runner.EXIT_FAILED
    (type_, reason, message) = node.events.seen[-1]
    assert (type_, reason) == ("Warning", "RuntimeConfigFailed")
    assert message.startswith("containerd: /etc/containerd/config.toml: not valid TOML")
    assert node.config.read_text() == "version = 3\n[plugins\n"


async def test_nri_mode_leaves_the_runtime_config_alone(tmp_path: Path) -> None:
    node = Node(tmp_path, {"ENABLE_NRI_PLUGIN": "true"})
    stop = asyncio.Event()
    task = asyncio.create_task(node.agent().run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()
    stop.set()
    await within(task, "the agent to exit")
    assert node.restarter.count == 0


def failures(events: Events) -> list[str]:
    return [m for t, r, m in events.seen if (t, r) == ("Warning", "RuntimeConfigFailed")]


def one_line_errors(caplog: pytest.LogCaptureFixture, code: int) -> list[logging.LogRecord]:
    """The error records naming the errno; each is one line with no traceback."""
    found = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and f"({errno.errorcode[code]})" in r.getMessage()
    ]
    for record in found:
        assert "\n" not in record.getMessage()
        assert record.exc_info is None
    return found


@pytest.mark.parametrize("code", ERRNOS, ids=[errno.errorcode[c] for c in ERRNOS])
async def test_an_unwritable_disk_at_start_is_a_line_an_event_the_message_and_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    caplog.set_level(logging.INFO)
    node = Node(tmp_path)
    fault = DiskFault(monkeypatch, node.disk(), code)
    fault.on = True
    agent = node.agent()
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, on_ready=node.ready.set))
    await until(lambda: fault.hits >= 3, "three attempts", state=lambda: fault.hits)
    name = errno.errorcode[code]
    # The first write is the backup of the original (a full disk fails it like the config).
    assert failures(node.events) == [
        "configuring containerd failed: /usr/local/nvidia/runtime-config-backup/config.orig: "
        f"cannot write it: {os.strerror(code)} ({name})"
    ], "one Event for the failure, not one per attempt"
    assert agent.failure == failures(node.events)[0]  # the termination message
    assert len(one_line_errors(caplog, code)) >= 3  # one line per attempt, with the delay
    assert "retrying in" in caplog.text
    assert not task.done()
    assert not node.ready.is_set()
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()

    fault.on = False  # the disk has room again: the next attempt configures
    await within(node.ready.wait(), "the agent to be ready")
    assert agent.failure is None
    assert node.events.reasons()[-1] == "RuntimeConfigured"
    assert "the runtime config can be read and written again" in caplog.text
    stop.set()
    assert await within(task, "the agent to exit") == runner.EXIT_OK
    assert node.config.read_bytes() == node.original


@pytest.mark.parametrize("code", ERRNOS, ids=[errno.errorcode[c] for c in ERRNOS])
async def test_an_unwritable_disk_in_the_drift_loop_is_retried_and_the_restore_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    node = Node(tmp_path)
    fault = DiskFault(monkeypatch, node.disk(), code)
    agent = node.agent()
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    fault.on = True
    node.drop_in.unlink()  # drift that cannot be repaired while the disk fails
    await until(lambda: fault.hits >= 2, "two repair attempts", state=lambda: fault.hits)
    assert len(failures(node.events)) == 1
    assert f"({errno.errorcode[code]})" in failures(node.events)[0]
    assert agent.failure is not None
    assert one_line_errors(caplog, code)
    assert not task.done()

    fault.on = False
    await until(
        lambda: "RuntimeConfigDrift" in node.events.reasons(),
        "the drift repaired",
        state=node.events.reasons,
    )
    assert node.drop_in.is_file()
    assert agent.failure is None
    stop.set()
    assert await within(task, "the agent to exit") == runner.EXIT_OK
    assert node.config.read_bytes() == node.original  # the restore ran
    assert not node.drop_in.exists()


async def test_a_disk_that_stays_unwritable_ends_the_agent_after_the_timeout_without_uninstall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, {"RUNTIME_CONFIG_IO_TIMEOUT": "0.3"})
    fault = DiskFault(monkeypatch, node.disk(), errno.EROFS)
    agent = node.agent()
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    fault.on = True
    node.drop_in.unlink()
    assert await within(task, "the agent to give up") == runner.EXIT_FAILED
    assert agent.failure is not None
    assert agent.failure.endswith(
        "Read-only file system (EROFS) (failing for 0.3 s: exiting; the next pod retries)"
    )
    assert b"conf.d/*.toml" in node.config.read_bytes()  # not an uninstall: ours stay


async def test_a_restore_that_keeps_failing_keeps_the_backup_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path)
    fault = DiskFault(monkeypatch, node.disk(), errno.ENOSPC)
    agent = node.agent(restore_budget=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    fault.on = True
    stop.set()
    assert await within(task, "the agent to exit") == runner.EXIT_FAILED
    assert agent.failure is not None
    assert agent.failure.startswith(
        "restoring the runtime config failed: /etc/containerd/config.toml: cannot write it: "
        "No space left on device (ENOSPC); the backup in "
        "/usr/local/nvidia/runtime-config-backup is kept"
    )
    assert node.events.reasons()[-1] == "RuntimeConfigFailed"
    assert (tmp_path / "usr/local/nvidia/runtime-config-backup/config.orig").is_file()

    fault.on = False  # the next pod puts the node back
    again = asyncio.Event()
    second = asyncio.create_task(node.agent().run(again, on_ready=lambda: again.set()))
    assert await within(second, "the second agent to exit") == runner.EXIT_OK
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()


async def test_a_config_broken_by_somebody_while_we_run_does_not_skip_the_restore(
    tmp_path: Path,
) -> None:
    """A drift check that meets a config it cannot edit says so once, and SIGTERM still
    restores what it can (before: the failure made the agent exit without restoring)."""
    node = Node(tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(node.agent().run(stop, on_ready=node.ready.set))
    await within(node.ready.wait(), "the agent to be ready")
    node.drop_in.write_text("[broken\n")
    node.config.write_bytes(node.config.read_bytes() + b"[[[\n")
    await until(lambda: failures(node.events), "the failure Event", state=node.events.reasons)
    node.config.write_bytes(node.config.read_bytes()[: -len(b"[[[\n")])
    stop.set()
    await within(task, "the agent to exit")
    assert len(failures(node.events)) == 1
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()


async def test_a_full_disk_under_root_at_install_is_a_line_an_event_and_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path)
    fault = DiskFault(monkeypatch, [tmp_path / "usr/local/nvidia/toolkit"], errno.ENOSPC)
    fault.on = True
    agent = node.agent()
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, on_ready=node.ready.set))
    await until(lambda: fault.hits >= 2, "two install attempts", state=lambda: fault.hits)
    line = (
        "installing the toolkit: /usr/local/nvidia/toolkit/.config/nvidia-container-runtime/"
        "config.toml: cannot write it: No space left on device (ENOSPC)"
    )
    assert agent.failure == line
    assert [m for _, r, m in node.events.seen if r == "ToolkitInstallFailed"] == [line]
    assert node.config.read_bytes() == node.original
    fault.on = False
    await within(node.ready.wait(), "the agent to be ready")
    assert agent.failure is None
    stop.set()
    assert await within(task, "the agent to exit") == runner.EXIT_OK


async def test_a_node_layout_no_write_can_cure_fails_at_once_with_the_reason(
    tmp_path: Path,
) -> None:
    """A directory where the drop-in must be is no disk state that passes: no in-process
    retries, the exit says why at once (the kubelet's restarts retry)."""
    node = Node(tmp_path)
    node.drop_in.mkdir(parents=True)
    agent = node.agent()
    assert await within(agent.run(asyncio.Event()), "the agent to exit") == runner.EXIT_FAILED
    assert agent.failure == (
        "configuring containerd failed: /etc/containerd/conf.d/99-nvidia.toml: cannot read it: "
        "Is a directory (EISDIR)"
    )
    assert failures(node.events) == [
        "containerd: /etc/containerd/conf.d/99-nvidia.toml: cannot read it: Is a directory (EISDIR)"
    ]
    assert node.config.read_bytes() == node.original
