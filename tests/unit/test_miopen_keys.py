"""MIOpen's find-db / perf-db keys: derived from driver lines, checked against the find-db MIOpen ships."""

from __future__ import annotations

import bz2
import lzma

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.errors import MIOpenDbError, SpecError
from fleet.miopen.driver import DriverLine, parse_line, parse_lines, problems
from fleet.miopen.keys import db_key, db_keys, is_legacy_spelling, key_frame, parse_key
from tests.conftest import MIOPEN


@pytest.fixture(scope="module")
def fdb_keys() -> list[str]:
    """Every key of the find-db MIOpen ships for gfx803 (its keys only: the whole file is 19 times the size)."""
    with lzma.open(MIOPEN / "gfx803_36.HIP.fdb.keys.xz", "rt") as lines:
        return [line.strip() for line in lines if line.strip()]


def test_the_readme_examples() -> None:
    line = parse_line("MIOpenDriver conv -n 128 -c 1024 -H 14 -W 14 -k 2048 -y 1 -x 1 -p 0 -q 0 -u 2 -v 2 -F 3")
    forward, backward = problems(line)
    assert db_key(forward) == "1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F"
    assert db_key(backward) == "2048-7-7-1x1-1024-14-14-128-0x0-2x2-1x1-0-NCHW-FP32-B"
    assert db_key({**backward, "direction": "W"}) == "2048-7-7-1x1-1024-14-14-128-0x0-2x2-1x1-0-NCHW-FP32-W"


@pytest.mark.parametrize(("name", "count"), [("alexnet.txt", 14), ("google_net.txt", 147)])
def test_every_network_conv_problem_has_its_key_in_the_shipped_find_db(
    fdb_keys: list[str], name: str, count: int
) -> None:
    known = set(fdb_keys)
    with open(MIOPEN / name) as lines:
        convs = [line for _, line in parse_lines(lines) if isinstance(line, DriverLine) and line.kind == "conv"]
        keys = [db_key(p) for line in convs for p in problems(line)]
    assert len(keys) == count
    assert [key for key in keys if key not in known] == []


def test_every_key_of_the_shipped_find_db_round_trips(fdb_keys: list[str]) -> None:
    assert len(fdb_keys) == 59336
    assert [key for key in fdb_keys if db_key(parse_key(key)) != key] == []


def test_keys_of_groups_3d_and_layouts() -> None:
    grouped = problems(parse_line("MIOpenDriver conv -n 32 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -g 32 -F 1"))
    assert db_key(grouped[0]) == "64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-F_g32"
    three = problems(
        parse_line(
            "MIOpenDriver conv --spatial_dim 3 -n 4 -c 1024 --in_d 4 -H 14 -W 14 -k 2048 --fil_d 1 -y 1 -x 1 "
            "--conv_stride_d 2 -u 2 -v 2 -F 1"
        )
    )[0]
    # The shipped (MIOpen 2.x) spelling, and MIOpen 3.x's.
    assert db_key(three) == "1024-4-14-14-1x1x1-2048-2-7-7-4-0x0-2x2x2-1x1x1-0-NCHW-FP32-F"
    assert db_key(three, style="current") == "1024-4-14-14-1x1x1-2048-2-7-7-4-0x0x0-2x2x2-1x1x1-0-NCDHW-FP32-F"
    assert parse_key(db_key(three, style="current")) == parse_key(db_key(three)) == three
    assert db_keys(three) == (db_key(three), db_key(three, style="current"))
    assert db_keys(grouped[0]) == (db_key(grouped[0]),)  # 2-D keys are spelled one way
    nhwc = problems(parse_line("MIOpenDriver convfp16 -n 8 -c 16 -H 7 -W 7 -k 32 -I NHWC -O NHWC -f NCHW -F 2"))[0]
    # Backward describes the problem from dy: input and output swap places, layouts too.
    assert db_key(nhwc) == "32-5-5-3x3-16-7-7-8-0x0-1x1-1x1-0-NHWC-NCHW-NHWC-FP16-B"
    mixed = problems(parse_line("MIOpenDriver conv -n 8 -c 16 -H 7 -W 7 -k 32 -I NHWC -O NCHW -f NCHW -F 2"))[0]
    assert db_key(mixed) == "32-5-5-3x3-16-7-7-8-0x0-1x1-1x1-0-NCHW-NCHW-NHWC-FP32-B"
    assert parse_key(db_key(mixed)) == mixed


def test_key_frame_swaps_sides_for_backward_directions() -> None:
    forward = problems(parse_line("MIOpenDriver conv -n 2 -c 3 -H 227 -W 227 -k 64 -y 11 -x 11 -u 4 -v 4 -F 1"))[0]
    frame = key_frame({**forward, "direction": "W"})
    assert (frame["in_channels"], frame["in_h"], frame["out_channels"], frame["out_h"]) == (64, 55, 3, 227)
    assert key_frame(forward)["out_h"] == 55


def test_int8_keys_and_the_data_types_miopen_writes() -> None:
    key = "1024-14-14-1x1-2048-7-7-1-0x0-2x2-1x1-0-NCHW-INT8-F"  # from the gfx90a find-db
    assert parse_key(key)["precision"] == "INT8" and db_key(parse_key(key)) == key
    with pytest.raises(MIOpenDbError, match="data type MIOpenDriver has no conv command for"):
        parse_key(key.replace("INT8", "INT32"))
    with pytest.raises(MIOpenDbError, match="not a data type"):
        parse_key(key.replace("INT8", "INT7"))


