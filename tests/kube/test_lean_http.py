"""The writer's lean write path (kube/lean_http.py) against kubesim over HTTPS with tokens: the
same auth, TLS verification, field manager and ApiError as lightkube's own requests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import yaml
from kubesim_helpers import TEST_IMAGES
from lightkube import ApiError

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import lean_http, resources
from gpu_operator.kube.writer import Writer


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES, authentication=True, tls=True) as cluster:
        cluster.add_node("n1")
        yield cluster


def edited_kubeconfig(sim: kubesim.Cluster, tmp_path: Path, **user_or_cluster: object) -> str:
    doc = yaml.safe_load(Path(sim.kubeconfig_path).read_text())
    for key, value in user_or_cluster.items():
        section = "cluster" if key.startswith(("certificate", "insecure")) else "user"
        entries = doc["clusters" if section == "cluster" else "users"][0][section]
        if value is None:
            entries.pop(key, None)
        else:
            entries[key] = value
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def test_label_node_goes_the_lean_way_with_token_and_field_manager(
    sim: kubesim.Cluster,
) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        writer = Writer(client, namespace="default")
        await writer.label_node("n1", {"metadata": {"labels": {"example.com/lean": "yes"}}})
        assert isinstance(lean_http.shared(client), lean_http.LeanHttp)
        # lightkube's own pool never connected: the write went the lean way, authenticated.
        assert client._client._client._transport._pool.connections == []
        node = sim.store.get("nodes", "n1")
        assert node is not None
        assert node["metadata"]["labels"]["example.com/lean"] == "yes"
        managers = {
            (m["manager"], m["operation"]) for m in node["metadata"].get("managedFields") or []
        }
        assert (kube_client.FIELD_MANAGER, "Update") in managers
    finally:
        await client.close()


async def test_refusal_is_an_api_error_with_the_servers_code(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        writer = Writer(client, namespace="default")
        with pytest.raises(ApiError) as caught:
            await writer.label_node("no-such-node", {"metadata": {"labels": {"a": "b"}}})
        assert caught.value.status.code == 404
        assert "no-such-node" in str(caught.value.status.message)
    finally:
        await client.close()


async def test_a_wrong_token_is_refused(sim: kubesim.Cluster, tmp_path: Path) -> None:
    """The bearer token is sent (kubesim authenticates it): a wrong one gets 401."""
    config = edited_kubeconfig(sim, tmp_path, token="not-a-token")
    client = kube_client.connect(config)
    try:
        with pytest.raises(ApiError) as caught:
            await Writer(client, namespace="default").label_node("n1", {"metadata": {}})
        assert caught.value.status.code == 401
    finally:
        await client.close()


async def test_a_rotated_token_file_is_read_again(sim: kubesim.Cluster, tmp_path: Path) -> None:
    """A token file is read for the first request and again after a 401 (it was rotated)."""
    good = yaml.safe_load(Path(sim.kubeconfig_path).read_text())["users"][0]["user"]["token"]
    token_file = tmp_path / "token"
    token_file.write_text("stale-token\n")
    config = edited_kubeconfig(sim, tmp_path, token=None, tokenFile=str(token_file))
    client = kube_client.connect(config)
    try:
        writer = Writer(client, namespace="default")
        with pytest.raises(ApiError) as caught:
            await writer.label_node("n1", {"metadata": {"labels": {"rotated": "no"}}})
        assert caught.value.status.code == 401
        token_file.write_text(good + "\n")
        await writer.label_node("n1", {"metadata": {"labels": {"rotated": "yes"}}})
        node = sim.store.get("nodes", "n1")
        assert node is not None
        assert node["metadata"]["labels"]["rotated"] == "yes"
    finally:
        await client.close()


async def test_the_cluster_ca_is_verified(sim: kubesim.Cluster, tmp_path: Path) -> None:
    """Without the cluster's CA the server's certificate is not trusted: no request is sent."""
    config = edited_kubeconfig(sim, tmp_path, **{"certificate-authority-data": None})
    client = kube_client.connect(config)
    try:
        with pytest.raises(httpx2.ConnectError):
            await Writer(client, namespace="default").label_node("n1", {"metadata": {}})
    finally:
        await client.close()
    insecure = edited_kubeconfig(
        sim, tmp_path, **{"certificate-authority-data": None, "insecure-skip-tls-verify": True}
    )
    client = kube_client.connect(insecure)
    try:
        await Writer(client, namespace="default").label_node(
            "n1", {"metadata": {"labels": {"insecure": "ok"}}}
        )
    finally:
        await client.close()


async def test_status_patch_and_event_go_the_lean_way(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        writer = Writer(client, namespace="default")
        await writer.event(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "u1"}},
            reason="Lean",
            message="sent the lean way",
        )
        await writer.patch_status(resources.NODE, "n1", {"phase": "Running"})
        assert client._client._client._transport._pool.connections == []
        events = [e for e in sim.store.list("events", namespace="default") if e["reason"] == "Lean"]
        assert len(events) == 1
        assert events[0]["involvedObject"]["name"] == "n1"
    finally:
        await client.close()
