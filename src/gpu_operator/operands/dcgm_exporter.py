"""State `state-dcgm-exporter`: GPU metrics for Prometheus on port 9400."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_operator import api
from gpu_operator.agents.dcgm_exporter import counters
from gpu_operator.api import enablement
from gpu_operator.operands import common, dcgm
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-dcgm-exporter"
DS_NAME = "nvidia-dcgm-exporter"
SA_NAME = "nvidia-dcgm-exporter"
CTR = "nvidia-dcgm-exporter"
PORT = 9400
PORT_NAME = "gpu-metrics"
READ_PODS = "nvidia-dcgm-exporter-read-pods"
METRICS_KEY = "dcgm-metrics.csv"
METRICS_PATH = f"/etc/dcgm-exporter/{METRICS_KEY}"
# Without a metrics ConfigMap upstream points the exporter at this file of its image.
DEFAULT_COLLECTORS = f"{counters.IMAGE_DIR}/{counters.OPERATOR_DEFAULT_FILE}"
REMOTE_ENGINE = "DCGM_REMOTE_HOSTENGINE_INFO"
POD_LABELS_ENV = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"
POD_UID_ENV = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"
ALLOWLIST_ENV = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"
# The kubelet names DRA-allocated GPUs by (pool, device): the exporter maps them through the
# ResourceSlices to attribute a GPU to its pod (a GPUCluster's exporter sets it).
DRA_ENV = "KUBERNETES_ENABLE_DRA"
# `namespace:name` of a ConfigMap the exporter reads its counters from through the API;
# "none" (the exporter's default) and "" mean no read.
CONFIGMAP_DATA_ENV = "DCGM_EXPORTER_CONFIGMAP_DATA"


def default_metrics_csv() -> str:
    """The counters the exporter collects without a metrics ConfigMap: the exporter image's
    dcp-metrics-included.csv, which upstream's DaemonSet names (shipped with our exporter)."""
    return counters.shipped_text(counters.OPERATOR_DEFAULT_FILE)


def check_metrics_config(policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    """The counters CSV in the ConfigMap named by `dcgmExporter.config.name` must parse with the
    exporter's own rules; RenderError names the ConfigMap, the key and every bad line.

    That the ConfigMap exists and holds key `dcgm-metrics.csv` is checked before any state
    renders, with every other ConfigMap a policy names (validate_refs.py): upstream mounts only
    that key (a ConfigMap volume item), so any other spelling, such as `metrics.csv`, would leave
    the exporter pod in ContainerCreating with FailedMount "configmap references non-existent
    config key".
    """
    check_metrics_csv(metrics_config_map(policy), facts)


def check_metrics_csv(name: str | None, facts: ClusterFacts) -> None:
    """The counters of ConfigMap `name` (`dcgmExporter.config.name` of a ClusterPolicy or a
    GPUCluster) parse, when known; RenderError names every bad line."""
    text = (facts.config_map_data.get(name) or {}).get(METRICS_KEY) if name else None
    if name is None or text is None:
        return  # no custom counters, or their contents are unknown (offline, not given)
    source = (
        f"spec.dcgmExporter.config.name: ConfigMap {name} in namespace {facts.namespace} "
        f"key {METRICS_KEY}"
    )
    try:
        counters.parse(text, source)
    except counters.CsvError as err:
        raise common.RenderError(str(err)) from None


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "dcgmExporter")


def _env_true(spec: api.clusterpolicy.DCGMExporterSpec, name: str) -> bool:
    return any(e.name == name and (e.value or "").lower() == "true" for e in spec.env or ())


def needs_pod_access(policy: api.ClusterPolicy) -> bool:
    """Pod labels or UIDs need the API (the read-pods RBAC gate), via fields or env."""
    spec = policy.spec.dcgmExporter
    return bool(
        spec.enablePodLabels
        or spec.enablePodUID
        or _env_true(spec, POD_LABELS_ENV)
        or _env_true(spec, POD_UID_ENV)
    )


def needs_api_token(policy: api.ClusterPolicy) -> bool:
    """The exporter talks to the API server (its service account token is mounted): for pod
    metadata, or to read a counters ConfigMap named in `DCGM_EXPORTER_CONFIGMAP_DATA`. The latter
    needs no ClusterRole: the exporter's Role already reads ConfigMaps in its namespace."""
    if needs_pod_access(policy):
        return True
    return any(
        e.name == CONFIGMAP_DATA_ENV and (e.value or "") not in ("", "none")
        for e in policy.spec.dcgmExporter.env or ()
    )


