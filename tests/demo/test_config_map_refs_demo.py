"""A ClusterPolicy naming a device-plugin ConfigMap that does not exist, on the demo served to the
real kubectl (issue 30, item 7): the status names it with the fix and one Warning Event says it,
the running device plugin is kept, and `kubectl create configmap` lets it roll out."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import DEADLINE, eventually

from gpudemo import fleet, session

pytestmark = needs_kubectl

NS = session.NAMESPACE
MISSING = (
    "spec.devicePlugin.config.name: ConfigMap time-slicing-config not found in namespace "
    "gpu-operator: create ConfigMap time-slicing-config in namespace gpu-operator with key any "
    "(a device-plugin config)"
)
TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


async def test_a_missing_device_plugin_config_map_is_named_and_kubectl_create_fixes_it(
    tmp_path: Path,
) -> None:
    pools = fleet.parse({"pools": [{"name": "t4", "machine": "t4x4"}]})
    async with serve_demo(tmp_path, pools, timeout=DEADLINE, wait=2 * DEADLINE) as served:
        _, _, kubeconfig = served

        async def kubectl(*args: str) -> str:
            code, out = await run_kubectl(kubeconfig, *args)
            assert code == 0, out
            return out

        async def policy() -> dict[str, object]:
            found: dict[str, object] = json.loads(
                await kubectl("get", "clusterpolicy", session.POLICY_NAME, "-o", "json")
            )
            return found

        def state(found: dict[str, object], name: str) -> dict[str, str]:
            status = found.get("status") or {}
            assert isinstance(status, dict)
            return next((s for s in status.get("states") or [] if s["name"] == name), {})

        running = json.loads(await kubectl("-n", NS, "get", "ds", "nvidia-device-plugin-daemonset",
                                           "-o", "json"))  # fmt: skip
        generation = running["metadata"]["generation"]

        # The user points the device plugin at a time-slicing ConfigMap not created yet.
        body = copy.deepcopy(session.DEFAULT_POLICY)
        body["spec"]["devicePlugin"]["config"] = {"name": "time-slicing-config", "default": "any"}
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(body))
        await kubectl("apply", "-f", str(path))
        seen: list[object] = [None]

        async def named() -> bool:
            found = await policy()
            seen[0] = found.get("status")
            return state(found, "state-device-plugin").get("message") == MISSING

        await eventually(named, "the status to name the missing ConfigMap", interval=0.2,
                         state=lambda: seen[0])  # fmt: skip
        found = await policy()
        assert state(found, "state-device-plugin")["state"] == "notReady"
        status = found["status"]
        assert isinstance(status, dict)
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert MISSING in ready["message"]
        events = json.loads(await kubectl("get", "events", "-A", "--field-selector",
                                          "reason=ConfigMapNotFound", "-o", "json"))  # fmt: skip
        assert [(e["type"], e["message"]) for e in events["items"]] == [("Warning", MISSING)]
        # The running device plugin is left as it was (its pods could not mount the config).
        running = json.loads(await kubectl("-n", NS, "get", "ds", "nvidia-device-plugin-daemonset",
                                           "-o", "json"))  # fmt: skip
        assert running["metadata"]["generation"] == generation

        # The fix the status gives, with kubectl.
        config = tmp_path / "any"
        config.write_text(TIME_SLICING)
        await kubectl("-n", NS, "create", "configmap", "time-slicing-config",
                      f"--from-file=any={config}")  # fmt: skip

        async def rolled_out() -> bool:
            found = await policy()
            seen[0] = found.get("status")
            status = found.get("status") or {}
            assert isinstance(status, dict)
            return status.get("state") == "ready"

        await eventually(rolled_out, "the policy ready with the ConfigMap", interval=0.2,
                         state=lambda: seen[0])  # fmt: skip
        volumes = await kubectl("-n", NS, "get", "ds", "nvidia-device-plugin-daemonset", "-o",
                                "jsonpath={.spec.template.spec.volumes[?(@.name=="
                                '"available-configs")].configMap.name}')  # fmt: skip
        assert volumes == "time-slicing-config"
        events = json.loads(await kubectl("get", "events", "-A", "--field-selector",
                                          "reason=ConfigMapNotFound", "-o", "json"))  # fmt: skip
        assert len(events["items"]) == 1