def test_pooling_problems_have_no_key() -> None:
    pool = problems(parse_line("MIOpenDriver pool -n 2"))[0]
    with pytest.raises(SpecError, match="no tuning database"):
        db_key(pool)


def test_batch_norm_problems_have_no_key() -> None:
    bnorm = problems(parse_line("MIOpenDriver bnorm -n 2 -c 3"))[0]
    with pytest.raises(SpecError, match="batch-norm problems have no MIOpen"):
        db_key(bnorm)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("1-2-3", "has 3 parts"),
        ("a-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F", "is not a MIOpen conv key"),
        ("1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP64-F", "precision 'FP64'"),
        ("1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-X", "direction 'X'"),
        ("1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F_ciFP16", "only _g<groups>"),
        ("1024-14-14-1x1-2048-9-9-128-0x0-2x2-1x1-0-NCHW-FP32-F", "output size 9x9 does not follow"),
        ("1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NHWC-FP32-F", "single layout must be the default"),
        ("1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F_g3", "group count 3 must divide"),
    ],
)
def test_bad_keys_say_what_is_wrong(key: str, message: str) -> None:
    with pytest.raises(MIOpenDbError) as raised:
        parse_key(key)
    assert message in str(raised.value)


sizes = st.integers(min_value=1, max_value=64)


@st.composite
def conv_problems(draw: st.DrawFn) -> dict:
    three = draw(st.booleans())
    axes = ("d", "h", "w") if three else ("h", "w")
    groups = draw(st.sampled_from([1, 1, 2, 4]))
    layout = draw(st.sampled_from(["NCDHW", "NDHWC"] if three else ["NCHW", "NHWC"]))
    params = {
        "spatial_dim": 3 if three else 2,
        "precision": draw(st.sampled_from(["FP32", "FP16", "BF16"])),
        "batchsize": draw(sizes),
        "in_channels": groups * draw(sizes),
        "out_channels": groups * draw(sizes),
        "in_d": 1,
        "fil_d": 1,
        "pad_d": 0,
        "conv_stride_d": 0,
        "dilation_d": 0,
        "group_count": groups,
        "bias": 0,
        "in_layout": layout,
        "fil_layout": draw(st.sampled_from([layout, "NCDHW" if three else "NCHW"])),
        "out_layout": layout,
        "direction": draw(st.sampled_from(["F", "B", "W"])),
    }
    for axis in axes:
        fil = draw(st.integers(min_value=1, max_value=7))
        dilation = draw(st.integers(min_value=1, max_value=3))
        stride = draw(st.integers(min_value=1, max_value=4))
        pad = draw(st.integers(min_value=0, max_value=3))
        size = draw(st.integers(min_value=1, max_value=80))  # the key holds both x's and dy's sizes
        params.update({f"fil_{axis}": fil, f"dilation_{axis}": dilation, f"conv_stride_{axis}": stride})
        params.update({f"pad_{axis}": pad, f"in_{axis}": size})
    return params


@settings(max_examples=300, deadline=None)
@given(conv_problems(), st.sampled_from(["legacy", "current"]))
def test_random_conv_problems_round_trip_through_their_key(problem: dict, style: str) -> None:
    assert parse_key(db_key(problem, style=style)) == problem


def _respellings(key: str) -> list[str]:
    """Other spellings of a key that parse_key reads: leading zeros, non-ASCII digits, current-style 3-D parts,
    default layouts written out, blanks."""
    return [
        key.replace("-0x0-", "-0x0x0-"),
        key.replace("-NCHW-", "-NCDHW-"),
        key.replace("-NCHW-", "-NCHW-NCHW-NCHW-"),
        key.replace("-NCDHW-", "-NCDHW-NCDHW-NCDHW-"),
        "0" + key,
        key.replace("_g", "_g0"),
        f" {key}",
        key.replace("-1x1-", "-01x1-", 1),
        key.replace("-1-", "-\u0661-", 1),  # ARABIC-INDIC DIGIT ONE: a digit to isdigit() and int()
    ]


@settings(max_examples=300, deadline=None)
@given(conv_problems(), st.sampled_from(["legacy", "current"]))
def test_legacy_spelling_is_told_from_the_text(problem: dict, style: str) -> None:
    # The import keeps a key as its problem's key when is_legacy_spelling says db_key would write it so.
    key = db_key(problem, style=style)
    for spelling in [key, *_respellings(key)]:
        try:
            parsed = parse_key(spelling)
        except MIOpenDbError:
            continue
        assert is_legacy_spelling(spelling) == (db_key(parsed) == spelling), spelling


def test_legacy_spelling_of_the_shipped_find_dbs(fdb_keys: list[str]) -> None:
    # A sample of the gfx90a68 find-db's 193,590 keys (tests/data/README.md): three of each shape of key (its
    # numbers other than 0 and 1 left out), every INT8 one and every 250th, so every spelling the file has is here.
    with bz2.open(MIOPEN / "gfx90a68.HIP.fdb.txt.bz2", "rt") as lines:
        newer = [line.split("=", 1)[0] for line in lines if line.strip()]
    assert all(is_legacy_spelling(key) for key in fdb_keys)
    spelt = [is_legacy_spelling(key) for key in newer]
    assert spelt == [db_key(parse_key(key)) == key for key in newer]
    assert spelt.count(False) == 1457  # the 3-D keys, spelt the MIOpen 3.x way
    assert spelt.count(False) == sum("NCDHW" in key for key in newer)
