"""The counters CSV: upstream's format, every error with its line, the default set and the field
table."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agents.dcgm_exporter import counters, fields, readers


def parse(text: str) -> counters.CounterSet:
    return counters.parse(text, "test.csv")


def problems(text: str) -> list[counters.Problem]:
    with pytest.raises(counters.CsvError) as caught:
        parse(text)
    return list(caught.value.problems)


def test_default_counters_are_upstreams_enabled_set() -> None:
    default = counters.default()
    assert len(default.counters) == 26
    assert default.counters[0].name == "DCGM_FI_DEV_SM_CLOCK"
    assert [c.name for c in default.labels] == ["DCGM_FI_DRIVER_VERSION"]
    assert {c.prom_type for c in default.counters} == {"gauge", "counter", "label"}


def test_metrics_are_ordered_by_dcgm_field_id_not_file_order() -> None:
    cs = parse(
        "DCGM_FI_DEV_FB_USED, gauge, used\n"
        "DCGM_FI_DEV_SM_CLOCK, gauge, clock\n"
        "DCGM_FI_DEV_GPU_TEMP, gauge, temp\n"
    )
    assert [c.name for c in cs.metrics] == [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
    ]


def test_comments_blank_lines_spaces_and_quotes_are_handled_like_upstream() -> None:
    cs = parse(
        "# Format,,\n"
        "\n"
        "   \n"
        "  # an indented comment\n"
        'DCGM_FI_DEV_GPU_UTIL ,   gauge ,  "GPU utilization, in %"  \n'
        "DCGM_FI_DRIVER_VERSION, label, Driver Version\n"
    )
    assert [(c.name, c.prom_type, c.help, c.line_no) for c in cs.counters] == [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization, in %", 5),
        ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version", 6),
    ]


def test_a_repeated_field_keeps_its_first_line() -> None:
    cs = parse("DCGM_FI_DEV_GPU_UTIL, gauge, first\nDCGM_FI_DEV_GPU_UTIL, counter, second\n")
    assert [(c.help, c.line_no) for c in cs.counters] == [("first", 1)]


def test_unknown_field_names_the_line_and_suggests_the_close_name() -> None:
    [problem] = problems("# metrics\nDCGM_FI_DEV_GPU_UTILS, gauge, GPU utilization\n")
    assert problem.line_no == 2
    assert problem.line == "DCGM_FI_DEV_GPU_UTILS, gauge, GPU utilization"
    assert "unknown DCGM field 'DCGM_FI_DEV_GPU_UTILS'" in problem.problem
    assert "did you mean DCGM_FI_DEV_GPU_UTIL?" in problem.problem


def test_unknown_field_without_a_close_name_has_no_suggestion() -> None:
    [problem] = problems("NOT_A_FIELD, gauge, x\n")
    assert problem.problem == "unknown DCGM field 'NOT_A_FIELD'"


def test_bad_prometheus_type_lists_the_accepted_ones() -> None:
    [problem] = problems("DCGM_FI_DEV_FB_USED, gaug, used\n")
    assert problem.problem == (
        "unknown Prometheus type 'gaug' (expected gauge, counter, histogram, summary or label)"
    )


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("DCGM_FI_DEV_FB_USED, gauge", 2),
        ("DCGM_FI_DEV_FB_USED", 1),
        ("DCGM_FI_DEV_FB_USED, gauge, used, extra", 4),
        ("DCGM_FI_DEV_FB_USED, gauge, used, (in MiB)", 4),
    ],
)
def test_wrong_column_count_says_how_many_were_found(line: str, found: int) -> None:
    [problem] = problems(line + "\n")
    assert problem.problem == (
        f"expected 3 comma-separated fields (field, type, help), found {found}"
    )


def test_unterminated_quote_is_malformed_csv() -> None:
    [problem] = problems('DCGM_FI_DEV_FB_USED, gauge, "used\n')
    assert problem.problem.startswith("malformed CSV")


def test_empty_field_name_is_reported() -> None:
    [problem] = problems(", gauge, nothing\n")
    assert problem.problem == "the DCGM field name is empty"


def test_every_bad_line_is_reported_with_its_number() -> None:
    found = problems(
        "DCGM_FI_DEV_GPU_UTIL, gauge, ok\n"
        "BAD_ONE, gauge, x\n"
        "DCGM_FI_DEV_FB_USED, nope, y\n"
        "DCGM_FI_DEV_FB_FREE\n"
    )
    assert [p.line_no for p in found] == [2, 3, 4]


def test_message_shows_five_problems_then_counts_the_rest() -> None:
    text = "".join(f"BAD_{i}, gauge, x\n" for i in range(8))
    with pytest.raises(counters.CsvError) as caught:
        parse(text)
    message = str(caught.value)
    assert message.startswith("test.csv: line 1: unknown DCGM field 'BAD_0'")
    assert "BAD_4" in message
    assert "BAD_5" not in message
    assert message.endswith("; and 3 more bad line(s)")


def test_only_comments_is_an_error() -> None:
    with pytest.raises(counters.CsvError) as caught:
        parse("# nothing here\n\n")
    assert caught.value.problems == ()
    assert str(caught.value) == "test.csv: no counters: every line is blank or a comment"


def test_unreadable_file_is_a_csv_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent.csv"
    with pytest.raises(counters.CsvError) as caught:
        counters.load(missing)
    assert (
        str(caught.value) == f"{missing}: cannot read the counters file: No such file or directory"
    )


def test_profiling_fields_nvml_cannot_give_are_known_but_unsupported() -> None:
    cs = parse(
        "DCGM_FI_PROF_SM_ACTIVE, gauge, sm\n"
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, gr\n"
        "DCGM_FI_DEV_GPU_UTIL, gauge, util\n"
    )
    assert [c.name for c in cs.unsupported] == ["DCGM_FI_PROF_SM_ACTIVE"]
    assert [c.name for c in cs.metrics] == ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    sm_active = fields.by_name("DCGM_FI_PROF_SM_ACTIVE")
    assert sm_active is not None
    assert sm_active.profiling
    assert "profiling" in sm_active.note


def test_every_field_source_has_a_reader_and_every_unsupported_field_says_why() -> None:
    for f in fields.FIELDS:
        if f.source is None:
            assert f.note, f.name
        else:
            assert f.source == "xid" or f.source in readers.SOURCES, f.name
    names = [f.name for f in fields.FIELDS]
    assert len(names) == len(set(names))
