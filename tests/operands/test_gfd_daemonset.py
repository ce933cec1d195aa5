"""GPU feature discovery's DaemonSet: the fields a user swapping in for NVIDIA's operator meets."""

from __future__ import annotations

from operand_helpers import ctr, find, make_facts, make_policy

from gpu_operator.operands import gpu_feature_discovery as gfd


def test_host_sys_is_read_only_and_the_pod_knows_its_name() -> None:
    ds = find(gfd.render(make_policy(), make_facts()), "DaemonSet", gfd.DS_NAME)
    main = ctr(ds, gfd.CTR)
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/sys"].get("readOnly") is True
    env = {e["name"]: e for e in main["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
