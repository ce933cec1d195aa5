"""The containerd editor on real-world configs: handlers, default runtime, CDI, drop-in and
imports, in-place edits and templates; every line we do not own stays byte for byte."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agents.container_toolkit import containerd, runtimes
from gpu_operator.agents.container_toolkit import tomltext as tt
from gpu_operator.agents.container_toolkit.edits import CONFIG, DROP_IN, SOURCE, EditError

SAMPLES = Path(__file__).parent / "samples"
RUNTIME_DIR = "/usr/local/nvidia/toolkit"
DROP_IN_PATH = "/etc/containerd/conf.d/99-nvidia.toml"
BINARIES = {
    "nvidia": f"{RUNTIME_DIR}/nvidia-container-runtime",
    "nvidia-cdi": f"{RUNTIME_DIR}/nvidia-container-runtime.cdi",
    "nvidia-legacy": f"{RUNTIME_DIR}/nvidia-container-runtime.legacy",
}
CONTAINERD_SAMPLES = [
    "containerd-v1.toml",
    "containerd-v2.toml",
    "containerd-v3.toml",
    "containerd-v2-imports.toml",
    "containerd-v3-default-imports.toml",
    "k3s-config.toml.tmpl",
    "rke2-config-v3.toml.tmpl",
    "containerd-v1-preexisting-nvidia.toml",
]
OWNED_KEYS = ("enable_cdi", "default_runtime_name", "imports")


def editor(
    *,
    drop_in: str | None = DROP_IN_PATH,
    default: bool = True,
    cdi: bool = True,
    name: str = "nvidia",
    config: str = "/etc/containerd/config.toml",
    prefixes: tuple[str, ...] = (),
) -> containerd.Containerd:
    handlers = runtimes.handlers(RUNTIME_DIR, name, default)
    return containerd.Containerd(
        containerd.Options(
            handlers, enable_cdi=cdi, drop_in=drop_in, config=config, annotation_prefixes=prefixes
        )
    )


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def served(files: dict[str, bytes | None]) -> dict[str, Any]:
    """What containerd 2.x would see: the config deep-merged with the drop-in (templates masked)."""
    merged: dict[str, Any] = {}
    for role in (CONFIG, DROP_IN):
        data = files.get(role)
        if data is not None:
            merge(merged, tomllib.loads(tt.masked(data.decode())))
    return merged


def merge(base: dict[str, Any], top: dict[str, Any]) -> None:
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v


def runtimes_of(data: dict[str, Any], plugin: str) -> dict[str, Any]:
    return data["plugins"][plugin]["containerd"]["runtimes"]


def unowned_lines(text: str) -> list[str]:
    """The original's lines that are not ours to change (independent of the editor's revert)."""
    out = []
    for line in text.splitlines():
        key = line.strip().split("=", 1)[0].strip()
        if key in OWNED_KEYS or line.strip().startswith(("]", '"/etc/containerd/node-image')):
            continue
        if "runtimes.nvidia" in line:  # a table the file had under one of our handler names
            continue
        out.append(line)
    return out


def is_subsequence(needles: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


@pytest.mark.parametrize("name", CONTAINERD_SAMPLES)
def test_apply_keeps_every_unowned_line_byte_for_byte_and_in_order(name: str) -> None:
    original = sample(name)
    edit = editor(config=f"/etc/containerd/{name}").apply({CONFIG: original}, {})
    after = (edit.files[CONFIG] or b"").decode()
    kept = unowned_lines(original.decode())
    if "preexisting" in name:  # its nvidia table moved into a placeholder line, the rest stays
        kept = [k for k in kept if "BinaryName" not in k and "options]" not in k]
        kept = [k for k in kept if k.strip() != 'runtime_type = "io.containerd.runc.v2"'] + [
            '      runtime_type = "io.containerd.runc.v2"'
        ]
    assert is_subsequence(kept, after.splitlines()), after


@pytest.mark.parametrize("name", CONTAINERD_SAMPLES)
def test_revert_after_apply_gives_the_original_bytes_back(name: str) -> None:
    original = sample(name)
    ed = editor(config=f"/etc/containerd/{name}")
    edit = ed.apply({CONFIG: original}, {})
    reverted = ed.revert(edit.files, {})
    assert reverted[CONFIG] == original
    assert reverted.get(DROP_IN) is None


@pytest.mark.parametrize("name", CONTAINERD_SAMPLES)
def test_apply_is_idempotent_so_a_second_pass_finds_no_drift(name: str) -> None:
    ed = editor(config=f"/etc/containerd/{name}")
    first = ed.apply({CONFIG: sample(name)}, {})
    second = ed.apply(first.files, {})
    assert second.files == first.files
    assert second.changes == ()


@pytest.mark.parametrize(
    ("name", "plugin"),
    [
        ("containerd-v1.toml", "cri"),
        ("containerd-v2.toml", "io.containerd.grpc.v1.cri"),
        ("containerd-v3.toml", "io.containerd.cri.v1.runtime"),
        ("containerd-v2-imports.toml", "io.containerd.grpc.v1.cri"),
        ("containerd-v3-default-imports.toml", "io.containerd.cri.v1.runtime"),
    ],
)
def test_the_three_handlers_copy_runc_and_name_our_binaries(name: str, plugin: str) -> None:
    original = sample(name)
    edit = editor().apply({CONFIG: original}, {})
    served_runtimes = runtimes_of(served(edit.files), plugin)
    runc = tomllib.loads(original.decode())
    runc_table = runtimes_of(runc, plugin)["runc"]
    for handler, binary in BINARIES.items():
        table = served_runtimes[handler]
        assert table["options"]["BinaryName"] == binary
        assert table["runtime_type"] == runc_table["runtime_type"]
        for key, value in (runc_table.get("options") or {}).items():
            if key != "BinaryName":
                assert table["options"][key] == value, (handler, key)
    assert served_runtimes["runc"] == runc_table


def test_version_1_sets_runtime_too_and_edits_in_place() -> None:
    edit = editor().apply({CONFIG: sample("containerd-v1.toml")}, {})
    data = served(edit.files)
    cri = data["plugins"]["cri"]
    assert edit.files.get(DROP_IN) is None
    assert cri["containerd"]["runtimes"]["nvidia"]["options"]["Runtime"] == BINARIES["nvidia"]
    assert cri["enable_cdi"] is True
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert "config version 1, edited in place" in edit.summary


def test_version_2_drop_in_carries_the_whole_cri_section_for_containerd_1x() -> None:
    original = sample("containerd-v2.toml")
    edit = editor().apply({CONFIG: original}, {})
    drop_in = tomllib.loads((edit.files[DROP_IN] or b"").decode())
    cri = drop_in["plugins"]["io.containerd.grpc.v1.cri"]
    # containerd 1.7 replaces the plugin's section with the imported one: nothing may be lost.
    top = tomllib.loads(original.decode())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == top["sandbox_image"]
    assert cri["cni"] == top["cni"]
    assert cri["registry"] == top["registry"]
    assert cri["containerd"]["runtimes"]["runc"] == top["containerd"]["runtimes"]["runc"]
    assert cri["containerd"]["discard_unpacked_layers"] is True
    assert drop_in["version"] == 2
    config = tomllib.loads((edit.files[CONFIG] or b"").decode())
    assert config["imports"] == ["/etc/containerd/conf.d/*.toml"]
    assert config["plugins"] == tomllib.loads(original.decode())["plugins"]


def test_version_3_drop_in_holds_only_our_settings() -> None:
    edit = editor().apply({CONFIG: sample("containerd-v3.toml")}, {})
    drop_in = tomllib.loads((edit.files[DROP_IN] or b"").decode())
    cri = drop_in["plugins"]["io.containerd.cri.v1.runtime"]
    assert set(drop_in["plugins"]) == {"io.containerd.cri.v1.runtime"}
    assert set(cri) == {"enable_cdi", "containerd"}
    assert set(cri["containerd"]["runtimes"]) == set(BINARIES)
    assert cri["containerd"]["default_runtime_name"] == "nvidia"


def test_an_existing_imports_array_gets_our_glob_appended_and_keeps_its_entries() -> None:
    edit = editor().apply({CONFIG: sample("containerd-v2-imports.toml")}, {})
    config = tomllib.loads((edit.files[CONFIG] or b"").decode())
    assert config["imports"] == [
        "/etc/containerd/node-image.d/*.toml",
        "/etc/containerd/conf.d/*.toml",
    ]
    assert "added /etc/containerd/conf.d/*.toml to the imports" in " ".join(edit.changes)


def test_a_config_that_already_imports_conf_d_is_not_touched_at_all() -> None:
    original = sample("containerd-v3-default-imports.toml")
    edit = editor().apply({CONFIG: original}, {})
    assert edit.files[CONFIG] == original
    assert edit.files[DROP_IN] is not None


def test_a_missing_config_is_created_with_version_and_imports_and_removed_on_revert() -> None:
    ed = editor()
    edit = ed.apply({CONFIG: None}, {})
    config = tomllib.loads((edit.files[CONFIG] or b"").decode())
    assert config == {"version": 2, "imports": ["/etc/containerd/conf.d/*.toml"]}
    assert ed.revert(edit.files, {})[CONFIG] is None


def test_the_default_runtime_is_set_only_when_asked() -> None:
    edit = editor(default=False).apply({CONFIG: sample("containerd-v3.toml")}, {})
    data = served(edit.files)
    assert (
        data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["default_runtime_name"]
        == "runc"
    )
    assert not any("default runtime" in c for c in edit.changes)


def test_enable_cdi_is_left_alone_when_cdi_is_off() -> None:
    edit = editor(cdi=False).apply({CONFIG: sample("containerd-v1.toml")}, {})
    assert "enable_cdi" not in served(edit.files)["plugins"]["cri"]


def test_a_runtime_class_named_like_a_mode_handler_keeps_nvidia_and_defaults_to_it() -> None:
    edit = editor(name="nvidia-cdi").apply({CONFIG: sample("containerd-v3.toml")}, {})
    containerd_table = served(edit.files)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert set(containerd_table["runtimes"]) >= set(BINARIES)
    assert containerd_table["default_runtime_name"] == "nvidia-cdi"


def test_a_custom_runtime_class_name_gets_the_main_binary() -> None:
    edit = editor(name="gpu").apply({CONFIG: sample("containerd-v3.toml")}, {})
    table = runtimes_of(served(edit.files), "io.containerd.cri.v1.runtime")
    assert table["gpu"]["options"]["BinaryName"] == BINARIES["nvidia"]
    assert "nvidia" not in table


def test_cdi_annotation_prefixes_become_container_annotations() -> None:
    edit = editor(prefixes=("cdi.k8s.io/", "nvidia.cdi.k8s.io/")).apply(
        {CONFIG: sample("containerd-v3.toml")}, {}
    )
    table = runtimes_of(served(edit.files), "io.containerd.cri.v1.runtime")["nvidia"]
    assert table["container_annotations"] == ["cdi.k8s.io/*", "nvidia.cdi.k8s.io/*"]


def test_without_runc_or_crun_the_handlers_get_upstream_defaults() -> None:
    edit = editor().apply({CONFIG: b"version = 3\n"}, {})
    table = runtimes_of(served(edit.files), "io.containerd.cri.v1.runtime")["nvidia"]
    assert table == {
        "runtime_type": "io.containerd.runc.v2",
        "privileged_without_host_devices": False,
        "options": {"BinaryName": BINARIES["nvidia"]},
    }


def test_the_config_default_runtime_is_copied_before_runc() -> None:
    text = (
        b'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n'
        b'  default_runtime_name = "crun"\n'
        b'[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crun]\n'
        b'  runtime_type = "io.containerd.runc.v2"\n  cgroup_writable = true\n'
        b'[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]\n'
        b'  runtime_type = "io.containerd.runc.v2"\n'
    )
    edit = editor().apply({CONFIG: text}, {})
    assert runtimes_of(served(edit.files), "io.containerd.cri.v1.runtime")["nvidia"][
        "cgroup_writable"
    ]


def test_a_k3s_template_keeps_its_template_lines_and_gets_only_handler_tables() -> None:
    original = sample("k3s-config.toml.tmpl")
    edit = editor(config="/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl").apply(
        {CONFIG: original}, {}
    )
    after = (edit.files[CONFIG] or b"").decode()
    assert after.startswith('{{ template "base" . }}\n')
    assert edit.files.get(DROP_IN) is None
    data = tomllib.loads(tt.masked(after))
    cri = data["plugins"]["io.containerd.grpc.v1.cri"]
    assert set(cri["containerd"]["runtimes"]) == set(BINARIES)
    assert "enable_cdi" not in cri
    assert any("--default-runtime" in note for note in edit.notes)


def test_an_rke2_v3_template_uses_the_version_3_plugin() -> None:
    edit = editor(config="/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl").apply(
        {CONFIG: sample("rke2-config-v3.toml.tmpl")}, {}
    )
    data = tomllib.loads(tt.masked((edit.files[CONFIG] or b"").decode()))
    assert set(runtimes_of(data, "io.containerd.cri.v1.runtime")) == set(BINARIES)
    assert "{{- end }}" in (edit.files[CONFIG] or b"").decode()


def test_a_preexisting_nvidia_table_is_replaced_and_comes_back_on_revert() -> None:
    original = sample("containerd-v1-preexisting-nvidia.toml")
    ed = editor(drop_in=None)
    edit = ed.apply({CONFIG: original}, {})
    table = runtimes_of(served(edit.files), "cri")["nvidia"]
    assert table["options"]["BinaryName"] == BINARIES["nvidia"]
    assert served(edit.files)["plugins"]["cri"]["enable_cdi"] is True
    assert ed.revert(edit.files, {})[CONFIG] == original


def test_in_place_without_a_drop_in_path_for_version_3() -> None:
    ed = editor(drop_in=None)
    original = sample("containerd-v3.toml")
    edit = ed.apply({CONFIG: original}, {})
    assert set(edit.files) == {CONFIG}
    data = served(edit.files)
    assert set(runtimes_of(data, "io.containerd.cri.v1.runtime")) >= set(BINARIES)
    assert data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"][
        "default_runtime_name"
    ] == ("nvidia")
    assert ed.revert(edit.files, {})[CONFIG] == original


def test_drift_a_removed_imports_line_is_added_again_and_said() -> None:
    ed = editor()
    edit = ed.apply({CONFIG: sample("containerd-v3.toml")}, {})
    # A node-image update writes its own config.toml over ours.
    drifted = {CONFIG: sample("containerd-v3.toml"), DROP_IN: edit.files[DROP_IN]}
    again = ed.apply(drifted, {})
    assert again.files == edit.files
    assert any("imports" in c for c in again.changes)


def test_drift_an_edited_drop_in_is_rewritten_and_the_handler_named() -> None:
    ed = editor()
    edit = ed.apply({CONFIG: sample("containerd-v3.toml")}, {})
    tampered = (edit.files[DROP_IN] or b"").replace(b"nvidia-container-runtime.cdi", b"runc")
    again = ed.apply({CONFIG: edit.files[CONFIG], DROP_IN: tampered}, {})
    assert again.files[DROP_IN] == edit.files[DROP_IN]
    assert any("runtime handler nvidia-cdi" in c for c in again.changes)
    assert any("rewrote /etc/containerd/conf.d/99-nvidia.toml" in c for c in again.changes)


def test_drift_a_changed_cri_section_in_a_version_2_config_is_copied_again() -> None:
    ed = editor()
    edit = ed.apply({CONFIG: sample("containerd-v2.toml")}, {})
    updated = (edit.files[CONFIG] or b"").replace(b"pause:3.9", b"pause:3.10")
    again = ed.apply({CONFIG: updated, DROP_IN: edit.files[DROP_IN]}, {})
    cri = tomllib.loads((again.files[DROP_IN] or b"").decode())["plugins"][
        "io.containerd.grpc.v1.cri"
    ]
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.10"
    assert again.files[CONFIG] == updated


def test_a_source_file_is_read_for_the_options_to_copy() -> None:
    rendered = sample("containerd-v2.toml")
    edit = editor(config="/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl").apply(
        {CONFIG: sample("k3s-config.toml.tmpl"), SOURCE: rendered}, {}
    )
    table = runtimes_of(served(edit.files), "io.containerd.grpc.v1.cri")["nvidia"]
    assert table["options"]["SystemdCgroup"] is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"version = 2\n[plugins\n", "/etc/containerd/config.toml: not valid TOML"),
        (b"version = 4\n", "/etc/containerd/config.toml: version must be 1, 2 or 3, not 4"),
        (b'version = "2"\n', "version must be 1, 2 or 3, not '2'"),
        (b'version = 2\nimports = "/x/*.toml"\n', "imports must be an array of paths"),
        (b"\xff\xfe", "/etc/containerd/config.toml: not UTF-8 text"),
    ],
)
def test_bad_configs_are_refused_with_the_file_and_the_reason(text: bytes, message: str) -> None:
    with pytest.raises(EditError, match=message.replace("[", r"\[").replace("(", r"\(")):
        editor().apply({CONFIG: text}, {})


def test_a_handler_written_as_dotted_keys_is_refused_with_a_way_out() -> None:
    text = (
        b'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        b'runtimes.nvidia.runtime_type = "io.containerd.runc.v2"\n'
    )
    with pytest.raises(EditError, match="written as dotted keys; give it a \\[table\\] header"):
        editor(drop_in=None).apply({CONFIG: text}, {})


def test_a_cri_table_made_of_dotted_keys_still_gets_valid_toml() -> None:
    text = b'version = 2\n[plugins]\n"io.containerd.grpc.v1.cri".enable_cdi = false\n'
    ed = editor(drop_in=None)
    edit = ed.apply({CONFIG: text}, {})
    cri = served(edit.files)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert ed.revert(edit.files, {})[CONFIG] == text
