"""DCGM and its exporter: remote engine, RBAC gate, metrics ConfigMap, Services, ServiceMonitor."""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import ctr, env_of, find, make_facts, make_policy, mounts_of, pod, volumes_of

from gpu_operator.controller import validate_refs
from gpu_operator.operands import dcgm, dcgm_exporter
from gpu_operator.operands.common import RenderError

CTR = "nvidia-dcgm-exporter"


def render(facts: Any = None, **sections: Any) -> list[dict[str, Any]]:
    return dcgm_exporter.render(make_policy(**sections), facts or make_facts())


def kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


def test_default_objects_in_apply_order() -> None:
    assert kinds(render(dcgm={"enabled": False})) == [
        ("ServiceAccount", "nvidia-dcgm-exporter"),
        ("Role", "nvidia-dcgm-exporter"),
        ("RoleBinding", "nvidia-dcgm-exporter"),
        ("DaemonSet", "nvidia-dcgm-exporter"),
        ("Service", "nvidia-dcgm-exporter"),
    ]


def test_without_a_metrics_config_map_the_image_default_counters_are_used() -> None:
    # Upstream: DCGM_EXPORTER_COLLECTORS names the image's dcp-metrics-included.csv, and no
    # ConfigMap is rendered or mounted.
    objects = render()
    assert "ConfigMap" not in [k for k, _ in kinds(objects)]
    ds = find(objects, "DaemonSet")
    exporter = ctr(ds, CTR)
    assert env_of(exporter)["DCGM_EXPORTER_COLLECTORS"] == (
        "/etc/dcgm-exporter/dcp-metrics-included.csv"
    )
    assert "metrics-config" not in volumes_of(ds)
    assert "/etc/dcgm-exporter/dcgm-metrics.csv" not in mounts_of(exporter)


def test_custom_metrics_config_map_is_mounted_and_named_in_the_env() -> None:
    facts = make_facts(config_map_keys={"my-metrics": ("dcgm-metrics.csv",)})
    objects = render(facts, dcgmExporter={"config": {"name": "my-metrics"}})
    assert "ConfigMap" not in [k for k, _ in kinds(objects)]
    ds = find(objects, "DaemonSet")
    assert volumes_of(ds)["metrics-config"]["configMap"] == {
        "name": "my-metrics",
        "items": [{"key": "dcgm-metrics.csv", "path": "dcgm-metrics.csv"}],
    }
    assert mounts_of(ctr(ds, CTR))["/etc/dcgm-exporter/dcgm-metrics.csv"] == "metrics-config"
    assert env_of(ctr(ds, CTR))["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"


SEED_CSV = (
    "# GPU utilization\n"
    "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization\n"
    "# Memory usage\n"
    "DCGM_FI_DEV_FB_USED, gauge, GPU memory used\n"
    "DCGM_FI_DEV_FB_FREE, gauge, GPU memory free\n"
)


def custom(keys: dict[str, str], name: str = "dcgm-exporter-config") -> Any:
    return make_facts(config_map_keys={name: tuple(sorted(keys))}, config_map_data={name: keys})


def test_a_valid_custom_counters_config_map_renders() -> None:
    objects = render(
        custom({"dcgm-metrics.csv": SEED_CSV}),
        dcgmExporter={"config": {"name": "dcgm-exporter-config"}},
    )
    assert find(objects, "DaemonSet")


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        (None, "spec.dcgmExporter.config.name: ConfigMap dcgm-exporter-config not found in "
               "namespace gpu-operator: create ConfigMap dcgm-exporter-config in namespace "
               "gpu-operator with key dcgm-metrics.csv"),
        # The seed document's key: upstream mounts only dcgm-metrics.csv (FailedMount otherwise).
        ({"metrics.csv": SEED_CSV},
         "spec.dcgmExporter.config.name: ConfigMap dcgm-exporter-config in namespace "
         "gpu-operator has no key dcgm-metrics.csv (its keys: metrics.csv): the DCGM exporter "
         "reads key dcgm-metrics.csv only: rename key metrics.csv to dcgm-metrics.csv"),
    ],
)  # fmt: skip
def test_a_missing_or_misnamed_config_map_is_checked_with_every_other_reference(
    facts: dict[str, str] | None, message: str
) -> None:
    # Presence and keys are the reference table's (validate_refs), checked before any state
    # renders by the controller, render and images alike; the state waits with this message.
    policy = make_policy(dcgmExporter={"config": {"name": "dcgm-exporter-config"}})
    report = validate_refs.check_facts(policy, custom(facts) if facts else make_facts())
    assert report.blocked == {dcgm_exporter.NAME: message}


