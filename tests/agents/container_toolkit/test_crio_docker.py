"""CRI-O (drop-in and OCI hook modes) and Docker (daemon.json) editors on real-world configs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from gpu_operator.agents.container_toolkit import crio, docker, runtimes
from gpu_operator.agents.container_toolkit.edits import CONFIG, DROP_IN, HOOK, EditError

SAMPLES = Path(__file__).parent / "samples"
RUNTIME_DIR = "/usr/local/nvidia/toolkit"


def handlers(default: bool = True) -> tuple[runtimes.Handler, ...]:
    return runtimes.handlers(RUNTIME_DIR, "nvidia", default)


def test_crio_drop_in_copies_the_default_runtime_and_names_our_binaries() -> None:
    original = (SAMPLES / "crio.conf").read_bytes()
    edit = crio.Crio(crio.Options(handlers())).apply({CONFIG: original}, {})
    assert set(edit.files) == {DROP_IN}  # crio.conf itself is never written
    data = tomllib.loads((edit.files[DROP_IN] or b"").decode())["crio"]["runtime"]
    assert data["default_runtime"] == "nvidia"
    nvidia = data["runtimes"]["nvidia"]
    assert nvidia["runtime_path"] == f"{RUNTIME_DIR}/nvidia-container-runtime"
    assert nvidia["runtime_type"] == "oci"
    # crun is CRI-O's default here: its options are the model.
    assert nvidia["monitor_path"] == "/usr/libexec/crio/conmon"
    assert nvidia["runtime_root"] == "/run/crun"
    assert data["runtimes"]["nvidia-legacy"]["runtime_path"].endswith(".legacy")
    assert "wrote /etc/crio/crio.conf.d/99-nvidia.conf" in edit.changes[0]


def test_crio_default_runtime_only_when_asked_and_revert_deletes_the_drop_in() -> None:
    ed = crio.Crio(crio.Options(handlers(default=False)))
    edit = ed.apply({CONFIG: (SAMPLES / "crio.conf").read_bytes()}, {})
    assert (
        "default_runtime"
        not in tomllib.loads((edit.files[DROP_IN] or b"").decode())["crio"]["runtime"]
    )
    assert ed.revert(edit.files, {}) == {DROP_IN: None}


def test_crio_apply_is_idempotent() -> None:
    ed = crio.Crio(crio.Options(handlers()))
    first = ed.apply({CONFIG: (SAMPLES / "crio.conf").read_bytes()}, {})
    second = ed.apply({CONFIG: (SAMPLES / "crio.conf").read_bytes(), **first.files}, {})
    assert second.files == first.files
    assert second.changes == ()


def test_crio_hook_mode_writes_the_oci_hook_for_every_container() -> None:
    ed = crio.Crio(crio.Options(handlers(), mode="hook"))
    edit = ed.apply({CONFIG: None}, {})
    hook = json.loads((edit.files[HOOK] or b"").decode())
    assert hook["hook"]["path"] == f"{RUNTIME_DIR}/nvidia-container-runtime-hook"
    assert hook["hook"]["args"] == ["nvidia-container-runtime-hook", "prestart"]
    assert hook["hook"]["env"][0].endswith(f":{RUNTIME_DIR}")
    assert hook["when"] == {"always": True, "commands": [".*"]}
    assert hook["stages"] == ["prestart"]
    assert ed.revert(edit.files, {}) == {HOOK: None}


def test_crio_unknown_mode_is_refused_with_the_variable() -> None:
    with pytest.raises(EditError, match="CRIO_CONFIG_MODE: expected config or hook"):
        crio.Crio(crio.Options(handlers(), mode="nri"))


def test_docker_adds_runtimes_default_and_cdi_keeping_every_other_key() -> None:
    original = (SAMPLES / "daemon.json").read_bytes()
    edit = docker.Docker(docker.Options(handlers(), enable_cdi=True)).apply({CONFIG: original}, {})
    before = json.loads(original)
    after = json.loads(edit.files[CONFIG] or b"")
    for key in ("exec-opts", "log-driver", "log-opts", "registry-mirrors"):
        assert after[key] == before[key]
    assert after["runtimes"]["crun"] == before["runtimes"]["crun"]
    assert after["runtimes"]["nvidia"] == {
        "path": f"{RUNTIME_DIR}/nvidia-container-runtime",
        "args": [],
    }
    assert after["default-runtime"] == "nvidia"
    assert after["features"] == {"buildkit": True, "cdi": True}


def test_docker_revert_with_the_prior_gives_the_original_meaning_back() -> None:
    original = (SAMPLES / "daemon.json").read_bytes()
    ed = docker.Docker(docker.Options(handlers(), enable_cdi=True))
    prior = ed.prior({CONFIG: original})
    edit = ed.apply({CONFIG: original}, prior)
    reverted = ed.revert(edit.files, prior)
    assert json.loads(reverted[CONFIG] or b"") == json.loads(original)


def test_docker_apply_does_not_rewrite_a_file_that_already_has_our_settings() -> None:
    ed = docker.Docker(docker.Options(handlers()))
    first = ed.apply({CONFIG: None}, {})
    reformatted = json.dumps(json.loads(first.files[CONFIG] or b"")).encode()
    again = ed.apply({CONFIG: reformatted}, {})
    assert again.files[CONFIG] == reformatted
    assert again.changes == ()


def test_docker_revert_of_a_file_we_created_deletes_it() -> None:
    ed = docker.Docker(docker.Options(handlers(), enable_cdi=True))
    prior = ed.prior({CONFIG: None})
    edit = ed.apply({CONFIG: None}, prior)
    assert ed.revert(edit.files, prior) == {CONFIG: None}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"{", "/etc/docker/daemon.json: not valid JSON"),
        (b"[]", "expected a JSON object at the top level"),
        (b'{"runtimes": []}', "'runtimes' must be a dict"),
    ],
)
def test_docker_bad_daemon_json_is_refused(text: bytes, message: str) -> None:
    with pytest.raises(EditError, match=message):
        docker.Docker(docker.Options(handlers())).apply({CONFIG: text}, {})
