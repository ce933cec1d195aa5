"""Fixtures: a running kubesim cluster and a small raw HTTP client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from kubesim_helpers import TEST_IMAGES, Api, instant

import kubesim


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=2, kubelet=instant(), bookmark_interval=0.1
    ) as cluster:
        yield cluster


@pytest.fixture
async def api(sim: kubesim.Cluster) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession(base_url=sim.url) as session:
        yield Api(session)
