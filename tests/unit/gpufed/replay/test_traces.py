"""Trace loaders: Philly rows, the generic CSV and its validation, Alibaba pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.replay.traces import TraceError, gang_shape, load_trace

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_philly_rows_are_sorted_by_submit_time_from_the_first_submission(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        PHILLY_HEADER
        + "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
        + "2017-10-09 06:13:03,2951.0,16,47216.0,6214e9\n"
        + "2017-10-09 06:13:03,10.0,12,120.0,ee9e8c\n",
    )
    jobs = load_trace(path, "philly")
    assert [(j.submit, j.team) for j in jobs] == [
        (0.0, "6214e9"),  # same second as the next one: file order breaks the tie
        (0.0, "ee9e8c"),
        (2932.0, "11cb48"),
    ]
    assert [(j.nodes, j.gpus_per_node) for j in jobs] == [(2, 8), (2, 6), (1, 1)]
    assert jobs[0].duration == 2951.0
    assert jobs[2].priority == "training"
    assert len({j.id for j in jobs}) == 3


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [
        (1, (1, 1)),
        (8, (1, 8)),
        (12, (2, 6)),
        (16, (2, 8)),
        (24, (3, 8)),
        (20, (3, 7)),
        (128, (16, 8)),
    ],
)
def test_wide_jobs_become_gangs_of_nodes(gpus: int, shape: tuple[int, int]) -> None:
    nodes, per_node = gang_shape(gpus, 8)
    assert (nodes, per_node) == shape
    assert nodes * per_node >= gpus


def test_philly_bad_timestamp_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, PHILLY_HEADER + "2017-10-09 07:01:55,66,1,66,a1\nyesterday,1,1,1,a1\n")
    with pytest.raises(TraceError, match=r"line 3, column timestamp: 'yesterday'"):
        load_trace(path, "philly")


def test_csv_reads_optional_columns_and_fractions(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "submit_time,duration,num_gpus,team,gpu_model,priority\n"
        "5,100,0.5,vision,A100|H100,dev\n"
        "0,10,2,nlp,,\n",
    )
    first, second = load_trace(path, "csv")
    assert (first.team, first.nodes, first.gpus_per_node, first.fraction) == ("nlp", 1, 2, None)
    assert first.gpu_models == () and first.priority == "training"
    assert (second.submit, second.fraction, second.gpus) == (5.0, 0.5, 0.5)
    assert second.gpu_models == ("A100", "H100") and second.priority == "dev"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("1,abc,1,t\n", r"line 2, column duration: 'abc' is not a number"),
        ("1,0,1,t\n", r"line 2, column duration: must be greater than 0"),
        ("-1,5,1,t\n", r"line 2, column submit_time: must not be negative"),
        ("1,5,1.5,t\n", r"line 2, column num_gpus: '1.5' must be a whole number"),
        ("1,5,1,Team_A\n", r"line 2, column team: 'Team_A' is not a team name"),
        ("1,5,1\n", r"line 2: expected 4 columns"),
        ("1,5,1,t\n1,5,1,t,extra\n", r"line 3: expected 4 columns"),
    ],
)
def test_csv_errors_name_line_and_column(tmp_path: Path, body: str, message: str) -> None:
    path = write(tmp_path, "submit_time,duration,num_gpus,team\n" + body)
    with pytest.raises(TraceError, match=message):
        load_trace(path, "csv")


def test_csv_missing_column_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,duration,gpus,team\n1,2,3,t\n")
    with pytest.raises(TraceError, match=r"line 1: missing column\(s\) num_gpus"):
        load_trace(path, "csv")


def test_missing_file_and_unknown_format_say_so(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "nope.csv", "csv")
    with pytest.raises(TraceError, match="unknown trace format 'swf'"):
        load_trace(tmp_path / "nope.csv", "swf")


def test_alibaba_pods_skip_cpu_only_and_read_fractions(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p0,1000,1024,0,0,,BE,Running,0,100,0\n"
        "p1,1000,1024,1,460,,LS,Running,10,110,20\n"
        "p2,1000,1024,8,1000,V100M16,BE,Running,30,50,30\n"
        "p3,1000,1024,1,1000,,LS,Pending,40,,\n",
    )
    jobs = load_trace(path, "alibaba")
    assert [(j.team, j.fraction, j.gpus, j.duration) for j in jobs] == [
        ("ls", 0.46, 0.46, 90.0),
        ("be", None, 8.0, 20.0),
    ]
    assert jobs[1].gpu_models == ("V100M16",)


def test_csv_saved_by_excel_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    # Excel's "CSV UTF-8" starts with a BOM; it used to read as a header without submit_time.
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbfsubmit_time,duration,num_gpus,team\r\n0,100,2,vision\r\n")
    (job,) = load_trace(path, "csv")
    assert (job.submit, job.duration, job.gpus, job.team) == (0.0, 100.0, 2, "vision")


def test_a_trace_not_in_utf8_is_refused_naming_its_line(tmp_path: Path) -> None:
    # Saved as Latin-1 ("équipe"): Python's decoder named neither the file nor the line.
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"submit_time,duration,num_gpus,team\n0,10,1,vision\n5,10,1,\xe9quipe\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path, "csv")
    assert str(caught.value) == f"{path} line 3: not UTF-8 text (byte 0xe9); save it as UTF-8"
