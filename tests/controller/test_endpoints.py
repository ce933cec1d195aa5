"""The health endpoints bind where they are told: every interface, or one address (the pod IP)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from waiting import within

from gpu_operator.controller import endpoints


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":8081", ("0.0.0.0", 8081)),
        ("10.1.2.3:8081", ("10.1.2.3", 8081)),
        ("[10.1.2.3]:8081", ("10.1.2.3", 8081)),
        ("[fd00::12]:8081", ("fd00::12", 8081)),
    ],
)
def test_addresses_with_and_without_brackets_parse(address: str, expected: tuple[str, int]) -> None:
    assert endpoints.parse_address(address) == expected


@pytest.mark.parametrize("address", ["[]x:1", "[$(POD_IP)]:8081x", "10.0.0.1", "[a]b]:1"])
def test_bad_addresses_name_the_expected_form(address: str) -> None:
    with pytest.raises(ValueError, match=r"expected an address like :8080"):
        endpoints.parse_address(address)


async def _connects(host: str, port: int) -> bool:
    try:
        _, writer = await within(
            asyncio.open_connection(host, port), f"a connection to {host}:{port}"
        )
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def test_probes_bound_to_one_ip_are_not_served_on_others() -> None:
    with socket.socket() as probe:  # a free port on the loopback network
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    listener = await endpoints.serve(
        endpoints.health_routes(lambda: True), f"[127.0.0.2]:{port}", "health endpoint"
    )
    try:
        assert await _connects("127.0.0.2", port)
        assert not await _connects("127.0.0.1", port)
    finally:
        await listener.aclose()
