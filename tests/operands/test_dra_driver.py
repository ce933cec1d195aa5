"""Render parity of a GPUCluster's states with NVIDIA's 26.x operator, as its golden files for
state-dra-driver, state-dcgm, state-dcgm-exporter and state-dra-validation show them (names,
images, commands and env names, volumes and host paths, probes and ports, DeviceClass selectors,
the ResourceSlice admission policy, admin-access claims)."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.operands import dra_driver
from gpu_operator.operands.facts import ClusterFacts

NS = "test-operator"
DRA_IMAGE = "nvcr.io/nvidia/k8s-dra-driver-gpu:v0.1.0"
IMAGES = {
    **dict.fromkeys(IMAGE_ENV.values(), "r/other:1"),
    "VALIDATOR_IMAGE": "nvcr.io/nvidia/gpu-operator-validator:test",
    "DCGM_IMAGE": "nvcr.io/nvidia/cloud-native/dcgm:test",
    "DCGM_EXPORTER_IMAGE": "nvcr.io/nvidia/k8s/dcgm-exporter:test",
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def cluster(**spec: Any) -> GPUCluster:
    dra = {
        "repository": "nvcr.io/nvidia", "image": "k8s-dra-driver-gpu", "version": "v0.1.0",
        "featureGates": {"AdminAccess": False, "MPSSupport": True},
        "computeDomains": {"enabled": False},
    }  # fmt: skip
    return GPUCluster.model_validate({
        "metadata": {"name": "gpu-cluster"},
        "spec": {"draDriver": dra, "daemonsets": {"tolerations": [GPU_TOLERATION]}, **spec},
    })  # fmt: skip


def rendered(**spec: Any) -> dict[str, list[dict[str, Any]]]:
    facts = ClusterFacts(namespace=NS, operator_env=IMAGES)
    return {state: list(objs) for state, objs in dra_driver.render(cluster(**spec), facts).states}


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def kinds_and_names(objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objs]


def env_names(ctr: dict[str, Any]) -> list[str]:
    return [e["name"] for e in ctr.get("env", [])]


def test_states_come_in_upstreams_order() -> None:
    assert dra_driver.STATES == (
        "state-dra-driver", "state-dcgm", "state-dcgm-exporter", "state-dra-validation",
    )  # fmt: skip
    assert list(rendered()) == list(dra_driver.STATES)


def test_gpus_only_driver_objects_in_order() -> None:
    plugin = "nvidia-dra-driver-kubeletplugin"
    assert kinds_and_names(rendered()["state-dra-driver"]) == [
        ("ServiceAccount", plugin),
        ("Role", f"{plugin}-mps"),
        ("RoleBinding", f"{plugin}-mps"),
        ("Role", f"{plugin}-driver-validation"),
        ("RoleBinding", f"{plugin}-driver-validation"),
        ("ClusterRole", plugin),
        ("ClusterRoleBinding", plugin),
        ("DeviceClass", "gpu.nvidia.com"),
        ("DeviceClass", "mig.nvidia.com"),
        ("DeviceClass", "vfio.gpu.nvidia.com"),
        ("DaemonSet", "nvidia-dra-driver-kubelet-plugin"),
        ("ValidatingAdmissionPolicy", "resourceslices-policy-nvidia-dra-driver"),
        ("ValidatingAdmissionPolicyBinding", "resourceslices-policy-nvidia-dra-driver"),
    ]


def test_device_class_selectors() -> None:
    objs = rendered()["state-dra-driver"]
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig"),
                       ("vfio.gpu.nvidia.com", "vfio")):  # fmt: skip
        (selector,) = one(objs, "DeviceClass", name)["spec"]["selectors"]
        assert selector["cel"]["expression"] == (
            "device.driver == 'gpu.nvidia.com' && "
            f"device.attributes['gpu.nvidia.com'].type == '{kind}'"
        )


def test_kubelet_plugin_daemonset() -> None:
    ds = one(rendered()["state-dra-driver"], "DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "nvidia-dra-driver-kubeletplugin"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dra-driver": "true"}
    assert pod["tolerations"] == [GPU_TOLERATION]
    (gpus,) = pod["containers"]  # no compute-domains container with computeDomains off
    assert (gpus["name"], gpus["image"]) == ("gpus", DRA_IMAGE)
    assert gpus["securityContext"] == {"privileged": True}
    assert env_names(gpus) == [
        "HTTP_ENDPOINT", "METRICS_PATH", "LOG_VERBOSITY", "MASK_NVIDIA_DRIVER_PARAMS",
        "NVIDIA_VISIBLE_DEVICES", "CDI_ROOT", "HOST_ROOT", "NVIDIA_MIG_CONFIG_DEVICES",
        "NODE_NAME", "NAMESPACE", "IMAGE_NAME", "KUBELET_REGISTRAR_DIRECTORY_PATH",
        "KUBELET_PLUGINS_DIRECTORY_PATH", "HEALTHCHECK_PORT", "FEATURE_GATES",
    ]  # fmt: skip
    values = {e["name"]: e.get("value") for e in gpus["env"]}
    assert values["HTTP_ENDPOINT"] == ":8080"
    assert values["HEALTHCHECK_PORT"] == "51516"
    assert values["FEATURE_GATES"] == "AdminAccess=false,MPSSupport=true"
    check = {"port": 51516, "service": "liveness"}
    assert gpus["livenessProbe"] == {
        "grpc": check, "failureThreshold": 3, "periodSeconds": 30, "timeoutSeconds": 10,
    }  # fmt: skip
    assert gpus["startupProbe"] == {
        "grpc": check, "failureThreshold": 600, "periodSeconds": 1, "timeoutSeconds": 10,
    }  # fmt: skip
    (init,) = pod["initContainers"]
    assert (init["name"], init["image"]) == (
        "driver-validation", "nvcr.io/nvidia/gpu-operator-validator:test",
    )  # fmt: skip
    assert env_names(init) == [
        "COMPONENT", "WITH_WAIT", "DRIVER_VALIDATION_SKIP_GPU_INIT",
        "DISABLE_DEV_CHAR_SYMLINK_CREATION", "OPERATOR_NAMESPACE", "HOST_ROOT",
        "DRIVER_INSTALL_DIR", "DRIVER_INSTALL_DIR_CTR_PATH",
    ]  # fmt: skip
    assert [v["hostPath"]["path"] for v in pod["volumes"]] == [
        "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi", "/",
        "/run/nvidia/driver", "/run/nvidia/validations",
    ]  # fmt: skip
    mounts = {m["mountPath"]: m for m in gpus["volumeMounts"]}
    assert mounts["/var/lib/kubelet/plugins"]["mountPropagation"] == "Bidirectional"
    assert "/var/lib/kubelet/plugins_registry" in mounts


def test_resource_slice_admission_policy() -> None:
    objs = rendered()["state-dra-driver"]
    spec = one(objs, "ValidatingAdmissionPolicy", "resourceslices-policy-nvidia-dra-driver")["spec"]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:test-operator:'
        'nvidia-dra-driver-kubeletplugin"'
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["userNodeName"] == (
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"
    )
    assert variables["objectNodeName"] == (
        '(request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")'
    )
    assert [v["expression"] for v in spec["validations"]] == [
        'variables.userNodeName != ""',
        "variables.userNodeName == variables.objectNodeName || variables.allNodesValue == true"
        " || variables.nodeSelectorValue != null",
    ]
    policy = "resourceslices-policy-nvidia-dra-driver"
    binding = one(objs, "ValidatingAdmissionPolicyBinding", policy)
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_validation_state() -> None:
    objs = rendered()["state-dra-validation"]
    assert kinds_and_names(objs) == [
        ("ServiceAccount", "nvidia-dra-validator"),
        ("ResourceClaimTemplate", "nvidia-dra-validator-gpu"),
        ("DaemonSet", "nvidia-dra-validator"),
    ]
    (request,) = objs[1]["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "validation-gpu"
    assert request["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "adminAccess": True,
    }  # fmt: skip
    pod = objs[2]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["name"] == "gpu-validation"
    assert "nvidia-smi -L" in init["command"]
    assert init["resources"] == {"claims": [{"name": "validation-gpu"}]}
    assert pod["resourceClaims"] == [
        {"name": "validation-gpu", "resourceClaimTemplateName": "nvidia-dra-validator-gpu"}
    ]


def test_dcgm_and_exporter_are_off_unless_asked() -> None:
    """Upstream: the standalone host engine only with `dcgm.enabled: true`; the exporter only with
    a `dcgmExporter` section not switched off."""
    states = rendered()
    assert states["state-dcgm"] == states["state-dcgm-exporter"] == []
    states = rendered(dcgm={}, dcgmExporter={"enabled": False})
    assert states["state-dcgm"] == states["state-dcgm-exporter"] == []


def test_dcgm_host_engine() -> None:
    objs = rendered(dcgm={"enabled": True})["state-dcgm"]
    name = "nvidia-dcgm-dra"
    assert kinds_and_names(objs) == [
        ("ServiceAccount", name), ("Role", name), ("RoleBinding", name),
        ("ResourceClaimTemplate", "nvidia-dcgm-admin"), ("DaemonSet", name), ("Service", name),
    ]  # fmt: skip
    assert objs[1]["rules"] == [{
        "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
        "verbs": ["get", "list", "watch"],
    }]  # fmt: skip
    (request,) = objs[3]["spec"]["spec"]["devices"]["requests"]
    assert request == {"name": "admin-gpus", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True,
    }}  # fmt: skip
    ds = objs[4]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dcgm-dra": "true"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == name
    assert pod["tolerations"] == [GPU_TOLERATION]
    assert pod["resourceClaims"] == [
        {"name": "admin-gpus", "resourceClaimTemplateName": "nvidia-dcgm-admin"}
    ]
    assert "initContainers" not in pod  # no toolkit-ready wait: GPUs come by CDI
    assert "runtimeClassName" not in pod
    (ctr,) = pod["containers"]
    assert ctr["name"] == "nvidia-dcgm-ctr"
    assert ctr["image"] == "nvcr.io/nvidia/cloud-native/dcgm:test"
    assert "command" not in ctr  # the image's entrypoint
    assert ctr["ports"][0]["containerPort"] == 5555
    assert ctr["livenessProbe"] == {"tcpSocket": {"port": 5555}, "initialDelaySeconds": 15}
    assert ctr["resources"] == {"claims": [{"name": "admin-gpus"}]}
    service = objs[5]["spec"]
    assert (service["type"], service["internalTrafficPolicy"]) == ("ClusterIP", "Local")
    assert service["ports"][0]["port"] == 5555


def test_exporter_embedded_and_remote() -> None:
    objs = rendered(dcgmExporter={})["state-dcgm-exporter"]
    name = "nvidia-dcgm-exporter-dra"
    read_pods = "nvidia-dcgm-exporter-dra-read-pods"
    assert kinds_and_names(objs) == [
        ("ServiceAccount", name), ("Role", name), ("ClusterRole", read_pods),
        ("RoleBinding", name), ("ClusterRoleBinding", read_pods),
        ("ResourceClaimTemplate", "nvidia-dcgm-exporter-admin"), ("Service", name),
        ("DaemonSet", name),
    ]  # fmt: skip
    assert objs[2]["rules"][1]["resources"] == ["resourceslices"]
    assert objs[4]["subjects"][0]["name"] == name
    assert objs[6]["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    pod = objs[7]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dcgm-exporter-dra": "true"}
    assert pod["automountServiceAccountToken"] is True
    assert "initContainers" not in pod
    assert pod["volumes"] == [
        {"name": "pod-gpu-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}
    ]
    (ctr,) = pod["containers"]
    assert (ctr["name"], ctr["image"]) == (name, "nvcr.io/nvidia/k8s/dcgm-exporter:test")
    assert env_names(ctr) == [
        "DCGM_EXPORTER_LISTEN", "DCGM_EXPORTER_KUBERNETES", "DCGM_EXPORTER_COLLECTORS",
        "NODE_NAME", "KUBERNETES_ENABLE_DRA",
    ]  # fmt: skip
    assert ctr["resources"] == {"claims": [{"name": "admin-gpus"}]}
    assert ctr["livenessProbe"]["periodSeconds"] == 5
    # With the standalone host engine the exporter talks to it, before the DRA switch.
    pod = rendered(dcgm={"enabled": True}, dcgmExporter={"env": [{"name": "X", "value": "1"}]})[
        "state-dcgm-exporter"
    ][7]["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert env_names(ctr)[4:] == ["DCGM_REMOTE_HOSTENGINE_INFO", "KUBERNETES_ENABLE_DRA", "X"]
    assert ctr["env"][4]["value"] == "nvidia-dcgm-dra:5555"


def test_exporter_follows_the_kubelet_root_and_metrics_config() -> None:
    objs = rendered(
        dcgmExporter={"config": {"name": "metrics"}},
        hostPaths={"kubeletRootDir": "/var/lib/k0s/kubelet"},
    )["state-dcgm-exporter"]
    pod = objs[-1]["spec"]["template"]["spec"]
    paths = {v["name"]: v for v in pod["volumes"]}
    assert paths["pod-gpu-resources"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    assert paths["metrics-config"]["configMap"]["name"] == "metrics"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"


def builtin_plugin(**spec: Any) -> dict[str, Any]:
    """The kubelet-plugin DaemonSet's pod when draDriver's image is the operator image."""
    facts = ClusterFacts(
        namespace=NS, operator_env={**IMAGES, "OPERATOR_IMAGE": "registry.local/gpu-operator:v1"}
    )
    dra = {"repository": "registry.local", "image": "gpu-operator", "version": "v1",
           "computeDomains": {"enabled": False}}  # fmt: skip
    gc = GPUCluster.model_validate(
        {"metadata": {"name": "gpu-cluster"}, "spec": {"draDriver": dra, **spec}}
    )
    objs = dict(dra_driver.render(gc, facts).states)["state-dra-driver"]
    ds = one(list(objs), "DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def test_our_plugin_mounts_the_kubelets_pod_resources_for_the_hand_over() -> None:
    """Our builtin plugin (not NVIDIA's: the parity test above has no such mount) gets the
    kubelet's pod-resources directory, read-only, where it looks for the socket, so the
    hand-over from the device plugin can leave out GPUs still held (docs/dra.md)."""
    for root in ("/var/lib/kubelet", "/var/lib/k0s/kubelet"):
        pod = builtin_plugin(hostPaths={"kubeletRootDir": root})
        (gpus,) = pod["containers"]
        assert gpus["command"] == list(dra_driver.BUILTIN_COMMAND)
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["pod-resources"]["hostPath"] == {"path": f"{root}/pod-resources"}
        mounts = {m["name"]: m for m in gpus["volumeMounts"]}
        assert mounts["pod-resources"]["mountPath"] == f"{root}/pod-resources"
        assert mounts["pod-resources"]["readOnly"] is True
        env = {e["name"]: e.get("value") for e in gpus["env"]}
        assert env["KUBELET_ROOT_DIR"] == root  # where the agent looks (its --kubelet-root)
    # NVIDIA's image: no such volume.
    pod = one(rendered()["state-dra-driver"], "DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    names = {v["name"] for v in pod["spec"]["template"]["spec"]["volumes"]}
    assert "pod-resources" not in names
