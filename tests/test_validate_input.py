"""`gpu-operator validate` on hostile input: one clear line per problem, exit 0, 1 or 2."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator.api import manifests
from gpu_operator.cli import app

runner = CliRunner()
HEAD = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\n"


def _validate(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    # A real process, so that a segfault shows as a negative exit code instead of killing pytest.
    path = tmp_path / "in.yaml"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator", "validate", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("spec: 5\n", "ClusterPolicy/cp: spec: expected an object, got 5"),
        ("spec: [1, 2]\n", "ClusterPolicy/cp: spec: expected an object, got [1, 2]"),
        ("spec: {operator: 5}\n", "spec.operator: expected an object, got 5"),
    ],
)
def test_non_object_spec_is_invalid_not_a_crash(tmp_path: Path, spec: str, line: str) -> None:
    result = _validate(tmp_path, HEAD + spec)
    assert result.returncode == 1, result.stderr
    assert line in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!float x", "cannot read 'x' as !!float"),
        ("!!int x", "cannot read 'x' as !!int"),
        ("!!bool maybe", "cannot read 'maybe' as !!bool"),
        ("!!timestamp x", "cannot read 'x' as !!timestamp"),
    ],
)
def test_bad_yaml_tag_is_one_line_exit_2(tmp_path: Path, value: str, message: str) -> None:
    result = _validate(tmp_path, HEAD + f"spec:\n  driver: {{version: {value}}}\n")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'in.yaml'}: not valid YAML at line 5, column 21: {message}"
    ]


@pytest.mark.parametrize("items", ["5", "{a: 1}", "x"])
def test_list_with_non_list_items_exit_2(tmp_path: Path, items: str) -> None:
    result = _validate(tmp_path, f"apiVersion: v1\nkind: List\nitems: {items}\n")
    assert result.returncode == 2
    assert "document 1: items: expected a list" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("levels", [101, 600, 1_000, 30_000])
@pytest.mark.parametrize("shape", ["flow-list", "flow-map", "block-map", "json"])
def test_deep_nesting_is_refused_with_one_line(tmp_path: Path, levels: int, shape: str) -> None:
    if shape == "flow-list":
        text = HEAD + "spec:\n  kataManager:\n    config: " + "[" * levels + "]" * levels + "\n"
    elif shape == "flow-map":
        text = HEAD + "spec: " + "{a: " * levels + "1" + "}" * levels + "\n"
    elif shape == "block-map":
        text = HEAD + "spec:\n" + "".join(" " * i + "a:\n" for i in range(1, levels + 1))
    else:
        text = '{"kind": "ClusterPolicy", "spec": ' + "[" * levels + "]" * levels + "}"
    result = _validate(tmp_path, text)
    assert result.returncode == 2, (result.returncode, result.stderr[-500:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"nested more than {manifests.MAX_DEPTH} levels deep" in lines[0]


class _LibyamlNestingLimit(yaml.SafeLoader):
    """The pure-Python loader with libyaml 0.2.5's flow-nesting limit (bundled since PyYAML
    6.0.4): the scanner refuses a 1,000th flow level while it reads ahead for an implicit key."""

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        if self.flow_level >= 999:
            mark = self.get_mark()
            raise yaml.scanner.ScannerError(
                "while increasing flow level", mark, "exceeded maximum nesting depth", mark
            )
        super().fetch_flow_collection_start(token_class)


@pytest.mark.parametrize("levels", [1_000, 30_000])
def test_our_nesting_limit_answers_before_the_parsers_own(
    monkeypatch: pytest.MonkeyPatch, levels: int
) -> None:
    text = HEAD + "spec:\n  kataManager:\n    config: " + "[" * levels + "]" * levels + "\n"
    with pytest.raises(yaml.scanner.ScannerError, match="maximum nesting depth"):
        list(yaml.parse(text, Loader=_LibyamlNestingLimit))  # the emulation does stop first
    monkeypatch.setattr(manifests, "_Loader", _LibyamlNestingLimit)
    with pytest.raises(manifests.ManifestError) as err:
        manifests.parse_documents(text, "in.yaml")
    assert str(err.value) == "in.yaml: line 6, column 110: nested more than 100 levels deep"


def test_nesting_at_the_limit_is_checked(tmp_path: Path) -> None:
    # spec.kataManager.config is depth 3 below the document; 95 more levels stay within 100.
    deep = "[" * 95 + "]" * 95
    result = _validate(tmp_path, HEAD + f"spec:\n  kataManager:\n    config: {deep}\n")
    assert result.returncode == 1
    assert "nested more than" not in result.stderr + result.stdout


def test_alias_expansion_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    result = _validate(tmp_path, HEAD + "spec:\n" + "".join(f"  {line}\n" for line in lines))
    assert result.returncode == 2
    assert "values once aliases are expanded" in result.stderr


def test_alias_cycle_is_refused(tmp_path: Path) -> None:
    result = _validate(tmp_path, HEAD + "spec: &s {loop: *s}\n")
    assert result.returncode == 2
    assert "alias cycle" in result.stderr


def test_duplicate_yaml_key_is_an_error_with_its_path(tmp_path: Path) -> None:
    text = HEAD + 'spec:\n  driver: {version: "1"}\n  driver: {version: "2"}\n'
    result = _validate(tmp_path, text)
    assert result.returncode == 1
    assert (
        f"{tmp_path / 'in.yaml'}: ClusterPolicy/cp: spec.driver: duplicate field "
        "(line 6, first at line 5)"
    ) in result.stdout.splitlines()


def test_duplicate_key_in_a_list_item_names_the_item_path(tmp_path: Path) -> None:
    text = (
        "apiVersion: v1\nkind: List\nitems:\n- " + HEAD.replace("\n", "\n  ") + "spec: {}\n"
        "  kind: ClusterPolicy\n"
    )
    result = _validate(tmp_path, text)
    assert result.returncode == 1
    assert "ClusterPolicy/cp: kind: duplicate field" in result.stdout


def test_duplicate_json_key_is_an_error(tmp_path: Path) -> None:
    text = '{"kind": "ClusterPolicy", "metadata": {"name": "a", "name": "b"}, "spec": {}}'
    result = _validate(tmp_path, text)
    assert result.returncode == 1
    assert "ClusterPolicy/b: metadata.name: duplicate field" in result.stdout


def test_merge_keys_are_not_duplicates() -> None:
    docs = manifests.parse_documents("base: &b {x: 1}\nkind: K\nm: {<<: *b, x: 2}\n", "t")
    assert docs[0].obj["m"] == {"x": 2}
    assert docs[0].problems == []


# --- tags and shapes where an object is expected ----------------------------------------------

# Every tag of YAML 1.1's type repository, a verbatim one, an unknown local one and a Python one
# (the safe loader refuses that), on every shape of node.
TAGS = [
    "", "!!map ", "!!omap ", "!!pairs ", "!!set ", "!!seq ", "!!str ", "!!int ", "!!float ",
    "!!bool ", "!!null ", "!!binary ", "!!timestamp ", "!!merge ", "!!value ", "!!yaml ",
    "!<tag:yaml.org,2002:map> ", "!custom ", "!!python/tuple ",
]  # fmt: skip
SHAPES = ["5", "x", "", "[1, 2]", "[a: 1]", "{a: 1}", "{a, b}", "2020-01-01", "aGVsbG8="]
# Where a mapping is expected: a document, an object's spec and metadata, a section of the
# spec, labels, a List's item, a mig-parted file and one of its configs and entries.
POSITIONS = {
    "document": "@\n",
    "spec": HEAD + "spec: @\n",
    "metadata": "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: @\nspec: {}\n",
    "section": HEAD + "spec: {driver: @}\n",
    "labels": "apiVersion: v1\nkind: ClusterPolicy\nmetadata: {name: cp, labels: @}\n",
    "item": "apiVersion: v1\nkind: List\nitems:\n- @\n",
    "mig-configs": "version: v1\nmig-configs: @\n",
    "mig-entry": "version: v1\nmig-configs:\n  custom:\n  - @\n",
}


def test_no_tag_or_shape_where_a_mapping_is_expected_breaks_the_parser() -> None:
    # Before: `!!map` on anything but a mapping raised TypeError or ValueError from inside
    # PyYAML (manifests.py, construct_map) instead of a ManifestError.
    crashes = []
    for (position, template), tag, shape in itertools.product(POSITIONS.items(), TAGS, SHAPES):
        text = template.replace("@", tag + shape)
        try:
            manifests.parse_documents(text, "t.yaml")
        except manifests.ManifestError as err:
            message = str(err)
            assert message.startswith("t.yaml: "), message
            assert "\n" not in message, message
            if tag.startswith(("!!map", "!<")) and not shape.startswith("{"):
                assert "!!map needs a mapping, found" in message, (text, message)
        except Exception as err:  # anything else is the bug
            crashes.append(f"{position} {tag}{shape}: {type(err).__name__}: {err}")
    assert not crashes, crashes[:10]


@pytest.mark.parametrize("tag", TAGS)
def test_validate_answers_every_tag_and_shape_on_spec_in_one_line(tag: str) -> None:
    for shape in SHAPES:
        text = HEAD + f"spec: {tag}{shape}\n"
        result = runner.invoke(app, ["validate", "-f", "-"], input=text)
        where = (tag, shape, result.output[-400:])
        assert result.exception is None or isinstance(result.exception, SystemExit), where
        assert result.exit_code in (1, 2), where
        assert "Traceback" not in result.output, where
        if result.exit_code == 2:
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            assert len(errors) == 1, where
            continue
        spec = manifests.parse(text, "-")[0]["spec"]
        if not isinstance(spec, dict):
            assert "ClusterPolicy/cp: spec: expected an object, got " in result.output, where


def test_map_tag_on_a_sequence_is_a_yaml_error_with_its_place(tmp_path: Path) -> None:
    result = _validate(tmp_path, HEAD + "spec: !!map [1, 2]\n")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'in.yaml'}: not valid YAML at line 4, column 7: !!map needs a "
        "mapping, found a sequence"
    ]


# --- numbers the API server cannot hold -------------------------------------------------------

TOO_BIG = "the API server holds 64-bit integers and floats, at most about 1.8e308"
NOT_A_NUMBER = "is not a number JSON can hold"
NUMBERS = [
    # (JSON literal, refused with, or None when the number is fine)
    ("9223372036854775807", None),  # int64's largest
    ("123456789012345678901234567890", None),  # past int64: the server reads a float64
    ("1" + "0" * 308, None),  # 1e308 as an integer
    ("2" + "0" * 308, TOO_BIG),  # 2e308: no float64 holds it
    ("-" + "9" * 4300, TOO_BIG),  # Python's own limit: exactly 4,300 digits
    ("1" * 4301, TOO_BIG),  # one past it: Python's int() raises ValueError
    ("1" * 100_000, TOO_BIG),
    ("1.7976931348623157e308", None),  # float64's largest
    ("1e309", TOO_BIG),
    ("-1e999", TOO_BIG),
    ("1e-999", None),  # underflows to 0.0
    ("NaN", NOT_A_NUMBER),
    ("Infinity", NOT_A_NUMBER),
    ("-Infinity", NOT_A_NUMBER),
]


@pytest.mark.parametrize(("literal", "refused"), NUMBERS)
@pytest.mark.parametrize("where", ["value", "list", "top"])
def test_json_numbers_out_of_range_are_one_line(
    literal: str, refused: str | None, where: str
) -> None:
    value = {"value": literal, "list": f"[1, {literal}]", "top": literal}[where]
    if where == "top":
        text = (
            f'[{{"kind": "ClusterPolicy", "metadata": {{"name": "cp"}}, "spec": {{}}}},\n {value}]'
        )
    else:
        text = (
            f'{{"kind": "ClusterPolicy", "metadata": {{"name": "cp"}},\n "spec": {{"x": {value}}}}}'
        )
    if refused is None:
        documents = manifests.parse_documents(text, "t.json") if where != "top" else None
        if documents is not None:
            assert documents[0].obj["spec"]["x"] is not None
        return
    with pytest.raises(manifests.ManifestError) as err:
        manifests.parse_documents(text, "t.json")
    message = str(err.value)
    assert message.startswith("t.json: not valid JSON at line 2: "), message
    assert refused in message
    assert len(message) < 400  # a 100,000-digit literal is shown by its start and length
    result = runner.invoke(app, ["validate", "-f", "-"], input=text)
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)


YAML_NUMBERS = [
    ("9223372036854775807", None),
    ("1" * 309, None),
    ("2" + "0" * 308, TOO_BIG),
    ("1" * 5000, TOO_BIG),
    ("-" + "1" * 5000, TOO_BIG),
    ("0x" + "f" * 300, TOO_BIG),  # hexadecimal: Python reads it, it is still too big
    ("0" + "7" * 400, TOO_BIG),  # YAML 1.1 octal
    ("0b" + "1" * 1100, TOO_BIG),
    ("!!int " + "1" * 5000, TOO_BIG),
    ("!!int x", "cannot read 'x' as !!int"),
    ("190:20:30", None),  # YAML 1.1 base 60
    ("1.0e+308", None),
    ("1.0e+999", TOO_BIG),
    ("!!float 1e999", TOO_BIG),
    (".inf", NOT_A_NUMBER),
    ("-.Inf", NOT_A_NUMBER),
    ("+.INF", NOT_A_NUMBER),
    (".nan", NOT_A_NUMBER),
    ("!!float .NaN", NOT_A_NUMBER),
    ("'.nan'", None),  # quoted: a string
    ("'1e999'", None),
]


@pytest.mark.parametrize(("literal", "refused"), YAML_NUMBERS)
@pytest.mark.parametrize("where", ["value", "key", "list"])
def test_yaml_numbers_out_of_range_are_one_line(
    literal: str, refused: str | None, where: str
) -> None:
    value = {"value": f"x: {literal}", "key": f"? {literal}\n  : x", "list": f"x: [1, {literal}]"}
    text = HEAD + "spec:\n  " + value[where] + "\n"
    if refused is None:
        assert manifests.parse_documents(text, "t.yaml")[0].obj["spec"]
        return
    with pytest.raises(manifests.ManifestError) as err:
        manifests.parse_documents(text, "t.yaml")
    message = str(err.value)
    assert message.startswith("t.yaml: not valid YAML at line 5, column "), message
    assert refused in message
    assert len(message) < 400
    result = runner.invoke(app, ["validate", "-f", "-"], input=text)
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_huge_integer_in_json_is_one_line_exit_2(tmp_path: Path) -> None:
    # The report: a JSON integer longer than 4,300 digits was a ValueError traceback.
    text = (
        '{"kind": "ClusterPolicy", "metadata": {"name": "cp"}, "spec": {"x": ' + "1" * 5000 + "}}"
    )
    result = _validate(tmp_path, text)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'in.yaml'}: not valid JSON at line 1: the number "
        "11111111111111111111... (5,000 characters) is out of range (the API server holds "
        "64-bit integers and floats, at most about 1.8e308); quote it if it is meant as a string"
    ]


# --- the other commands' failures: one line, no traceback -----------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def _kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return path


def test_crds_apply_to_unreachable_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = runner.invoke(
        app, ["crds", "--apply", "--kubeconfig", str(_kubeconfig(tmp_path, port))]
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: cannot reach http://127.0.0.1:{port}: All connection attempts failed"
    ]


def test_crds_apply_timeout_is_one_line(
    tmp_path: Path, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_operator.kube import client

    real = client.connect
    monkeypatch.setattr(client, "connect", lambda kc=None: real(kc, timeout=0.3))
    kubeconfig = _kubeconfig(tmp_path, silent_port)
    result = runner.invoke(app, ["crds", "--apply", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: http://127.0.0.1:{silent_port}: timed out waiting for the API server"
    ]


def test_controller_with_its_port_taken_is_one_line(tmp_path: Path, silent_port: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpu_operator", "controller", "--namespace", "gpu-operator",
         "--kubeconfig", str(_kubeconfig(tmp_path, silent_port)),
         "--health-probe-bind-address", f"127.0.0.1:{silent_port}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: error while attempting to bind on address ('127.0.0.1', {silent_port}): "
        "address already in use"
    )
