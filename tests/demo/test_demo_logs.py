"""A demo run in-process quietens the process's logs only while it runs."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console
from waiting import DEADLINE

from gpu_operator import http_endpoint
from gpudemo import cluster, fleet, programs, session


def _state() -> list[tuple[int, bool, list[logging.Handler]]]:
    names = ("gpu_operator", "kubesim", "aiohttp", "httpx", "lightkube", "gpu_operator.agents")
    return [(lg.level, lg.propagate, list(lg.handlers)) for lg in map(logging.getLogger, names)]


def test_overlapping_demos_restore_the_loggers_when_the_last_one_ends() -> None:
    before = _state()
    endpoint_log = logging.getLogger(http_endpoint.__name__)
    with cluster.quiet_logs():
        with cluster.quiet_logs():  # a second demo in the same process
            assert not endpoint_log.isEnabledFor(logging.ERROR)
        assert not endpoint_log.isEnabledFor(logging.ERROR)  # the first one still runs
        assert logging.getLogger("gpu_operator.agents").propagate is False
    assert _state() == before
    assert endpoint_log.isEnabledFor(logging.ERROR)


async def test_after_a_demo_an_error_of_the_operator_is_logged_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It was not: the demo left `gpu_operator` at CRITICAL, and a later test's caplog was empty.
    options = session.Options(
        fleet=fleet.NAMED["small"], timing=programs.Timing(scale=0.0), timeout=DEADLINE,
        live=False, progress_interval=0.2,
    )  # fmt: skip
    result = await session.run(options, Console(file=io.StringIO(), width=200))
    assert result.converged
    logging.getLogger(http_endpoint.__name__).error("an endpoint failed")
    assert "an endpoint failed" in caplog.text
