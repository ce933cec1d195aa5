"""Applying is linear in the config's size, measured as work rather than time (the bench,
bench/toolkit_apply_bench.py, gives the seconds): a big config is parsed whole once, and scanned
into statements at most once; the drop-in way reads only its top-level statements as text; a
drift check on unchanged files parses nothing (test_file_safety)."""

from __future__ import annotations

import copy
import gc
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agents.container_toolkit import containerd, crio, runtimes
from gpu_operator.agents.container_toolkit import tomltext as tt
from gpu_operator.agents.container_toolkit.edits import CONFIG

HANDLERS = runtimes.handlers("/usr/local/nvidia/toolkit", "nvidia", True)
SIZE = 400_000


def containerd_config(version: int, size: int = SIZE) -> bytes:
    cri = {1: "cri", 2: '"io.containerd.grpc.v1.cri"'}[version]
    parts = [
        f"version = {version}\n\n[plugins.{cri}.containerd]\n"
        '  default_runtime_name = "runc"\n'
        f"[plugins.{cri}.containerd.runtimes.runc]\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
    ]
    i = 0
    while sum(map(len, parts)) < size:
        parts.append(
            f"\n# registry {i}\n"
            f'[plugins.{cri}.registry.mirrors."registry-{i}.example.com"]\n'
            f'  endpoint = ["https://mirror-{i}.example.com"]\n'
            f'[plugins."io.containerd.monitor.v1.cgroups-{i}"]\n'
            "  no_prometheus = false\n"
        )
        i += 1
    return "".join(parts).encode()


def crio_config(size: int = SIZE) -> bytes:
    parts = ['[crio.runtime]\ndefault_runtime = "crun"\n']
    i = 0
    while sum(map(len, parts)) < size:
        parts.append(f'\n[crio.runtime.runtimes.kata-{i}]\nruntime_path = "/opt/kata-{i}"\n')
        i += 1
    return "".join(parts).encode()


class Work:
    """Characters parsed by tomllib and scanned into statements."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.parsed = 0
        self.scanned = 0
        loads, scan = tomllib.loads, tt.statements

        def counted_loads(text: str, **kwargs: object) -> dict[str, object]:
            self.parsed += len(text)
            return loads(text, **kwargs)  # type: ignore[arg-type]

        def counted_scan(text: str, name: str = "config", **kwargs: object) -> list[tt.Statement]:
            out = scan(text, name, **kwargs)  # type: ignore[arg-type]
            self.scanned += out[-1].end if out else 0
            return out

        monkeypatch.setattr(tomllib, "loads", counted_loads)
        monkeypatch.setattr(tt, "statements", counted_scan)


@pytest.mark.parametrize("version", [2, 1], ids=["v2 drop-in", "v1 in place"])
def test_a_big_containerd_config_is_parsed_whole_once(
    monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    data = containerd_config(version)
    drop_in = "/etc/containerd/conf.d/99-nvidia.toml" if version == 2 else None
    editor = containerd.Containerd(containerd.Options(HANDLERS, enable_cdi=True, drop_in=drop_in))
    work = Work(monkeypatch)
    edit = editor.apply({CONFIG: data}, {})
    if version == 2:  # the drop-in way: top-level statements as text, one whole parse (the gate)
        assert work.parsed <= 1.02 * len(data)
        assert work.scanned <= 1_000
    else:  # in place: one scan; the CRI plugin's statements, then the whole edit, parsed
        assert work.parsed <= 2.02 * len(data)
        assert work.scanned <= 1.02 * len(data)
    # A new pod finds our settings in place: the same bound, nothing to write.
    work.parsed = work.scanned = 0
    again = editor.apply({CONFIG: data, **edit.files}, {})
    assert again.files == edit.files
    assert work.parsed <= 2.02 * len(edit.files[CONFIG] or b"")
    assert work.scanned <= 1.02 * len(edit.files[CONFIG] or b"")


def test_a_big_crio_config_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    data = crio_config()
    work = Work(monkeypatch)
    crio.Crio(crio.Options(HANDLERS)).apply({CONFIG: data}, {})
    assert work.parsed <= 1.02 * len(data)
    assert work.scanned == 0


@pytest.mark.parametrize("runtime", ["containerd", "crio", "docker"])
def test_big_trees_are_built_with_the_cycle_collector_paused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runtime: str
) -> None:
    """The collector walks every live object each time it runs: while a 30 MB config becomes
    a tree it ran often enough to make the cost grow faster than the file (14x for 10x the
    size in the bench). Parsing and editing run with it paused (the trees hold no cycles)."""
    from .nodes import Node

    node = Node(tmp_path, runtime)
    node.config.write_bytes(
        {"containerd": containerd_config(2), "crio": crio_config()}.get(runtime, node.original)
    )
    seen: list[bool] = []
    for module, name in ((tomllib, "loads"), (json, "loads"), (copy, "deepcopy")):
        real = getattr(module, name)

        def spy(*args: object, _real: Any = real, **kwargs: object) -> object:
            seen.append(gc.isenabled())
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    node.apply()
    assert seen
    assert not any(seen)
