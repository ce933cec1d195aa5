"""Watch streams decoded by the cache itself (issue 32): read in big chunks, split into lines here,
each line decoded once into the plain dict the cache keeps, with no lightkube resource object."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from lightkube import ApiError
from lightkube.core import decoders
from waiting import DEADLINE, within

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import resources
from gpu_operator.kube.cache import Informer, stream_lines, watch_event


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def lines_of(*parts: bytes) -> list[bytes]:
    return [line async for line in stream_lines(chunks(*parts))]


async def test_lines_split_across_chunks_come_out_whole() -> None:
    event = b'{"type":"ADDED","object":{"metadata":{"name":"n1"}}}'
    assert await lines_of(event[:7], event[7:20], event[20:] + b"\n") == [event]
    # Several events in one chunk, one of them cut at the chunk's end.
    assert await lines_of(b"a\nb\nc", b"c\n") == [b"a", b"b", b"cc"]


async def test_blank_lines_are_skipped_and_a_last_line_needs_no_newline() -> None:
    assert await lines_of(b"\n\na\n", b"\r\n", b"b") == [b"a", b"b"]
    assert await lines_of() == []
    assert await lines_of(b"x" * 200_000, b"y\nz") == [b"x" * 200_000 + b"y", b"z"]


def test_an_event_decodes_to_its_type_and_a_plain_dict() -> None:
    kind, obj = watch_event(
        b'{"type":"MODIFIED","object":{"kind":"Node","metadata":{"name":"n1",'
        b'"resourceVersion":"7","labels":{"a":"1"}}}}'
    )
    assert kind == "MODIFIED"
    assert type(obj) is dict
    assert obj == {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "7",
                   "labels": {"a": "1"}}}  # fmt: skip


def test_an_error_event_raises_the_api_error_with_its_code() -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
              "reason": "Expired", "message": "too old resource version: 1 (5)"}  # fmt: skip
    with pytest.raises(ApiError) as raised:
        watch_event(msgspec.json.encode({"type": "ERROR", "object": status}))
    assert raised.value.status.code == 410
    assert "too old resource version" in str(raised.value.status.message)


def test_a_malformed_line_is_an_error_not_an_event() -> None:
    with pytest.raises(msgspec.DecodeError):
        watch_event(b'{"type":"ADDED","object":')
    with pytest.raises(msgspec.ValidationError):
        watch_event(b'{"type":"ADDED"}')


async def test_the_informer_follows_the_watch_without_lightkube_decoding_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lightkube's per-event decode (a second JSON pass and a resource object per event) is not
    on the informer's watch path: with it broken, the cache still follows every change."""
    async with kubesim.Cluster() as sim:
        sim.add_node("n1", labels={"a": "1"})
        client = kube_client.connect(str(sim.kubeconfig_path))
        seen: list[Any] = []
        informer = Informer(
            client,
            resources.NODE,
            transform=lambda o: seen.append(o) or o["metadata"].get("labels"),
        )
        task = asyncio.create_task(informer.run())
        try:
            await within(informer.synced.wait(), "the informer to sync")

            def refuse(*args: Any) -> Any:
                raise AssertionError("a watch event went through lightkube's decoder")

            monkeypatch.setattr(decoders, "decode_object", refuse)
            monkeypatch.setattr(decoders, "decode_watch_event", refuse)
            sim.add_node("n2", labels={"b": "2"})
            sim.store.patch("nodes", "n1", {"metadata": {"labels": {"a": "3"}}})
            await sim.wait_for(
                lambda: (
                    (informer.get("n2") or {}).get("b") == "2"
                    and (informer.get("n1") or {}).get("a") == "3"
                ),
                message="both changes cached",
                timeout=DEADLINE,
            )
            assert informer.relists == 1  # followed by the watch, not relisted
            assert all(type(obj) is dict for obj in seen)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
