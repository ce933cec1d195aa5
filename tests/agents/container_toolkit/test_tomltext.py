"""TOML as text: statements over multi-line values and templates, markers, the small writer."""

from __future__ import annotations

import tomllib

from gpu_operator.agents.container_toolkit import tomltext as tt


def test_statements_span_multi_line_arrays_and_strings_and_keep_template_lines() -> None:
    text = (
        '{{ template "base" . }}\n'
        "a = [\n  1, # one\n  2,\n]\n"
        's = """x\n[not.a.table]\n"""\n'
        '[t."q.k"]\n'
        "b = 'it''s' # trailing\n"
    )
    kinds = [(s.kind, s.path) for s in tt.statements(text)]
    assert kinds == [
        ("template", ()),
        ("keyval", ("a",)),
        ("keyval", ("s",)),
        ("table", ("t", "q.k")),
        ("keyval", ("t", "q.k", "b")),
    ]
    last = tt.statements(text)[-1]
    assert text[last.comment : last.end].strip() == "# trailing"


def test_strip_ours_restores_replaced_statements_and_drops_added_ones() -> None:
    nl = "\n"
    original = "x = 1\n[t]\nk = false\n"
    edited = (
        tt.marked_statement("y = 2", nl)
        + "x = 1\n[t]\n"
        + tt.marked_statement("k = true", nl, "k = false\n")
        + tt.block("[t.ours]\n  v = 1\n", nl)
    )
    assert tomllib.loads(edited) == {"y": 2, "x": 1, "t": {"k": True, "ours": {"v": 1}}}
    assert tt.strip_ours(edited, "f") == original


def test_dumps_writes_only_headers_that_hold_values_and_reads_back_equal() -> None:
    data = {
        "version": 3,
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {
                    "runtimes": {
                        "nvidia": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"BinaryName": "/x", "Args": ["a", "b"]},
                        }
                    }
                }
            }
        },
    }
    text = tt.dumps(data)
    assert tomllib.loads(text) == data
    assert text.count("[") == 3  # two headers and one array
