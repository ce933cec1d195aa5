"""The validator's real container: programs as processes, LD_PRELOAD in front, termination
message to its file."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_operator.agents.validator import host


def test_added_library_paths_go_in_front() -> None:
    env = host.merged_env({"LD_PRELOAD": "/a.so", "HOME": "/root"}, {"LD_PRELOAD": "/b.so"})
    assert env == {"LD_PRELOAD": "/b.so /a.so", "HOME": "/root"}
    assert host.merged_env({}, {"LD_PRELOAD": "/b.so"}) == {"LD_PRELOAD": "/b.so"}


async def test_a_program_runs_as_a_process_with_its_output_and_code() -> None:
    code = "import os, sys; print(os.environ['X']); sys.stderr.write('err'); sys.exit(3)"
    result = await host.LocalContainer().run([sys.executable, "-c", code], {"X": "seen"})
    assert (result.code, result.stdout, result.stderr) == (3, "seen\n", "err")


async def test_a_missing_program_is_exit_code_127() -> None:
    result = await host.LocalContainer().run(["no-such-program-xyz"])
    assert result.code == 127
    assert "not found in $PATH" in result.stderr


def test_the_termination_message_goes_to_its_file(tmp_path: Path) -> None:
    target = tmp_path / "termination-log"
    host.LocalContainer(str(target)).write_termination_message("driver: not ready\n")
    assert target.read_text() == "driver: not ready\n"
