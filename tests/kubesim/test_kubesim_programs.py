"""Programs inside containers (kubesim.programs): run as a container's command, found by
`kubectl exec`, present only where their predicate says; absent ones fail like runc."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kubesim_helpers import KUBECTL, kubectl, needs_kubectl
from waiting import eventually, within

import kubesim
from kubesim import ContainerView, PodContext, ProgramRun


def _pod(name: str, *, env: dict[str, str] | None = None, **container: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "main", "image": "example/cuda:12", **container}
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [spec]},
    }


def _with_tools(view: ContainerView) -> bool:
    return view.env.get("TOOLS") == "yes"


async def _greet(run: ProgramRun) -> int:
    where = "exec" if run.exec else "command"
    run.stdout.write(f"hello from {run.argv[0]} ({where}) in {run.view.container_name}\n")
    if len(run.argv) > 1:
        run.stderr.write(f"exiting {run.argv[1]}\n")
        return int(run.argv[1])
    return 0


def _register(sim: kubesim.Cluster) -> None:
    sim.register_program("greet", _greet, available=_with_tools)


def _phase(sim: kubesim.Cluster, name: str) -> str:
    pod = sim.store.get("pods", name, "default") or {}
    return str((pod.get("status") or {}).get("phase", ""))


def _terminated(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    pod = sim.store.get("pods", name, "default") or {}
    [status] = pod["status"]["containerStatuses"]
    return dict(status["state"]["terminated"])


async def _finished(sim: kubesim.Cluster, name: str) -> str:
    await eventually(
        lambda: _phase(sim, name) in ("Succeeded", "Failed"),
        f"pod {name} finished",
        state=lambda: _phase(sim, name),
    )
    return _phase(sim, name)


@needs_kubectl
async def test_a_command_naming_a_present_program_runs_it_and_logs_its_output(
    sim: kubesim.Cluster,
) -> None:
    _register(sim)
    await kubectl(
        sim, "run", "hi", "--restart=Never", "--image=example/cuda:12", "--env=TOOLS=yes",
        "--", "greet",
    )  # fmt: skip
    assert await _finished(sim, "hi") == "Succeeded"
    assert await kubectl(sim, "logs", "hi") == "hello from greet (command) in hi\n"


async def test_a_program_exit_code_decides_the_pod_phase(sim: kubesim.Cluster) -> None:
    _register(sim)
    sim.store.create(_pod("fails", env={"TOOLS": "yes"}, command=["/usr/bin/greet", "3"]))
    assert await _finished(sim, "fails") == "Failed"
    terminated = _terminated(sim, "fails")
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")


@needs_kubectl
async def test_an_absent_program_fails_to_start_like_runc(sim: kubesim.Cluster) -> None:
    _register(sim)
    sim.store.create(_pod("bare", command=["greet"]))
    assert await _finished(sim, "bare") == "Failed"
    terminated = _terminated(sim, "bare")
    assert terminated["exitCode"] == 128
    assert terminated["reason"] == "StartError"
    assert terminated["message"].endswith(
        'error during container init: exec: "greet": executable file not found in $PATH: unknown'
    )
    assert "StartError" in await kubectl(sim, "get", "pod", "bare")
    events = await kubectl(sim, "get", "events", "--field-selector", "reason=Failed")
    assert "Error: failed to create containerd task: failed to create shim task" in events


async def test_unregistered_commands_still_just_finish(sim: kubesim.Cluster) -> None:
    _register(sim)
    sim.store.create(_pod("other", command=["python3", "-c", "pass"]))
    assert await _finished(sim, "other") == "Succeeded"
    assert _terminated(sim, "other")["reason"] == "Completed"


async def test_without_a_command_args_name_the_program(sim: kubesim.Cluster) -> None:
    _register(sim)
    sim.store.create(_pod("args", env={"TOOLS": "yes"}, args=["greet", "0"]))
    assert await _finished(sim, "args") == "Succeeded"


async def _serving(sim: kubesim.Cluster, name: str) -> None:
    def running() -> bool:
        pod = sim.store.get("pods", name, "default") or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return bool(statuses) and "running" in (statuses[0].get("state") or {})

    await eventually(
        running,
        f"pod {name} running",
        state=lambda: ((sim.store.get("pods", name, "default") or {}).get("status") or {}).get(
            "containerStatuses"
        ),
    )


async def _kubectl_exec(sim: kubesim.Cluster, *args: str) -> tuple[int, str]:
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path)}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "exec", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


@needs_kubectl
async def test_kubectl_exec_finds_a_present_program_and_not_an_absent_one(
    sim: kubesim.Cluster,
) -> None:
    _register(sim)
    server = _pod("server", env={"TOOLS": "yes"})
    server["spec"]["restartPolicy"] = "Always"
    sim.store.create(server)
    plain = _pod("plain")
    plain["spec"]["restartPolicy"] = "Always"
    sim.store.create(plain)
    await _serving(sim, "server")
    await _serving(sim, "plain")
    code, out = await _kubectl_exec(sim, "server", "--", "greet")
    assert (code, out) == (0, "hello from greet (exec) in main\n")
    code, out = await _kubectl_exec(sim, "server", "--", "greet", "4")
    assert code == 4
    assert "exiting 4" in out
    code, out = await _kubectl_exec(sim, "plain", "--", "greet")
    assert code == 126
    assert 'exec: "greet": executable file not found in $PATH: unknown' in out


@needs_kubectl
async def test_a_runners_own_exec_entry_wins_and_programs_fill_the_gaps(
    sim: kubesim.Cluster,
) -> None:
    _register(sim)

    async def own(proc: Any) -> int:
        proc.stdout.write("runner's greet\n")
        return 0

    async def runner(ctx: PodContext) -> int:
        ctx.set_exec_handler({"greet": own})
        await asyncio.Event().wait()
        return 0

    async def shell(ctx: PodContext) -> int:
        async def anything(proc: Any) -> int:
            proc.stdout.write(f"shell ran {proc.argv[0]}\n")
            return 0

        ctx.set_exec_handler(anything)
        await asyncio.Event().wait()
        return 0

    sim.register_pod_runner(runner, image="example/own")
    sim.register_pod_runner(shell, image="example/shell")
    sim.store.create(_pod("own", image="example/own", env={"TOOLS": "yes"}))
    sim.store.create(_pod("shell", image="example/shell", env={"TOOLS": "yes"}))
    await _serving(sim, "own")
    await _serving(sim, "shell")
    assert await _kubectl_exec(sim, "own", "--", "greet") == (0, "runner's greet\n")
    assert await _kubectl_exec(sim, "shell", "--", "greet") == (
        0,
        "hello from greet (exec) in main\n",
    )
    assert await _kubectl_exec(sim, "shell", "--", "ls") == (0, "shell ran ls\n")


async def test_an_absolute_symlink_in_an_empty_dir_resolves_through_the_mounts(
    sim: kubesim.Cluster,
) -> None:
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def reader(ctx: PodContext) -> int:
        link = ctx.path("/config") / "config.yaml"
        link.symlink_to("/available/sliced")
        seen.set_result(ctx.path("/config/config.yaml").read_text())
        return 0

    sim.register_pod_runner(reader, image="example/reader")
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "configs", "namespace": "default"},
            "data": {"sliced": "replicas: 4\n"},
        }
    )
    pod = _pod(
        "reader",
        image="example/reader",
        volumeMounts=[
            {"name": "config", "mountPath": "/config"},
            {"name": "available", "mountPath": "/available"},
        ],
    )
    pod["spec"]["volumes"] = [
        {"name": "config", "emptyDir": {}},
        {"name": "available", "configMap": {"name": "configs"}},
    ]
    sim.store.create(pod)
    assert await within(seen, "the reader to read its config") == "replicas: 4\n"