def test_a_bad_csv_line_is_reported_with_config_map_key_and_line() -> None:
    bad = SEED_CSV + "DCGM_FI_DEV_GPU_TEMPERATURE, gauge, temperature\n"
    with pytest.raises(RenderError) as caught:
        render(
            custom({"dcgm-metrics.csv": bad}),
            dcgmExporter={"config": {"name": "dcgm-exporter-config"}},
        )
    assert str(caught.value) == (
        "spec.dcgmExporter.config.name: ConfigMap dcgm-exporter-config in namespace gpu-operator "
        "key dcgm-metrics.csv: line 6: unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPERATURE' "
        "(did you mean DCGM_FI_DEV_GPU_TEMP?): "
        "'DCGM_FI_DEV_GPU_TEMPERATURE, gauge, temperature'"
    )


def test_unknown_contents_skip_the_line_check() -> None:
    # Offline rendering knows a ConfigMap's keys, not always its contents.
    facts = make_facts(config_map_keys={"m": ("dcgm-metrics.csv",)})
    assert find(render(facts, dcgmExporter={"config": {"name": "m"}}), "DaemonSet")


@pytest.mark.parametrize(("dcgm_on", "expected"), [(True, "nvidia-dcgm:5555"), (False, None)])
def test_remote_host_engine(dcgm_on: bool, expected: str | None) -> None:
    ds = find(render(dcgm={"enabled": dcgm_on}), "DaemonSet")
    assert env_of(ctr(ds, CTR)).get("DCGM_REMOTE_HOSTENGINE_INFO") == expected
    assert "hostNetwork" not in pod(ds)


