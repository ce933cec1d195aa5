"""`PodContext.run_program`: a runner runs a program inside its own container, found as
`kubectl exec` finds it, with its output and exit code collected."""

from __future__ import annotations

import asyncio
from typing import Any

from waiting import within

import kubesim
from kubesim import ContainerView, PodContext, ProgramResult, ProgramRun


def _with_tools(view: ContainerView) -> bool:
    return view.env.get("TOOLS") == "yes"


async def _greet(run: ProgramRun) -> int:
    data = await run.stdin.read()
    run.stdout.write(f"hello from {run.argv[0]} in {run.view.container_name}\n")
    if data:
        run.stdout.write(f"read {data.decode()}\n")
    if len(run.argv) > 1:
        run.stderr.write(f"exiting {run.argv[1]}\n")
        return int(run.argv[1])
    return 0


async def _crash(run: ProgramRun) -> int:
    raise RuntimeError("boom")


def _pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "nodeName": "node-1", "containers": [container], **spec},
    }


async def _run_in(
    sim: kubesim.Cluster, pod: dict[str, Any], argv: list[str], stdin: str = ""
) -> ProgramResult:
    """Create the pod with a runner that runs `argv` inside it; returns what it got."""
    got: asyncio.Future[ProgramResult] = asyncio.get_running_loop().create_future()
    image = pod["spec"]["containers"][0]["image"]

    async def runner(ctx: PodContext) -> int:
        got.set_result(await ctx.run_program(argv, stdin=stdin))
        return 0

    sim.register_pod_runner(runner, image=image)
    sim.register_program("greet", _greet, available=_with_tools)
    sim.register_program("crash", _crash)
    sim.store.create(pod)
    return await within(got, f"the program {argv} to run in the pod")


async def test_a_present_program_runs_with_its_output_and_exit_code_collected(
    sim: kubesim.Cluster,
) -> None:
    pod = _pod("tools", "example/tools", container={"env": [{"name": "TOOLS", "value": "yes"}]})
    result = await _run_in(sim, pod, ["greet", "3"], stdin="input")
    assert result == ProgramResult(3, "hello from greet in main\nread input\n", "exiting 3\n")


async def test_an_absent_program_is_not_found_with_exit_code_127(sim: kubesim.Cluster) -> None:
    result = await _run_in(sim, _pod("bare", "example/bare"), ["greet"])
    assert result.code == 127
    assert result.stdout == ""
    assert result.stderr == 'exec: "greet": executable file not found in $PATH\n'


async def test_an_absent_path_is_a_missing_file(sim: kubesim.Cluster) -> None:
    result = await _run_in(sim, _pod("path", "example/path"), ["/usr/bin/greet"])
    assert (result.code, result.stderr) == (
        127,
        "fork/exec /usr/bin/greet: no such file or directory\n",
    )


async def test_a_file_a_volume_brings_makes_the_program_present_at_that_path(
    sim: kubesim.Cluster,
) -> None:
    tools = sim.node_root("node-1") / "opt" / "tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "greet").write_text("#!binary\n")
    pod = _pod(
        "mounted",
        "example/mounted",
        container={"volumeMounts": [{"name": "tools", "mountPath": "/host-tools"}]},
        volumes=[{"name": "tools", "hostPath": {"path": "/opt/tools"}}],
    )
    result = await _run_in(sim, pod, ["/host-tools/bin/greet"])
    assert (result.code, result.stdout) == (0, "hello from /host-tools/bin/greet in main\n")


async def test_a_file_the_volume_lacks_leaves_the_program_absent(sim: kubesim.Cluster) -> None:
    (sim.node_root("node-1") / "opt" / "tools").mkdir(parents=True)
    pod = _pod(
        "empty-mount",
        "example/empty-mount",
        container={"volumeMounts": [{"name": "tools", "mountPath": "/host-tools"}]},
        volumes=[{"name": "tools", "hostPath": {"path": "/opt/tools"}}],
    )
    result = await _run_in(sim, pod, ["/host-tools/bin/greet"])
    assert result.code == 127


async def test_a_crashing_program_exits_1_with_its_traceback_on_stderr(
    sim: kubesim.Cluster,
) -> None:
    result = await _run_in(sim, _pod("crashing", "example/crashing"), ["crash"])
    assert result.code == 1
    assert "RuntimeError: boom" in result.stderr
