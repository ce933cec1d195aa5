"""The operator Deployment: health probes bindable to the pod IP only (downward API), metrics
unchanged, and default resource requests/limits taken from the scale bench."""

from __future__ import annotations

from typing import Any

from .conftest import needs_helm

pytestmark = needs_helm


def _container(render: Any, *sets: str) -> dict[str, Any]:
    deployment = render([], list(sets)).one("Deployment", "gpu-operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_by_default_probes_listen_on_every_interface(render: Any) -> None:
    container = _container(render)
    assert "--health-probe-bind-address=:8081" in container["args"]
    assert "--metrics-bind-address=:8080" in container["args"]
    assert "HEALTH_PROBE_BIND_ADDRESS" not in _env(container)


def test_pod_ip_only_binds_probes_to_the_downward_api_pod_ip(render: Any) -> None:
    container = _container(render, "operator.healthProbe.podIPOnly=true")
    env = _env(container)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["HEALTH_PROBE_BIND_ADDRESS"] == "[$(POD_IP)]:8081"
    # The flag would win over the variable, so it must be gone; metrics stay on every interface.
    assert not any(a.startswith("--health-probe-bind-address") for a in container["args"])
    assert "--metrics-bind-address=:8080" in container["args"]
    # Kubernetes expands $(POD_IP) only from variables defined earlier in the list.
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("HEALTH_PROBE_BIND_ADDRESS")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["livenessProbe"]["httpGet"]["port"] == "health"


def test_the_probe_port_follows_the_value(render: Any) -> None:
    container = _container(
        render, "operator.healthProbe.podIPOnly=true", "operator.healthProbe.port=9441"
    )
    assert _env(container)["HEALTH_PROBE_BIND_ADDRESS"] == "[$(POD_IP)]:9441"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["health"] == 9441


def test_default_resources_cover_the_benched_memory_with_headroom(render: Any) -> None:
    resources = _container(render)["resources"]
    assert resources == {
        "requests": {"cpu": "200m", "memory": "160Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    mib = 1024 * 1024
    # README "Scale": peak RSS 132 MB at 5,000 GPU nodes and 326 MB at 20,000.
    assert 160 * mib >= 132e6 * 1.2
    assert 512 * mib >= 326e6 * 1.5
