"""The config-manager agent: selection rules, the symlink swap, signals, and refusing bad input."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from waiting import eventually, within

from gpu_operator.agents.config_manager import command, runner, selection
from gpu_operator.agents.config_manager import files as cm_files
from gpu_operator.agents.config_manager.signals import ProcSignaller

LABEL = "nvidia.com/device-plugin.config"
TIME_SLICED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)
PLAIN = "version: v1\nflags:\n  migStrategy: none\n"


# ----- selection (pure) ---------------------------------------------------------------------


def test_the_label_value_wins_over_default_and_fallbacks() -> None:
    chosen = selection.select(
        "a", ["a", "default"], label=LABEL, default="default", fallbacks=["named"]
    )
    assert chosen == selection.Selection("a", f"node label {LABEL}=a")


def test_an_unknown_label_value_names_what_is_available() -> None:
    with pytest.raises(selection.SelectionError) as err:
        selection.select("typo", ["a", "b"], label=LABEL, source="/available-configs")
    assert str(err.value) == (
        f"node label {LABEL}=typo names a config that does not exist in /available-configs "
        "(available: a, b)"
    )


def test_without_a_label_the_default_config_is_used() -> None:
    assert selection.select(None, ["a", "b"], label=LABEL, default="b").name == "b"
    with pytest.raises(selection.SelectionError, match="DEFAULT_CONFIG 'c' names a config"):
        selection.select(None, ["a", "b"], label=LABEL, default="c")


@pytest.mark.parametrize(
    ("names", "fallbacks", "expected"),
    [
        (["default", "x"], ["named", "single"], "default"),
        (["x"], ["named", "single"], "x"),
        (["x", "y"], ["named", "single", "empty"], None),
        (["x"], ["empty", "single"], None),
    ],
)
def test_fallback_strategies_apply_in_order(
    names: list[str], fallbacks: list[str], expected: str | None
) -> None:
    assert selection.select(None, names, label=LABEL, fallbacks=fallbacks).name == expected


def test_no_applicable_fallback_is_an_error_listing_what_was_tried() -> None:
    with pytest.raises(selection.SelectionError) as err:
        selection.select(None, ["x", "y"], label=LABEL, fallbacks=["named", "single"])
    assert "tried: named, single; available: x, y" in str(err.value)


def test_an_empty_config_directory_is_refused_even_with_the_empty_fallback() -> None:
    with pytest.raises(selection.SelectionError, match="no configuration files available"):
        selection.select(None, [], label=LABEL, fallbacks=["empty"])


def test_config_names_skip_directories_and_configmap_bookkeeping() -> None:
    entries = [("..data", False), ("..2024_01_01", True), ("b", False), ("a", False), ("d", True)]
    assert selection.config_names(entries) == ["a", "b"]


def test_unknown_fallback_strategies_are_usage_errors() -> None:
    assert selection.parse_fallbacks("named, single") == ["named", "single"]
    assert selection.parse_fallbacks("") == []
    with pytest.raises(selection.SelectionError, match="unknown fallback strategy 'first'"):
        selection.parse_fallbacks("named,first")


def test_command_line_checks_use_upstream_wording() -> None:
    with pytest.raises(command.UsageError, match="invalid <node-name>: must not be empty string"):
        command.build_settings(command.Options(config_file_srcdir="/a", config_file_dst="/b"))
    settings = command.build_settings(
        command.Options(
            node_name="n",
            config_file_srcdir="/a",
            config_file_dst="/b",
            fallback_strategies="named,empty",
            recheck_interval=0,
        )
    )
    assert settings.fallbacks == ["named", "empty"]
    assert settings.recheck_interval is None


# ----- files, signals and the loop ------------------------------------------------------------


class Files:
    """Container paths under a temporary root, as a chroot would see them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, container_path: str) -> Path:
        local = self.root / container_path.lstrip("/")
        if local.is_symlink() and os.readlink(local).startswith("/"):
            return self.path(os.readlink(local))
        return local


class Signals:
    def __init__(self, running: bool = True) -> None:
        self.running = running
        self.sent: list[tuple[str, int]] = []
        self.changed = asyncio.Event()

    def signal(self, process: str, signum: int) -> bool:
        self.sent.append((process, signum))
        self.changed.set()
        return self.running

    async def wait_for(self, count: int) -> None:
        await eventually(
            lambda: len(self.sent) >= count, f"{count} signal(s) sent", state=lambda: self.sent
        )


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    async def event(self, type_: str, reason: str, message: str) -> None:
        self.recorded.append((type_, reason, message))