def metrics_config_map(policy: api.ClusterPolicy) -> str | None:
    """The user's metrics ConfigMap (`dcgmExporter.config.name`), if any."""
    config = policy.spec.dcgmExporter.config
    return config.name if config and config.name else None


def exporter_container(name: str = CTR) -> Obj:
    """The exporter's container: its env, the pod-resources mount, port 9400 and upstream's
    health probes (a GPUCluster's `nvidia-dcgm-exporter-dra` runs the same one)."""
    # No command: the image's entrypoint starts the exporter, as upstream runs it (the
    # distroless exporter image has no shell to run a command line with).
    main = container(
        name,
        env_vars=[
            env("DCGM_EXPORTER_LISTEN", f":{PORT}"),
            env("DCGM_EXPORTER_KUBERNETES", "true"),
            env("DCGM_EXPORTER_COLLECTORS", DEFAULT_COLLECTORS),
            common.node_name_env(),
        ],
        mounts=[mount("pod-gpu-resources", "/var/lib/kubelet/pod-resources", read_only=True)],
        privileged=True,
    )
    main["ports"] = [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}]
    health = {"httpGet": {"path": "/health", "port": PORT}, "initialDelaySeconds": 45}
    # Upstream's probes: liveness every 5 s, readiness at the default period.
    main["livenessProbe"] = {**health, "periodSeconds": 5}
    main["readinessProbe"] = dict(health)
    return main


def apply_metrics_config(ds: Obj, config_map: str | None) -> None:
    """Point the exporter at key `dcgm-metrics.csv` of the user's counters ConfigMap, mounted."""
    if config_map is None:
        return
    main_ctr = common.main_container(ds)
    set_env(main_ctr, "DCGM_EXPORTER_COLLECTORS", METRICS_PATH)
    item = mount("metrics-config", METRICS_PATH, read_only=True)
    item["subPath"] = METRICS_KEY
    common.add_mount(main_ctr, item)
    common.add_volume(
        ds,
        {
            "name": "metrics-config",
            "configMap": {
                "name": config_map,
                # Upstream mounts this one key: a ConfigMap without it cannot be mounted.
                "items": [{"key": METRICS_KEY, "path": METRICS_KEY}],
            },
        },
    )


def apply_exporter_options(
    ds: Obj, exporter: api.clusterpolicy.DCGMExporterSpec, *, remote: str | None, dra: bool = False
) -> None:
    """The exporter section's switches: the remote host engine, hostPID, HPC job mapping, pod
    labels/UID, the label allowlist and pod annotations. `dra`: GPUs come through DRA claims, so
    the exporter resolves the kubelet's (pool, device) names from ResourceSlices."""
    ctr = common.main_container(ds)
    pod = common.pod_spec(ds)
    if remote:
        set_env(ctr, REMOTE_ENGINE, remote)
    if exporter.hostPID:
        pod["hostPID"] = True
    hpc = exporter.hpcJobMapping
    if hpc and hpc.enabled:
        set_env(ctr, "DCGM_HPC_JOB_MAPPING_DIR", hpc.directory)
        common.add_volume(ds, host_path("hpc-job-mapping", hpc.directory, "DirectoryOrCreate"))
        common.add_mount(ctr, mount("hpc-job-mapping", hpc.directory, read_only=True))
    if dra:
        set_env(ctr, DRA_ENV, "true")
    if exporter.enablePodLabels:
        set_env(ctr, POD_LABELS_ENV, "true")
    if exporter.enablePodUID:
        set_env(ctr, POD_UID_ENV, "true")
    if exporter.podLabelAllowlistRegex:
        set_env(ctr, ALLOWLIST_ENV, ",".join(exporter.podLabelAllowlistRegex))
    if exporter.annotations:
        ds["spec"]["template"]["metadata"].setdefault("annotations", {}).update(
            exporter.annotations
        )


