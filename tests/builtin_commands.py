"""The programs the operand renderers start in containers that run our image, for a chart install
with `agents.builtin=true` (every operand with a builtin agent, the VM-workload ones included).

Shared by tests/agents/test_entrypoints.py (each is an NVIDIA entry point of ours, `gpu-operator`
or a shell utility) and tests/image/test_image.py (each exists in the built image's PATH).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpu_operator import api
from gpu_operator.cli import image_list, render
from gpu_operator.operands import builtin, registry

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gpu-operator"
HELM = ROOT / ".tools" / "bin" / "helm"
# Every operand with a builtin agent turned on (MIG manager, node status exporter, the sandbox
# states with their KubeVirt agents) and a device-plugin config (the config manager).
VALUES = [
    "agents.builtin=true",
    "nodeStatusExporter.enabled=true",
    "dcgmExporter.enabled=true",
    "devicePlugin.config.name=plugin-config",
    "devicePlugin.config.default=any",
    "sandboxWorkloads.enabled=true",
    "vfioManager.enabled=true",
    "vgpuDeviceManager.enabled=true",
    "sandboxDevicePlugin.enabled=true",
]
# Mixed pools: containers, passthrough and vGPU nodes, so every state renders its DaemonSet.
FACTS = {
    "pools": [
        {"name": "a100", "gpu": "A100-SXM4-40GB"},
        {"name": "vm", "gpu": "A100-SXM4-40GB", "workload": "vm-passthrough"},
        {"name": "vgpu", "gpu": "A100-SXM4-40GB", "workload": "vm-vgpu"},
    ]
}
# Shell keywords that start a command, and shell builtins (their whole command is the shell's).
KEYWORDS = frozenset({"until", "do", "done", "while", "if", "then", "else", "fi", "exec", "!"})
BUILTINS = frozenset(
    {"[", "test", "true", "false", "export", "set", ".", "echo", "cd", "exit", "for", "in"}
)


def chart_objects(*sets: str) -> list[dict[str, Any]]:
    args = [str(HELM), "template", "gpu-operator", str(CHART), "--namespace", "gpu-operator"]
    for item in sets:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def rendered_operands(*sets: str) -> list[dict[str, Any]]:
    """The operand objects our operator renders for the chart's ClusterPolicy and env."""
    docs = chart_objects(*VALUES, *sets)
    policy = next(d for d in docs if d.get("kind") == "ClusterPolicy")
    checked = api.check_document(policy)
    assert checked.ok, checked.errors
    assert isinstance(checked.obj, api.ClusterPolicy)
    facts_file = render.parse_facts({**FACTS, "operatorEnv": image_list.operator_env(docs)})
    facts = render.cluster_facts(facts_file, "gpu-operator", config_maps={"plugin-config": ["any"]})
    objects: list[dict[str, Any]] = []
    for state in registry.render_all(checked.obj, facts):
        assert state.error is None, f"{state.name}: {state.error}"
        objects += state.objects
    return objects


def _script_programs(script: str) -> set[str]:
    """The first word of each simple command of a `sh -c` script (shell words dropped)."""
    found = set()
    script = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    for part in re.split(r"[;&|\n]+|\$\(|`", script):
        words = part.strip().split()
        while words and (words[0] in KEYWORDS or "=" in words[0]):
            words = words[1:]
        if words and words[0] not in BUILTINS and not words[0].startswith(("-", "$", "]", ")")):
            found.add(words[0])
    return found


def programs(objects: list[dict[str, Any]], image: str) -> dict[str, set[str]]:
    """Program -> the containers (`DaemonSet/container`) that start it, for containers running
    `image`; entrypoint scripts mounted from the operands' ConfigMaps are read for theirs."""
    scripts: dict[str, str] = {}
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "entrypoint.sh" in (obj.get("data") or {}):
            scripts[obj["metadata"]["name"]] = obj["data"]["entrypoint.sh"]
    found: dict[str, set[str]] = {}
    for obj in objects:
        if obj["kind"] != "DaemonSet":
            continue
        spec = obj["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for ctr in [*(spec.get("initContainers") or []), *spec["containers"]]:
            if builtin.image_name(ctr["image"]) != builtin.image_name(image):
                continue
            where = f"{obj['metadata']['name']}/{ctr['name']}"
            argv = [*(ctr.get("command") or []), *(ctr.get("args") or [])]
            assert argv, f"{where}: runs our image's entrypoint (the operator) by default"
            hooks = [
                h["exec"]["command"] for h in (ctr.get("lifecycle") or {}).values() if "exec" in h
            ]
            names: set[str] = set()
            for command in [argv, *hooks]:
                names |= _programs_of(command, ctr, volumes, scripts)
            for name in names:
                found.setdefault(shlex.split(name)[0], set()).add(where)
    return found


def _programs_of(
    argv: list[str],
    ctr: dict[str, Any],
    volumes: dict[str, dict[str, Any]],
    scripts: dict[str, str],
) -> set[str]:
    if Path(argv[0]).name != "sh" or argv[1:2] != ["-c"]:
        return {Path(argv[0]).name if argv[0].startswith("/") else argv[0]}
    names: set[str] = set()
    for word in argv[2:]:
        if word == "/bin/entrypoint.sh":
            mount = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/bin/entrypoint.sh")
            names |= _script_programs(scripts[volumes[mount["name"]]["configMap"]["name"]])
        else:
            names |= _script_programs(word)
    return names