def _setup(tmp_path: Path, **configs: str) -> Files:
    src = tmp_path / "available-configs"
    src.mkdir()
    for name, text in configs.items():
        (src / name).write_text(text)
    (tmp_path / "config").mkdir()
    return Files(tmp_path)


def _manager(
    files: Files, *, oneshot: bool = False, running: bool = True, **extra: object
) -> tuple[runner.ConfigManager, Signals, Events]:
    settings = runner.Settings(
        node_name="gpu-1",
        srcdir="/available-configs",
        dst="/config/config.yaml",
        oneshot=oneshot,
        recheck_interval=None,
        **extra,  # type: ignore[arg-type]
    )
    signals, events = Signals(running), Events()
    return runner.ConfigManager(settings, files, signals, events), signals, events


def _link(files: Files) -> str:
    return os.readlink(files.root / "config" / "config.yaml")


async def test_a_label_change_swaps_the_symlink_and_signals_once(tmp_path: Path) -> None:
    files = _setup(tmp_path, plain=PLAIN, sliced=TIME_SLICED)
    manager, signals, events = _manager(files, default_config="plain")
    assert await manager.sync(None) == runner.EXIT_OK
    assert _link(files) == "/available-configs/plain"
    assert await manager.sync("sliced") == runner.EXIT_OK
    assert _link(files) == "/available-configs/sliced"
    assert await manager.sync("sliced") == runner.EXIT_OK  # already in place: no signal
    assert signals.sent == [("nvidia-device-plugin", signal.SIGHUP)] * 2
    assert [e[1] for e in events.recorded] == [runner.APPLIED, runner.APPLIED]
    assert "now using config 'sliced' (node label" in events.recorded[1][2]


async def test_an_unknown_config_name_keeps_the_last_good_config(tmp_path: Path) -> None:
    files = _setup(tmp_path, plain=PLAIN, sliced=TIME_SLICED)
    manager, signals, events = _manager(files)
    await manager.sync("sliced")
    signals.sent.clear()
    events.recorded.clear()
    assert await manager.sync("slicde") == runner.EXIT_OK  # the sidecar keeps running
    assert _link(files) == "/available-configs/sliced"
    assert signals.sent == []
    [(kind, reason, message)] = events.recorded
    assert (kind, reason) == ("Warning", runner.REJECTED)
    assert "names a config that does not exist" in message
    assert "(available: plain, sliced); keeping config 'sliced'" in message


async def test_a_malformed_config_is_refused_before_anything_points_at_it(tmp_path: Path) -> None:
    broken = TIME_SLICED.replace("replicas: 4", "replicas: one")
    files = _setup(tmp_path, plain=PLAIN, broken=broken)
    manager, signals, events = _manager(files)
    await manager.sync("plain")
    signals.sent.clear()
    await manager.sync("broken")
    assert _link(files) == "/available-configs/plain"
    assert signals.sent == []
    message = events.recorded[-1][2]
    assert "/available-configs/broken" in message
    assert "replicas" in message
    assert "keeping config 'plain'" in message


async def test_a_repeated_rejection_records_one_event(tmp_path: Path) -> None:
    files = _setup(tmp_path, plain=PLAIN)
    manager, _, events = _manager(files)
    await manager.sync("nope")
    await manager.sync("nope")
    assert len(events.recorded) == 1


async def test_oneshot_falls_back_to_the_unlabelled_choice_when_nothing_is_in_place(
    tmp_path: Path,
) -> None:
    files = _setup(tmp_path, default=PLAIN, sliced=TIME_SLICED)
    manager, signals, events = _manager(files, oneshot=True, fallbacks=["named"])
    assert await manager.sync("typo") == runner.EXIT_OK
    assert _link(files) == "/available-configs/default"
    assert (
        "using config 'default' (no nvidia.com/device-plugin.config label; fallback named)"
        in (events.recorded[0][2])
    )
    assert signals.sent == [("nvidia-device-plugin", signal.SIGHUP)]


async def test_oneshot_fails_when_no_config_can_be_used(tmp_path: Path) -> None:
    files = _setup(tmp_path, a=PLAIN, b=PLAIN)
    manager, _, events = _manager(files, oneshot=True)
    assert await manager.sync("typo") == runner.EXIT_FAILED
    assert (
        "and without the label: no nvidia.com/device-plugin.config label" in (events.recorded[0][2])
    )