@pytest.mark.parametrize(
    "exporter",
    [
        {"enablePodLabels": True},
        {"enablePodUID": True},
        {"env": [{"name": "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "value": "true"}]},
    ],
)
def test_read_pods_rbac_gate(exporter: dict[str, Any]) -> None:
    objects = render(dcgmExporter=exporter)
    role = find(objects, "ClusterRole", "nvidia-dcgm-exporter-read-pods")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = find(objects, "ClusterRoleBinding", "nvidia-dcgm-exporter-read-pods")
    assert binding["subjects"][0]["name"] == "nvidia-dcgm-exporter"
    assert pod(find(objects, "DaemonSet"))["automountServiceAccountToken"] is True


def test_no_api_access_without_pod_attributes() -> None:
    objects = render()
    assert "ClusterRole" not in [k for k, _ in kinds(objects)]
    assert pod(find(objects, "DaemonSet"))["automountServiceAccountToken"] is False


def test_pod_attribute_env_hpc_and_host_pid() -> None:
    exporter = {
        "enablePodLabels": True,
        "enablePodUID": True,
        "podLabelAllowlistRegex": ["^app$", "^team"],
        "hpcJobMapping": {"enabled": True},
        "hostPID": True,
    }
    ds = find(render(dcgmExporter=exporter), "DaemonSet")
    env = env_of(ctr(ds, CTR))
    assert env["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"] == "true"
    assert env["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"] == "true"
    assert env["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"] == "^app$,^team"
    assert env["DCGM_HPC_JOB_MAPPING_DIR"] == "/var/lib/dcgm-exporter/job-mapping"
    assert (
        volumes_of(ds)["hpc-job-mapping"]["hostPath"]["path"]
        == "/var/lib/dcgm-exporter/job-mapping"
    )
    assert pod(ds)["hostPID"] is True


def test_service() -> None:
    service = find(
        render(dcgmExporter={"service": {"type": "NodePort", "internalTrafficPolicy": "Local"}}),
        "Service",
    )
    assert service["spec"]["ports"] == [
        {"name": "gpu-metrics", "port": 9400, "protocol": "TCP", "targetPort": 9400}
    ]
    assert service["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert (service["spec"]["type"], service["spec"]["internalTrafficPolicy"]) == (
        "NodePort",
        "Local",
    )


MONITOR = {
    "enabled": True,
    "interval": "15s",
    "honorLabels": True,
    "scrapeTimeout": "10s",
    "additionalLabels": {"release": "prom"},
    "relabelings": [
        {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
            "action": "replace",
        }
    ],
}


@pytest.mark.parametrize(
    ("crd", "monitor", "present"),
    [
        (True, MONITOR, True),
        (False, MONITOR, False),
        (True, {"enabled": False}, False),
        (True, None, False),
    ],
)
def test_service_monitor_needs_crd_and_opt_in(
    crd: bool, monitor: dict[str, Any] | None, present: bool
) -> None:
    exporter = {"serviceMonitor": monitor} if monitor else {}
    objects = render(make_facts(has_servicemonitor_crd=crd), dcgmExporter=exporter)
    assert ("ServiceMonitor" in [k for k, _ in kinds(objects)]) is present


def test_service_monitor_edits() -> None:
    objects = render(
        make_facts(has_servicemonitor_crd=True, namespace="gpu"),
        dcgmExporter={"serviceMonitor": MONITOR},
    )
    monitor = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu"]}
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "gpu-metrics",
            "path": "/metrics",
            "interval": "15s",
            "scrapeTimeout": "10s",
            "honorLabels": True,
            "relabelings": [
                {
                    "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                    "targetLabel": "node",
                    "action": "replace",
                }
            ],
        }
    ]


def test_dcgm_service_is_node_local() -> None:
    objects = dcgm.render(make_policy(), make_facts())
    service = find(objects, "Service", "nvidia-dcgm")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["ports"][0]["port"] == 5555
    assert (
        find(objects, "DaemonSet", "nvidia-dcgm")["spec"]["template"]["spec"]["runtimeClassName"]
        == "nvidia"
    )


@pytest.mark.parametrize(("value", "mounted"), [("gpu-operator:metrics", True), ("none", False)])
def test_a_counters_config_map_read_through_the_api_mounts_the_token_only(
    value: str, mounted: bool
) -> None:
    env = [{"name": "DCGM_EXPORTER_CONFIGMAP_DATA", "value": value}]
    objects = render(dcgmExporter={"env": env})
    assert pod(find(objects, "DaemonSet"))["automountServiceAccountToken"] is mounted
    # Its Role reads ConfigMaps in the namespace already; pods cluster-wide stay unreadable.
    assert "ClusterRole" not in [k for k, _ in kinds(objects)]


def test_exporter_annotations_go_on_the_pods_only() -> None:
    ds = find(render(dcgmExporter={"annotations": {"example.com/scrape": "yes"}}), "DaemonSet")
    assert ds["spec"]["template"]["metadata"]["annotations"]["example.com/scrape"] == "yes"
    assert "example.com/scrape" not in ds["metadata"].get("annotations", {})


def _monitor(labels: dict[str, str] | None = None, crd: bool = False, **monitor: Any) -> Any:
    policy = make_policy(dcgmExporter={"serviceMonitor": {"enabled": True, **monitor}})
    policy.metadata["labels"] = labels or {}
    return dcgm_exporter.service_monitor_skipped(policy, make_facts(has_servicemonitor_crd=crd))


HELM = {"app.kubernetes.io/managed-by": "Helm"}


def test_a_service_monitor_without_its_crd_is_said_a_warning_when_asked_for() -> None:
    # Issue 30 item 8: never skipped silently. A ClusterPolicy written by hand asked for it.
    skipped = _monitor()
    assert skipped is not None
    assert skipped.explicit
    assert skipped.message == (
        "dcgmExporter.serviceMonitor.enabled is true but the CRD "
        "servicemonitors.monitoring.coreos.com (Prometheus Operator) is not installed: no "
        "ServiceMonitor is created; the metrics are still served by Service nvidia-dcgm-exporter "
        "on port 9400 (gpu-metrics). Install the Prometheus Operator's CRDs and the operator "
        "creates the ServiceMonitor, or set dcgmExporter.serviceMonitor.enabled=false"
    )


def test_a_charts_default_service_monitor_without_its_crd_is_a_note() -> None:
    # Both charts (ours, NVIDIA's 26.7) default serviceMonitor.enabled to true.
    skipped = _monitor(HELM)
    assert skipped is not None
    assert not skipped.explicit
    assert "enabled is true (the chart's default) but the CRD" in skipped.message
    # Labels or relabelings for a Prometheus to select it: the user meant it.
    customised = _monitor(HELM, additionalLabels={"release": "prometheus"})
    assert customised is not None
    assert customised.explicit


def test_nothing_is_said_with_the_crd_or_without_a_service_monitor() -> None:
    assert _monitor(crd=True) is None
    policy = make_policy(dcgmExporter={"serviceMonitor": {"enabled": False}})
    assert dcgm_exporter.service_monitor_skipped(policy, make_facts()) is None
    off = make_policy(dcgmExporter={"enabled": False, "serviceMonitor": {"enabled": True}})
    assert dcgm_exporter.service_monitor_skipped(off, make_facts()) is None