def _base(policy: api.ClusterPolicy, facts: ClusterFacts) -> Obj:
    kubelet = enablement.host_paths(policy.spec).kubeletRootDir.rstrip("/")
    main = exporter_container()
    ds = common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="dcgm-exporter",
        service_account_name=SA_NAME,
        main=[main],
        inits=[common.toolkit_ready_init()],
        volumes=[
            host_path("pod-gpu-resources", f"{kubelet}/pod-resources"),
            common.run_nvidia_volume(kind=None),
        ],
    )
    common.pod_spec(ds)["automountServiceAccountToken"] = False
    apply_metrics_config(ds, metrics_config_map(policy))
    return ds


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec
    exporter = spec.dcgmExporter
    ctr = common.main_container(ds)
    remote = f"{dcgm.DS_NAME}:{dcgm.PORT}" if enablement.is_enabled(spec, "dcgm") else None
    apply_exporter_options(ds, exporter, remote=remote)
    if needs_api_token(policy):
        common.pod_spec(ds)["automountServiceAccountToken"] = True
    common.apply_runtime_class(ds, policy, facts)
    common.apply_operand_spec(ds, exporter, "dcgmExporter", facts)
    # An embedded host engine reached on localhost only works on the host's network.
    remote = common.get_env(ctr, REMOTE_ENGINE) or ""
    if remote.startswith("localhost"):
        common.set_host_network(ds)


SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
# The label a Helm chart puts on what it renders: ours and NVIDIA's ClusterPolicy carry it.
_MANAGED_BY = "app.kubernetes.io/managed-by"


@dataclass(frozen=True)
class MonitorSkipped:
    """`dcgmExporter.serviceMonitor.enabled` without the prometheus-operator's CRD: what to say,
    and whether the user asked for it (`explicit`: a Warning) or a chart default did (a note)."""

    message: str
    explicit: bool


def service_monitor_skipped(
    policy: api.ClusterPolicy, facts: ClusterFacts
) -> MonitorSkipped | None:
    """Why no ServiceMonitor is rendered although one is enabled; None when one is, or none is
    wanted.

    The operator cannot see where a value came from. Both charts (ours and NVIDIA's 26.7) default
    `serviceMonitor.enabled` to true, so in a ClusterPolicy a Helm chart rendered it is taken as
    that default, unless the user also customised the ServiceMonitor (additional labels or
    relabelings: they expect a Prometheus to use it). Any other ClusterPolicy asked for it."""
    monitor = policy.spec.dcgmExporter.serviceMonitor
    if facts.has_servicemonitor_crd or monitor is None or not monitor.enabled:
        return None
    if not enabled(policy, facts):
        return None
    labels = policy.metadata.get("labels")
    from_chart = isinstance(labels, dict) and labels.get(_MANAGED_BY) == "Helm"
    customised = bool(monitor.additionalLabels or monitor.relabelings)
    explicit = not from_chart or customised
    origin = "" if explicit else " (the chart's default)"
    message = (
        f"dcgmExporter.serviceMonitor.enabled is true{origin} but the CRD {SERVICE_MONITOR_CRD} "
        f"(Prometheus Operator) is not installed: no ServiceMonitor is created; the metrics are "
        f"still served by Service {DS_NAME} on port {PORT} ({PORT_NAME}). Install the Prometheus "
        "Operator's CRDs and the operator creates the ServiceMonitor, or set "
        "dcgmExporter.serviceMonitor.enabled=false"
    )
    return MonitorSkipped(message, explicit)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """RBAC (+ read-pods gate), metrics ConfigMap, DaemonSet, Service and maybe a ServiceMonitor."""
    check_metrics_config(policy, facts)
    exporter = policy.spec.dcgmExporter
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        # Upstream's Role: the exporter reads ConfigMaps in its namespace (pods only through the
        # read-pods ClusterRole, when pod metadata is wanted).
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule([""], ["configmaps"], ("get", "list")),
        ],
        labels={"app": DS_NAME},
    )
    if needs_pod_access(policy):
        objects += common.rbac(
            READ_PODS,
            NAME,
            facts,
            cluster_rules=[common.rule([""], ["pods"], common.READ)],
            labels={"app": DS_NAME},
        )[1:]
        # The role binds the exporter's own service account, not a second one.
        for obj in objects[-2:]:
            if obj["kind"] == "ClusterRoleBinding":
                obj["subjects"][0]["name"] = SA_NAME
    ds = _base(policy, facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    service = exporter.service
    objects.append(
        common.service(
            DS_NAME,
            NAME,
            facts,
            port=PORT,
            port_name=PORT_NAME,
            service_type=service.type if service else None,
            internal_traffic_policy=service.internalTrafficPolicy if service else None,
            annotations={"prometheus.io/scrape": "true"},
        )
    )
    monitor = exporter.serviceMonitor
    if facts.has_servicemonitor_crd and monitor is not None and monitor.enabled:
        objects.append(
            common.service_monitor(
                DS_NAME, NAME, facts, port_name=PORT_NAME, settings=monitor, job_label="app"
            )
        )
    return objects
