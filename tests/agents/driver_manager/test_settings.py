"""The driver manager's env contract: upstream's names, defaults and value syntax (Go booleans
and durations), our own bounded-wait knobs, and one clear line (exit 2) for a bad value."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpu_operator.agents.driver_manager import settings
from gpu_operator.cli import app
from gpu_operator.operands import driver as driver_operand
from gpu_operator.upgrade import selectors as selector

NODE = {"NODE_NAME": "gpu-1"}


def test_upstreams_defaults() -> None:
    s = settings.parse(NODE)
    assert s == settings.Settings(node_name="gpu-1")
    assert (s.enable_auto_drain, s.enable_gpu_pod_eviction, s.drain_use_force) == (
        True, True, False,
    )  # fmt: skip
    assert (s.drain_timeout, s.operator_namespace, s.operand_wait_timeout) == (
        0.0, "gpu-operator", 300.0,
    )  # fmt: skip


def test_the_rendered_driver_manager_env_parses() -> None:
    container = driver_operand.manager_container()
    env = {e["name"]: e.get("value", "") for e in container["env"] if "value" in e}
    parsed = settings.parse({**env, **NODE, "OPERATOR_NAMESPACE": "gpu-operator"})
    assert parsed.enable_gpu_pod_eviction
    assert not parsed.enable_auto_drain
    assert parsed.drain_timeout == 0.0


@pytest.mark.parametrize("env", [{}, {"NODE_NAME": ""}, {"NODE_NAME": "  "}])
def test_node_name_is_required(env: dict[str, str]) -> None:
    with pytest.raises(settings.SettingsError, match="NODE_NAME is required"):
        settings.parse(env)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("T", True), ("TRUE", True), ("True", True),
     ("false", False), ("0", False), ("f", False), ("FALSE", False), ("", False)],
)  # fmt: skip
def test_booleans_are_read_as_go_reads_them(value: str, expected: bool) -> None:
    assert settings.parse({**NODE, "ENABLE_AUTO_DRAIN": value}).enable_auto_drain is expected


@pytest.mark.parametrize("name", ["ENABLE_GPU_POD_EVICTION", "FORCE_REINSTALL", "USE_HOST_MOFED"])
def test_a_bad_boolean_names_the_variable(name: str) -> None:
    with pytest.raises(settings.SettingsError) as err:
        settings.parse({**NODE, name: "yes"})
    assert str(err.value) == f"{name}: 'yes' is not a boolean (use true or false)"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0.0), ("0s", 0.0), ("300s", 300.0), ("5m", 300.0), ("1h30m", 5400.0),
     ("1.5h", 5400.0), ("250ms", 0.25), ("2m3.5s", 123.5), ("+10s", 10.0)],
)  # fmt: skip
def test_the_drain_timeout_is_a_go_duration(value: str, seconds: float) -> None:
    assert settings.parse({**NODE, "DRAIN_TIMEOUT_SECONDS": value}).drain_timeout == seconds


@pytest.mark.parametrize(
    ("value", "problem"),
    [("300", "has no unit"), ("abc", "is not a duration"), ("5x", "unknown unit 'x'"),
     ("-5s", "is negative"), ("5m-", "unknown unit"), (".s", "is not a duration")],
)  # fmt: skip
def test_a_bad_duration_says_what_is_wrong(value: str, problem: str) -> None:
    with pytest.raises(settings.SettingsError) as err:
        settings.parse({**NODE, "DRAIN_TIMEOUT_SECONDS": value})
    assert str(err.value).startswith("DRAIN_TIMEOUT_SECONDS: ")
    assert problem in str(err.value)
    assert "300s, 5m or 1h30m" in str(err.value)


def test_an_empty_duration_keeps_the_default() -> None:
    assert settings.parse({**NODE, "DRAIN_TIMEOUT_SECONDS": ""}).drain_timeout == 0.0


def test_our_own_knobs_bound_the_waits() -> None:
    env = {
        **NODE,
        "DRIVER_MANAGER_OPERAND_WAIT_TIMEOUT": "90s",
        "DRIVER_MANAGER_POLL_INTERVAL": "500ms",
        "DRIVER_MANAGER_PREINSTALLED_EXIT_DELAY": "0",
        "DRIVER_MANAGER_MOFED_WAIT_TIMEOUT": "10m",
    }
    s = settings.parse(env)
    assert (s.operand_wait_timeout, s.poll_interval) == (90.0, 0.5)
    assert (s.preinstalled_exit_delay, s.mofed_wait_timeout) == (0.0, 600.0)
    with pytest.raises(settings.SettingsError, match="DRIVER_MANAGER_POLL_INTERVAL"):
        settings.parse({**NODE, "DRIVER_MANAGER_POLL_INTERVAL": "0"})


def test_defaults_can_be_given_for_unset_variables() -> None:
    base = settings.Settings(node_name="", poll_interval=0.1)
    assert settings.parse(NODE, base).poll_interval == 0.1
    assert settings.parse({**NODE, "DRIVER_MANAGER_POLL_INTERVAL": "2s"}, base).poll_interval == 2


def test_an_empty_operator_namespace_means_the_default() -> None:
    assert settings.parse({**NODE, "OPERATOR_NAMESPACE": ""}).operator_namespace == "gpu-operator"
    assert settings.parse({**NODE, "OPERATOR_NAMESPACE": "ops"}).operator_namespace == "ops"


def test_the_pod_selector_and_custom_label_are_checked_up_front() -> None:
    with pytest.raises(settings.SettingsError, match="DRAIN_POD_SELECTOR_LABEL"):
        settings.parse({**NODE, "DRAIN_POD_SELECTOR_LABEL": "app in (a"})
    with pytest.raises(settings.SettingsError, match="NODE_LABEL_FOR_GPU_POD_EVICTION"):
        settings.parse({**NODE, "NODE_LABEL_FOR_GPU_POD_EVICTION": "not a/label/key"})
    ok = settings.parse({**NODE, "NODE_LABEL_FOR_GPU_POD_EVICTION": "example.com/gpu-app"})
    assert ok.node_label_for_gpu_pod_eviction == "example.com/gpu-app"


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "no limit"), (30, "30s"), (300, "5m0s"), (5400, "1h30m0s"),
                          (0.5, "0.5s")]
)  # fmt: skip
def test_durations_are_shown_go_style(seconds: float, text: str) -> None:
    assert settings.format_duration(seconds) == text


# ----- selectors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {}, True),
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("gpu", {"gpu": ""}, True),
        ("!gpu", {"gpu": "x"}, False),
        ("tier in (web, api)", {"tier": "api"}, True),
        ("tier notin (web,api)", {"tier": "api"}, False),
        ("tier notin (web)", {}, True),
        ("app=web,tier in (a,b)", {"app": "web", "tier": "b"}, True),
        ("app=web,tier in (a,b)", {"app": "web", "tier": "c"}, False),
    ],
)
def test_selectors_match_as_kubectl_does(text: str, labels: dict[str, str], matches: bool) -> None:
    assert selector.parse(text).matches(labels) is matches


@pytest.mark.parametrize("text", ["app in (a", "app=web,,x", "a=b=c", "tier in ()", "x)"])
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(selector.SelectorError):
        selector.parse(text)


# ----- the command line -------------------------------------------------------------------


def test_the_command_exits_2_with_one_line_on_a_bad_value() -> None:
    result = CliRunner().invoke(
        app,
        ["agent", "driver-manager", "uninstall_driver"],
        env={"NODE_NAME": "gpu-1", "DRAIN_TIMEOUT_SECONDS": "300"},
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "DRAIN_TIMEOUT_SECONDS: '300' has no unit" in lines[0]


def test_the_command_without_a_node_name_exits_2() -> None:
    result = CliRunner().invoke(
        app, ["agent", "driver-manager", "uninstall_driver"], env={"NODE_NAME": ""}
    )
    assert result.exit_code == 2
    assert "NODE_NAME is required" in result.output


def test_an_unknown_command_exits_2() -> None:
    result = CliRunner().invoke(app, ["agent", "driver-manager", "install"], env=NODE)
    assert result.exit_code == 2
    assert "unknown command 'install'" in result.output