async def test_the_empty_fallback_points_at_dev_null(tmp_path: Path) -> None:
    files = _setup(tmp_path, a=PLAIN, b=PLAIN)
    manager, _, _ = _manager(files, fallbacks=["empty"])
    await manager.sync(None)
    assert _link(files) == "/dev/null"


async def test_a_missing_process_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    files = _setup(tmp_path, a=PLAIN)
    manager, signals, _ = _manager(files, running=False)
    assert await manager.sync("a") == runner.EXIT_OK
    assert signals.sent == [("nvidia-device-plugin", signal.SIGHUP)]


async def test_send_signal_false_only_swaps(tmp_path: Path) -> None:
    files = _setup(tmp_path, a=PLAIN)
    manager, signals, _ = _manager(files, send_signal=False)
    await manager.sync("a")
    assert _link(files) == "/available-configs/a"
    assert signals.sent == []


async def test_an_edited_config_is_signalled_on_the_next_recheck(tmp_path: Path) -> None:
    files = _setup(tmp_path, sliced=TIME_SLICED)
    manager, signals, _ = _manager(files)
    await manager.sync("sliced")
    await manager.sync("sliced", why="re-check")
    assert len(signals.sent) == 1
    (tmp_path / "available-configs" / "sliced").write_text(TIME_SLICED.replace("4", "2"))
    await manager.sync("sliced", why="re-check")
    assert len(signals.sent) == 2


async def _labels(
    values: list[str | None], signals: Signals | None = None
) -> AsyncIterator[str | None]:
    """Each value, the next only once the previous one was signalled; then silence."""
    for count, value in enumerate(values, 1):
        yield value
        if signals is not None:
            await signals.wait_for(count)
    await asyncio.Event().wait()


async def test_the_loop_follows_label_values_until_stopped(tmp_path: Path) -> None:
    files = _setup(tmp_path, a=PLAIN, b=TIME_SLICED)
    manager, signals, _ = _manager(files, default_config="a")
    stop = asyncio.Event()
    task = asyncio.ensure_future(manager.run(_labels([None, "b", "a"], signals), stop))
    await signals.wait_for(3)
    stop.set()
    assert await within(task, "the loop to stop") == runner.EXIT_OK
    assert _link(files) == "/available-configs/a"


async def test_oneshot_returns_after_the_first_label_value(tmp_path: Path) -> None:
    files = _setup(tmp_path, a=PLAIN)
    manager, _, _ = _manager(files, oneshot=True)
    code = await within(manager.run(_labels(["a"]), asyncio.Event()), "the one-shot run")
    assert code == runner.EXIT_OK
    assert _link(files) == "/available-configs/a"


def test_swap_symlink_replaces_an_existing_link_atomically(tmp_path: Path) -> None:
    files = _setup(tmp_path)
    view = cm_files.LocalFiles()
    dst = str(tmp_path / "config" / "config.yaml")
    assert cm_files.swap_symlink(view, dst, "/x") is True
    assert cm_files.swap_symlink(view, dst, "/x") is False
    assert cm_files.swap_symlink(view, dst, "/y") is True
    assert os.readlink(dst) == "/y"
    assert sorted(p.name for p in (tmp_path / "config").iterdir()) == ["config.yaml"]
    del files


def test_proc_signaller_finds_a_process_by_argv0(tmp_path: Path) -> None:
    for pid, argv in ((7, b"sleep\x00100\x00"), (3, b"nvidia-device-plugin\x00--x\x00")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(argv)
    (tmp_path / "self").mkdir()
    finder = ProcSignaller(tmp_path)
    assert finder.find("nvidia-device-plugin") == 3
    assert finder.find("gpu-feature-discovery") is None
    assert finder.signal("gpu-feature-discovery", signal.SIGHUP) is False


async def test_an_edit_that_breaks_the_selected_config_is_rejected_on_recheck(
    tmp_path: Path,
) -> None:
    files = _setup(tmp_path, sliced=TIME_SLICED)
    manager, signals, events = _manager(files)
    await manager.sync("sliced")
    (tmp_path / "available-configs" / "sliced").write_text("version: v2\n")
    await manager.sync("sliced", why="re-check")
    await manager.sync("sliced", why="re-check")
    assert len(signals.sent) == 1
    rejections = [e for e in events.recorded if e[1] == runner.REJECTED]
    assert len(rejections) == 1
    assert "/available-configs/sliced: version: unknown version 'v2'" in rejections[0][2]
