"""The product runs without the simulation: with `kubesim`, `simhost` and `gpudemo` made
unimportable, every module of `gpu_operator` imports, and `gpu-operator controller` and every
`gpu-operator agent ...` command (and sub-command) answers `--help`.

Each check runs in a fresh interpreter whose first meta-path finder refuses the blocked packages,
so nothing imported earlier by the test process hides a dependency. The import-linter contract
("The product (gpu_operator) never imports kubesim, simhost or gpudemo") covers imports inside
function bodies; this covers what the installed wheel's entry point really loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SIMULATION = ("kubesim", "simhost", "gpudemo")

_SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, json, pathlib, sys

    BLOCKED = tuple(json.loads(sys.argv[1]))

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{name} is blocked (the product must run without it)")
            return None

    sys.meta_path.insert(0, Refuse())

    failures = {}
    import gpu_operator

    top = pathlib.Path(gpu_operator.__path__[0])
    modules = sorted(
        ".".join(("gpu_operator", *f.relative_to(top).with_suffix("").parts))
        .removesuffix(".__init__")
        for f in top.rglob("*.py")
        if f.name != "__main__.py"  # `python -m` entry points run the CLI when imported
    )
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # report every module, not only the first
            failures[name] = f"{type(exc).__name__}: {exc}"

    helps = []
    if "gpu_operator.cli.main" not in failures:
        import typer.main
        from typer.testing import CliRunner

        from gpu_operator.cli.main import app

        root = typer.main.get_command(app)
        agent = root.commands["agent"]

        def walk(group, prefix):
            for name, command in sorted(group.commands.items()):
                yield [*prefix, name]
                if hasattr(command, "commands"):
                    yield from walk(command, [*prefix, name])

        runner = CliRunner()
        for argv in [["controller"], *walk(agent, ["agent"])]:
            result = runner.invoke(app, [*argv, "--help"])
            helps.append(" ".join(argv))
            if result.exit_code != 0:
                failures[" ".join(argv) + " --help"] = f"exit {result.exit_code}: {result.output}"
            elif result.exception is not None:
                failures[" ".join(argv) + " --help"] = repr(result.exception)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"modules": modules, "helps": helps, "failures": failures, "leaked": leaked}))
    """
)


def _run(blocked: tuple[str, ...]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(blocked)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_the_product_imports_and_its_commands_answer_without_the_simulation() -> None:
    report = _run(SIMULATION)
    assert report["failures"] == {}
    assert report["leaked"] == []
    modules = report["modules"]
    assert isinstance(modules, list)
    assert "gpu_operator.controller.operator" in modules
    assert "gpu_operator.agents.driver_manager.host" in modules
    helps = report["helps"]
    assert isinstance(helps, list)
    assert "controller" in helps
    # Every agent of the node programs is reached (a sample; the walk covers them all).
    for name in ("validator", "device-plugin", "driver-manager", "mig-manager", "vfio-manager"):
        assert f"agent {name}" in helps, helps


def test_the_check_fails_when_the_product_needs_a_blocked_package() -> None:
    # The product needs PyYAML: blocking it must show up as failures, so the check above is
    # not vacuous.
    report = _run(("yaml",))
    failures = report["failures"]
    assert isinstance(failures, dict)
    assert "gpu_operator.cli.main" in failures
    assert any("yaml is blocked" in why for why in failures.values())
