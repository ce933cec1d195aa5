"""resource.k8s.io/v1 on kubesim: admission (validation with CEL compilation, defaults) and the
real kubectl's get/explain/describe of DRA objects."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubesim_helpers import kubectl, needs_kubectl
from test_dra_allocation import DRIVER, claim, device, device_class, exactly, node_slice, pod

import kubesim
from kubesim import errors


def rejected(sim: kubesim.Cluster, obj: dict[str, Any]) -> str:
    with pytest.raises(errors.ApiError) as caught:
        sim.store.create(obj)
    assert caught.value.code == 422, caught.value.message
    return caught.value.message


async def test_selector_that_does_not_compile_is_rejected(sim: kubesim.Cluster) -> None:
    message = rejected(sim, claim("c", exactly("gpu", "device.driver ==")))
    assert message.startswith(
        'ResourceClaim.resource.k8s.io "c" is invalid: '
        "spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value: "
        '"device.driver ==": compilation failed: ERROR: <input>:1:'
    ), message
    message = rejected(sim, device_class("bad", "dev.driver == 'x'"))
    assert "undeclared reference to 'dev'" in message, message


async def test_request_shape_rules(sim: kubesim.Cluster) -> None:
    both = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu"},
        "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}],
    }
    assert (
        "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"
        in rejected(sim, claim("c", both))
    )
    assert (
        "spec.devices.requests[0]: Required value: "
        "exactly one of `exactly` or `firstAvailable` is required"
        in rejected(sim, claim("c", {"name": "gpu"}))
    )
    all_with_count = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu", "allocationMode": "All", "count": 2},
    }
    assert (
        "spec.devices.requests[0].exactly.count: Invalid value: 2: "
        "must not be specified when allocationMode is 'All'"
        in rejected(sim, claim("c", all_with_count))
    )
    dup = rejected(sim, claim("c", exactly(), exactly()))
    assert 'spec.devices.requests[1]: Duplicate value: "gpu"' in dup, dup
    bad_ref = rejected(
        sim,
        claim(
            "c", exactly(), constraints=[{"requests": ["nope"], "matchAttribute": f"{DRIVER}/numa"}]
        ),
    )
    assert 'spec.devices.constraints[0].requests[0]: Invalid value: "nope"' in bad_ref, bad_ref


async def test_slice_rules(sim: kubesim.Cluster) -> None:
    no_node = node_slice("node-1", [device("a"), device("a")])
    del no_node["spec"]["nodeName"]
    message = rejected(sim, no_node)
    assert (
        "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
        "`perDeviceNodeSelection` is required" in message
    )
    assert 'spec.devices[1]: Duplicate value: "a"' in message
    zero = node_slice("node-1", [device("a")], count=0)
    assert "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero" in rejected(
        sim, zero
    )


async def test_pod_claim_references(sim: kubesim.Cluster) -> None:
    manifest = pod("p", claim_name="c")
    manifest["spec"]["containers"][0]["resources"]["claims"] = [{"name": "other"}]
    message = rejected(sim, manifest)
    assert (
        "spec.containers[0].resources.claims[0].name: "
        'Unsupported value: "other": supported values: "gpu"' in message
    )
    neither = pod("q")
    assert "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`" in rejected(
        sim, neither
    )


@needs_kubectl
async def test_kubectl_get_describe_explain(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(node_slice("node-1", [device("gpu-0", model="a100")]))
    await kubectl(sim, "apply", "-f", "-", stdin=json.dumps(claim("c", exactly())))
    out = await kubectl(sim, "get", "resourceclaims")
    assert out.split("\n")[0].split() == ["NAME", "STATE", "AGE"], out
    assert out.split("\n")[1].split()[:2] == ["c", "pending"], out
    wide = await kubectl(sim, "get", "resourceslices", "-o", "wide")
    assert wide.split("\n")[0].split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"], wide
    assert wide.split("\n")[1].split()[1:4] == ["node-1", DRIVER, "node-1"], wide
    explained = await kubectl(sim, "explain", "resourceclaim.spec")
    assert "devices" in explained, explained
    sim.store.create(pod("p", claim_name="c"))
    from test_dra_allocation import until

    await until(lambda: (sim.store.get("pods", "p", "default") or {})["spec"].get("nodeName"))
    out = await kubectl(sim, "get", "resourceclaims")
    assert out.split("\n")[1].split()[1] == "allocated,reserved", out
    described = await kubectl(sim, "describe", "resourceclaim", "c")
    assert "gpu-0" in described, described


@needs_kubectl
async def test_kubectl_lists_resourceslices_by_node_and_driver(sim: kubesim.Cluster) -> None:
    from kubesim import list_index

    key = ("resource.k8s.io", "resourceslices")
    assert set(list_index.indexed_fields(key)) >= {"spec.nodeName", "spec.driver"}
    sim.store.create(node_slice("node-1", [device("gpu-0")]))
    other = node_slice("node-2", [device("gpu-0")])
    other["metadata"]["name"] = "node-2-net"
    other["spec"]["driver"] = "net.example.com"
    sim.store.create(other)

    async def names(selector: str) -> list[str]:
        out = await kubectl(
            sim, "get", "resourceslices", "--field-selector", selector, "-o", "name"
        )
        return out.split()

    assert await names("spec.nodeName=node-1") == [
        f"resourceslice.resource.k8s.io/node-1-{DRIVER}-0"
    ]
    assert await names("spec.driver=net.example.com") == [
        "resourceslice.resource.k8s.io/node-2-net"
    ]
    assert await names(f"spec.driver!={DRIVER}") == ["resourceslice.resource.k8s.io/node-2-net"]
    assert await names("spec.nodeName=node-3") == []
