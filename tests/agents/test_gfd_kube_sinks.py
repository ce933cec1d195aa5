"""GFD's API-server sinks (NodeFeature object, direct node labels) against the simulated cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient
from lightkube.models.apiextensions_v1 import (
    CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion,
    CustomResourceValidation,
    JSONSchemaProps,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node

import kubesim
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import runner
from gpu_operator.kube import node_features
from gpu_operator.nvml import mock

NODE = "gpu-node-1"
NS = "default"


def _nodefeature_crd() -> CustomResourceDefinition:
    schema = JSONSchemaProps(
        type="object",
        properties={
            "spec": JSONSchemaProps(type="object", x_kubernetes_preserve_unknown_fields=True)
        },
    )
    return CustomResourceDefinition(
        metadata=ObjectMeta(name="nodefeatures.nfd.k8s-sigs.io"),
        spec=CustomResourceDefinitionSpec(
            group="nfd.k8s-sigs.io",
            names=CustomResourceDefinitionNames(
                kind="NodeFeature", plural="nodefeatures", singular="nodefeature"
            ),
            scope="Namespaced",
            versions=[
                CustomResourceDefinitionVersion(
                    name="v1alpha1",
                    served=True,
                    storage=True,
                    schema=CustomResourceValidation(openAPIV3Schema=schema),
                )
            ],
        ),
    )


@pytest.fixture
async def api() -> AsyncIterator[AsyncClient]:
    async with kubesim.Cluster() as sim:
        sim.add_node(NODE)
        client = node_features.client(sim.kubeconfig_path)
        await client.create(_nodefeature_crd())
        yield client
        await client.close()


async def _labels(api: AsyncClient) -> dict[str, str]:
    node = await api.get(Node, NODE)
    assert node.metadata is not None
    return dict(node.metadata.labels or {})


async def test_node_feature_object_is_created_and_updated(api: AsyncClient) -> None:
    writer = node_features.NodeFeatureWriter(api, NODE, NS)
    await writer.write({"nvidia.com/gpu.count": "8"})
    obj = await api.get(node_features.NodeFeature, f"nvidia-features-for-{NODE}", namespace=NS)
    assert obj.metadata is not None
    assert obj.metadata.labels is not None
    assert obj.metadata.labels[node_features.NODE_NAME_LABEL] == NODE
    assert obj["spec"]["labels"] == {"nvidia.com/gpu.count": "8"}
    version = obj.metadata.resourceVersion
    await writer.write({"nvidia.com/gpu.count": "8"})
    same = await api.get(node_features.NodeFeature, f"nvidia-features-for-{NODE}", namespace=NS)
    assert same.metadata is not None
    assert same.metadata.resourceVersion == version
    await writer.write({"nvidia.com/gpu.count": "4"})
    changed = await api.get(node_features.NodeFeature, f"nvidia-features-for-{NODE}", namespace=NS)
    assert changed["spec"]["labels"] == {"nvidia.com/gpu.count": "4"}


async def test_node_labels_are_set_pruned_and_removed(api: AsyncClient) -> None:
    before = await _labels(api)
    writer = node_features.NodeLabelWriter(api, NODE)
    await writer.write({"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "Tesla-T4"})
    got = await _labels(api)
    assert got["nvidia.com/gpu.count"] == "8"
    await writer.write({"nvidia.com/gpu.count": "4"})
    got = await _labels(api)
    assert got["nvidia.com/gpu.count"] == "4"
    assert "nvidia.com/gpu.product" not in got
    await writer.remove()
    assert await _labels(api) == before
    node = await api.get(Node, NODE)
    assert node.metadata is not None
    assert node_features.OWNED_LABELS_ANNOTATION not in (node.metadata.annotations or {})


async def test_gfd_loop_publishes_a_node_feature_from_a_mock_machine(api: AsyncClient) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-single")
    settings = runner.Settings(
        config=pc.parse({"flags": {"migStrategy": "single", "gfd": {"oneshot": True}}}),
        machine_type="NVIDIA DGX A100",
    )
    writer = node_features.NodeFeatureWriter(api, NODE, NS)
    await runner.run(machine.nvml, writer, settings, install_signals=False)
    obj = await api.get(node_features.NodeFeature, f"nvidia-features-for-{NODE}", namespace=NS)
    labels = obj["spec"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "56"
