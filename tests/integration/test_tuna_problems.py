"""MIOpen problems in the store, on SQLite and PostgreSQL: import from driver lines, tags, keys, selection, query."""

from __future__ import annotations

import pytest

from fleet.errors import SpecError
from fleet.store import Store
from fleet.tuna.problems import describe, import_lines, problems_by_key, select_problems
from tests.conftest import MIOPEN


def lines(name: str) -> list[str]:
    return (MIOPEN / name).read_text().splitlines()


def test_alexnet_imports_one_problem_per_direction_and_reports_bad_lines(store: Store) -> None:
    report = import_lines(store, lines("alexnet.txt"), tags=["alexnet"])
    # alexnet.txt: 14 conv lines with one direction each, and three pool lines (forward and backward each).
    assert (report.created, report.known, report.tagged) == (20, 0, 20)
    assert report.unreadable == []
    again = import_lines(store, lines("alexnet.txt"), tags=["alexnet"])
    assert (again.created, again.known) == (0, 20)
    assert len(select_problems(store, tags=["alexnet"])) == 14  # the kinds jobs tune
    pools = select_problems(store, tags=["alexnet"], kinds=["pool"])
    assert len(pools) == 6 and {p["mode"] for _, _, p in pools} == {"max"}


def test_duplicates_are_found_by_the_problem_not_the_text(store: Store) -> None:
    first = import_lines(store, ["./bin/MIOpenDriver conv -n 32 -c 64 -H 28 -W 28 -k 128 -y 3 -x 3 -p 1 -q 1 -F 1"])
    same = [
        # another order, long flags, flags that do not change the problem, a logging preamble, explicit defaults
        "miopenConvolutionForward: MIOpenDriver conv --batchsize 32 -k 128 -c 64 -W 28 -H 28 -x 3 -y 3 "
        "--pad_h 1 --pad_w 1 -u 1 -v 1 -l 1 -j 1 -g 1 -m conv -t 1 -V 0 -i 5 -s 1 -F 1",
    ]
    second = import_lines(store, same)
    assert (first.created, second.created, second.known) == (1, 0, 1)
    assert first.problem_ids == second.problem_ids


def test_tag_only_creates_nothing(store: Store) -> None:
    import_lines(store, lines("alexnet.txt"), tags=["alexnet"])
    report = import_lines(store, lines("alexnet.txt") + lines("google_net.txt"), tags=["cnn"], tag_only=True)
    assert report.created == 0
    assert report.tagged == 20
    assert report.missing > 0
    assert len(select_problems(store, tags=["cnn"])) == 14
    assert len(select_problems(store, tags=["cnn", "alexnet"])) == 14


def test_batch_sizes_and_command_override_and_recurrent(store: Store) -> None:
    line = ["./bin/MIOpenDriver conv -n 512 -c 192 -H 13 -W 13 -k 384 -y 3 -x 3 -p 1 -q 1 -F 0"]
    report = import_lines(store, line, tags=["b"], batches=[1, 2, 4], command="convfp16", recurrent=True)
    assert report.created == 9  # three batch sizes, three directions
    found = select_problems(store, tags=["b", "recurrent"])
    assert sorted({p["batchsize"] for _, _, p in found}) == [1, 2, 4]
    assert {p["precision"] for _, _, p in found} == {"FP16"}
    assert sorted({p["direction"] for _, _, p in found}) == ["B", "F", "W"]


def test_layouts_defaults_3d_and_bnorm(store: Store) -> None:
    nhwc = import_lines(store, lines("conv_configs_NHWC.txt"), tags=["nhwc"])
    assert nhwc.unreadable == []
    assert nhwc.created == 5
    assert {p["in_layout"] for _, _, p in select_problems(store, tags=["nhwc"])} == {"NHWC"}
    three = import_lines(
        store, ["MIOpenDriver conv -n 4 -c 16 -H 8 -W 8 --in_d 8 -k 32 -y 3 -x 3 --fil_d 3 --spatial_dim 3 -F 1"]
    )
    assert three.created == 1
    bn = import_lines(store, lines("batch_norm.txt"), tags=["bn"])
    assert bn.unreadable == [] and bn.created > 0
    kinds = {kind for _, kind, _ in select_problems(store, tags=["bn"])}
    assert kinds == {"bnorm"}


def test_keys_are_indexed_and_found(store: Store) -> None:
    import_lines(store, ["./bin/MIOpenDriver conv -n 128 -c 1024 -H 14 -W 14 -k 2048 -y 1 -x 1 -u 2 -v 2 -F 3"])
    forward = problems_by_key(store, "1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F")
    backward = problems_by_key(store, "2048-7-7-1x1-1024-14-14-128-0x0-2x2-1x1-0-NCHW-FP32-B")
    assert [p.params["direction"] for p in forward + backward] == ["F", "B"]
    assert problems_by_key(store, "2048-7-7-1x1-1024-14-14-128-0x0-2x2-1x1-0-NCHW-FP32-W") == []


def test_selection_by_parameters(store: Store) -> None:
    import_lines(store, lines("google_net.txt"), tags=["gn"])
    everything = select_problems(store, tags=["gn"])
    forward_1x1 = select_problems(store, tags=["gn"], selection='direction == "F" and filter == "1x1"')
    assert forward_1x1 and len(forward_1x1) < len(everything)
    assert all(p["fil_h"] == p["fil_w"] == 1 and p["direction"] == "F" for _, _, p in forward_1x1)
    aligned = select_problems(store, tags=["gn"], selection="in_channels % 8 == 0 and stride == '1x1'")
    assert all(p["in_channels"] % 8 == 0 and p["conv_stride_h"] == 1 for _, _, p in aligned)
    with pytest.raises(SpecError, match="names"):
        select_problems(store, selection="colour == 3")


def test_query_a_driver_line_and_a_find_db_line(store: Store) -> None:
    import_lines(store, lines("alexnet.txt"), tags=["alexnet"], recurrent=True)
    shown = describe(store, lines("alexnet.txt")[0])
    assert shown["source"] == "driver"
    assert shown["keys"] == ["192-13-13-3x3-384-13-13-512-1x1-1x1-1x1-0-NCHW-FP32-F"]
    assert shown["problems"][0]["tags"] == ["alexnet", "recurrent"]
    assert shown["problems"][0]["trials"] == []
    by_db_line = describe(
        store, shown["keys"][0] + "=miopenConvolutionFwdAlgoGEMM:GemmFwd1x1_0_1,1.5,0,rocBlas,<unused>"
    )
    assert by_db_line["source"] == "db"
    assert by_db_line["problems"][0]["id"] == shown["problems"][0]["id"]
    with pytest.raises(SpecError, match="not a MIOpenDriver line"):
        describe(store, "hello world")


def test_pooling_lines_are_problems_with_no_db_key(store: Store) -> None:
    pool = "./bin/MIOpenDriver pool -n 128 -c 192 -H 28 -W 28 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -m max -t 1"
    report = import_lines(store, [pool], tags=["gn"])
    assert report.created == 2 and report.unreadable == []
    shown = describe(store, pool)
    assert [(p["kind"], p["direction"], p["key"]) for p in shown["problems"]] == [
        ("pool", "F", None),
        ("pool", "B", None),
    ]
    assert shown["keys"] == [] and all(p["tags"] == ["gn"] for p in shown["problems"])
    assert all("no tuning database for pooling" in p["note"] for p in shown["problems"])
