"""MIOpenDriver command lines as tuning teams feed them in, parsed into canonical Fleet problems."""

from __future__ import annotations

import pytest

from fleet.errors import DriverLineError, SpecError
from fleet.miopen.driver import (
    DriverLine,
    driver_argv,
    output_sizes,
    parse_line,
    parse_lines,
    problems,
    with_batch,
    with_command,
)
from tests.conftest import MIOPEN

RESNET = "./bin/MIOpenDriver conv -n 128 -c 1024 -H 14 -W 14 -k 2048 -y 1 -x 1 -p 0 -q 0 -u 2 -v 2 -F 1"


def parsed(name: str) -> list[tuple[int, DriverLine | DriverLineError]]:
    with open(MIOPEN / name) as lines:
        return list(parse_lines(lines))


def test_a_plain_conv_line() -> None:
    line = parse_line(RESNET)

    assert line.command == "conv" and line.kind == "conv" and line.directions == ("F",)
    assert line.params == {
        "spatial_dim": 2,
        "precision": "FP32",
        "batchsize": 128,
        "in_channels": 1024,
        "out_channels": 2048,
        "in_d": 1,
        "in_h": 14,
        "in_w": 14,
        "fil_d": 1,
        "fil_h": 1,
        "fil_w": 1,
        "pad_d": 0,
        "pad_h": 0,
        "pad_w": 0,
        "conv_stride_d": 0,
        "conv_stride_h": 2,
        "conv_stride_w": 2,
        "dilation_d": 0,
        "dilation_h": 1,
        "dilation_w": 1,
        "group_count": 1,
        "bias": 0,
        "in_layout": "NCHW",
        "fil_layout": "NCHW",
        "out_layout": "NCHW",
    }
    assert output_sizes(line.params) == (1, 7, 7)


def test_preambles_paths_and_flags_that_do_not_change_the_problem() -> None:
    same = [
        "miopenConvolutionBackwardData: " + RESNET,
        "MIOpen(HIP): Info [LogCmdConvolution] /opt/rocm/bin/MIOpenDriver " + RESNET.split(" ", 1)[1],
        "MIOpenDriver " + RESNET.split(" ", 1)[1] + " -t 1 -V 0 -i 5 -s 1 -w 1 -P 0 -S -1 -b 1",
        RESNET.split(" ", 1)[1],  # the command without the binary
        "  " + RESNET + "  \n",
    ]
    assert all(parse_line(text) == parse_line(RESNET) for text in same)


def test_long_short_and_inline_flags_are_the_same_flag() -> None:
    short = parse_line("MIOpenDriver conv -n 8 -c 16 -H 9 -W 9 -k 4 -y 3 -x 3 -p 1 -q 1 -u 2 -v 2 -l 1 -j 1 -g 2")
    long = parse_line(
        "MIOpenDriver conv --batchsize 8 --in_channels=16 --in_h 9 --in_w 9 --out_channels 4 --fil_h 3 "
        "--fil_w 3 --pad_h 1 --pad_w 1 --conv_stride_0 2 --conv_stride_w 2 --dilation_h 1 --dilation_w 1 "
        "--group_count 2 --forw 0"
    )
    assert short == long
    assert short.directions == ("F", "B", "W") and short.params["group_count"] == 2


def test_the_last_occurrence_of_a_flag_wins() -> None:
    assert parse_line("MIOpenDriver conv -n 2 -n 4").params["batchsize"] == 4


def test_defaults_of_the_2d_driver() -> None:
    params = parse_line("./bin/MIOpenDriver conv").params
    assert (params["batchsize"], params["in_channels"], params["out_channels"]) == (100, 3, 32)
    assert (params["in_h"], params["in_w"], params["fil_h"], params["fil_w"]) == (32, 32, 3, 3)
    assert (params["pad_h"], params["conv_stride_h"], params["dilation_h"], params["group_count"]) == (0, 1, 1, 1)
    assert params["in_layout"] == params["fil_layout"] == params["out_layout"] == "NCHW"
    # Neutral depth values, as the perf-db config table has them for 2-D rows.
    assert (params["in_d"], params["fil_d"], params["pad_d"], params["conv_stride_d"], params["dilation_d"]) == (
        1,
        1,
        0,
        0,
        0,
    )
    assert parse_line("./bin/MIOpenDriver conv").directions == ("F", "B", "W")


def test_defaults_and_flags_of_the_3d_driver() -> None:
    params = parse_line("MIOpenDriver convfp16 --spatial_dim 3 -! 8 -@ 1 -# 2 -$ 1 -^ 1").params
    assert params["spatial_dim"] == 3 and params["precision"] == "FP16"
    assert (params["in_d"], params["fil_d"], params["conv_stride_d"], params["pad_d"]) == (8, 1, 2, 1)
    assert (params["in_h"], params["fil_h"], params["dilation_d"]) == (32, 3, 1)
    assert params["in_layout"] == params["fil_layout"] == params["out_layout"] == "NCDHW"
    assert parse_line("MIOpenDriver conv -_ 3").params["in_d"] == 32  # the driver's default depth


@pytest.mark.parametrize(
    ("forw", "directions"), [(0, "FBW"), (1, "F"), (2, "B"), (4, "W"), (3, "FB"), (5, "FW"), (6, "BW")]
)
def test_directions_from_the_F_flag(forw: int, directions: str) -> None:
    assert parse_line(f"MIOpenDriver conv -F {forw}").directions == tuple(directions)


def test_every_alexnet_and_googlenet_line_parses() -> None:
    for name, conv_lines, pool_lines in (("alexnet.txt", 14, 3), ("google_net.txt", 49, 11)):
        results = parsed(name)
        assert not [r for _, r in results if isinstance(r, DriverLineError)]
        kinds = [r.kind for _, r in results if isinstance(r, DriverLine)]
        assert (kinds.count("conv"), kinds.count("pool")) == (conv_lines, pool_lines)
    # alexnet.txt names one direction a line, google_net.txt asks for all three.
    convs = [r for _, r in parsed("alexnet.txt") if isinstance(r, DriverLine) and r.kind == "conv"]
    assert sum(len(problems(r)) for r in convs) == 14
    convs = [r for _, r in parsed("google_net.txt") if isinstance(r, DriverLine) and r.kind == "conv"]
    assert sum(len(problems(r)) for r in convs) == 147


def test_pool_lines_with_the_drivers_flags_and_defaults() -> None:
    line = parse_line("./bin/MIOpenDriver pool -n 512 -c 192 -H 27 -W 27 -y 3 -x 2 -p 0 -q 1 -u 2 -v 3 -m avg -t 1")
    assert (line.command, line.kind, line.directions) == ("pool", "pool", ("F", "B"))
    assert line.params == {
        "spatial_dim": 2,
        "precision": "FP32",
        "batchsize": 512,
        "in_channels": 192,
        "in_h": 27,
        "in_w": 27,
        "win_h": 3,
        "win_w": 2,
        "pool_stride_h": 3,  # -v is the stride in height, -u in width
        "pool_stride_w": 2,
        "pad_h": 0,
        "pad_w": 1,
        "mode": "avg",
        "pad_mode": "default",
        "index_type": "miopenIndexUint8",
    }
    half = parse_line("MIOpenDriver poolfp16 -F 1")
    assert half.params["precision"] == "FP16" and half.directions == ("F",) and half.params["batchsize"] == 100
    for problem in problems(line) + problems(half):
        again = parse_line("MIOpenDriver " + " ".join(driver_argv(problem)))
        assert again.params == {k: v for k, v in problem.items() if k != "direction"}
        assert problem["direction"] in again.directions
    with pytest.raises(DriverLineError, match="mode"):
        parse_line("MIOpenDriver pool -m min")


def test_int8_lines() -> None:
    line = parse_line("MIOpenDriver convint8 -n 2 -c 8 -k 8 -F 1")
    assert line.params["precision"] == "INT8"
    assert driver_argv(problems(line)[0])[0] == "convint8"


def test_nhwc_configs_parse_with_layouts_and_the_line_that_relies_on_defaults() -> None:
    results = parsed("conv_configs_NHWC.txt")
    assert [number for number, _ in results] == [1, 3, 4, 5, 8]  # blank lines skipped, numbers kept
    lines = [r for _, r in results]
    assert all(isinstance(line, DriverLine) for line in lines)
    assert all(
        (line.params["in_layout"], line.params["fil_layout"], line.params["out_layout"]) == ("NHWC",) * 3
        for line in lines
    )
    relying_on_defaults = lines[0].params
    assert relying_on_defaults["fil_h"] == relying_on_defaults["fil_w"] == 3  # -y/-x left out
    assert relying_on_defaults["pad_h"] == 0 and relying_on_defaults["conv_stride_w"] == 1
    assert [line.directions for line in lines] == [("F",), ("F",), ("W",), ("B",), ("B",)]
    assert lines[4].params["in_h"] == 28 and lines[4].params["pad_h"] == 1  # long flags, --in_h given twice


def test_batch_norm_lines() -> None:
    results = parsed("batch_norm.txt")
    lines = [r for _, r in results]
    assert len(lines) == 28 and all(isinstance(line, DriverLine) and line.kind == "bnorm" for line in lines)
    first, second, third = lines[:3]
    assert first.directions == ("B",) and second.directions == ("F",) and third.directions == ("I",)
    assert second.params == {
        "spatial_dim": 2,
        "precision": "FP16",
        "batchsize": 256,
        "in_channels": 1024,
        "in_d": 1,
        "in_h": 14,
        "in_w": 14,
        "layout": "NCHW",
        "mode": "spatial",
        "save": 1,
        "run": 1,
    }
    # Flags that do not matter to the direction are dropped: -r in backward, -s in inference.
    assert first.params["run"] == 0 and third.params["save"] == 0
    assert {line.directions for line in lines} == {("F",), ("B",), ("I",)}


def test_batch_norm_defaults_and_3d() -> None:
    line = parse_line("MIOpenDriver bnorm")
    assert line.directions == ("F",)  # neither --forw nor --back: forward training
    assert (line.params["batchsize"], line.params["in_channels"], line.params["mode"]) == (32, 3, "per_activation")
    three = parse_line("MIOpenDriver bnorm -D 4 -L NDHWC --forw 1 -b 1")
    assert three.params["spatial_dim"] == 3 and three.params["layout"] == "NDHWC" and three.directions == ("F",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ls -l", "not an MIOpenDriver command line"),
        ("./bin/MIOpenDriver", "without a command"),
        ("./bin/MIOpenDriver lrn -n 2", "'lrn' is not supported"),
        ("./bin/MIOpenDriver conv -n", "-n of MIOpenDriver conv has no value"),
        ("./bin/MIOpenDriver conv -n two", "-n (batchsize) must be an integer, not 'two'"),
        ("./bin/MIOpenDriver conv -n 0", "-n (batchsize) must be at least 1"),
        ("./bin/MIOpenDriver conv -Q 1", "has no flag -Q"),
        ("./bin/MIOpenDriver conv --nope 1", "has no flag --nope"),
        ("./bin/MIOpenDriver conv 12", "unexpected argument '12'"),
        ("./bin/MIOpenDriver conv -c 6 -k 4 -g 4", "group count 4 must divide"),
        ("./bin/MIOpenDriver conv -m trans", "transposed convolutions"),
        ("./bin/MIOpenDriver conv -F 9", "-F must be"),
        ("./bin/MIOpenDriver conv --spatial_dim 4", "--spatial_dim must be 2 or 3"),
        ("./bin/MIOpenDriver conv -I NCDHW", "--in_layout NCDHW is not supported for 2-D"),
        ("./bin/MIOpenDriver conv -U FP16", "cast types"),
        ("./bin/MIOpenDriver conv -z same -H 4 -u 2 -y 3", "asymmetrically"),
        ("./bin/MIOpenDriver bnorm --forw 3", "--forw must be 0"),
        ("./bin/MIOpenDriver bnorm -L NCDHW", "-L NCDHW is not supported for 2-D"),
    ],
)
def test_bad_lines_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(DriverLineError) as raised:
        parse_line(text)
    assert message in str(raised.value)
    assert isinstance(raised.value, SpecError)


def test_parse_lines_reports_bad_lines_and_goes_on() -> None:
    text = ["# a comment", "", RESNET, "./bin/MIOpenDriver conv -n x", "   ", "./bin/MIOpenDriver bnorm"]
    results = list(parse_lines(text))
    assert [number for number, _ in results] == [3, 4, 6]
    assert isinstance(results[0][1], DriverLine) and isinstance(results[2][1], DriverLine)
    assert isinstance(results[1][1], DriverLineError) and "-n (batchsize)" in str(results[1][1])


def test_pad_modes() -> None:
    same = parse_line("MIOpenDriver conv -z same -H 14 -W 14 -y 3 -x 3 -u 1 -v 1")
    assert (same.params["pad_h"], same.params["pad_w"]) == (1, 1) and output_sizes(same.params)[1:] == (14, 14)
    valid = parse_line("MIOpenDriver conv -z valid -p 2 -q 2")
    assert (valid.params["pad_h"], valid.params["pad_w"]) == (0, 0)


def test_batch_and_command_overrides() -> None:
    line = parse_line(RESNET)
    assert with_batch(line, 16).params["batchsize"] == 16 and line.params["batchsize"] == 128
    half = with_command(line, "convfp16")
    assert half.command == "convfp16" and half.params["precision"] == "FP16"
    assert with_command(half, "convbfp16").params["precision"] == "BF16"
    assert with_command(parse_line("MIOpenDriver bnorm"), "bnormfp16").params["precision"] == "FP16"
    with pytest.raises(DriverLineError, match="cannot replace"):
        with_command(line, "bnorm")
    with pytest.raises(DriverLineError, match="positive integer"):
        with_batch(line, 0)


def test_problems_add_the_direction_and_lines_hash() -> None:
    line = parse_line("MIOpenDriver conv -F 3")
    assert [p["direction"] for p in problems(line)] == ["F", "B"]
    assert all({k: v for k, v in p.items() if k != "direction"} == line.params for p in problems(line))
    assert len({line, parse_line("MIOpenDriver conv -F 3 -t 1")}) == 1


@pytest.mark.parametrize(
    "text",
    [
        RESNET,
        "MIOpenDriver convbfp16 -n 4 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -g 32 -l 2 -j 2 -F 6",
        "MIOpenDriver convfp16 --spatial_dim 3 -n 2 -c 8 -! 9 -H 9 -W 9 -k 8 -@ 3 -y 3 -x 3 -$ 1 -# 2 -^ 1",
        "MIOpenDriver conv -n 32 -c 32 -H 54 -W 54 -k 32 --in_layout NHWC --out_layout NHWC --fil_layout NHWC -F 4",
        "MIOpenDriver bnormfp16 -n 256 -c 64 -H 56 -W 56 -m 1 --forw 1 -b 0 -s 1 -r 1",
        "MIOpenDriver bnorm -n 8 -c 16 -H 7 -W 7 --forw 0 -b 1 -s 1",
        "MIOpenDriver bnorm -n 8 -c 16 -H 7 -W 7 -D 3 -L NDHWC --forw 2 -r 1",
    ],
)
def test_driver_argv_reproduces_each_problem(text: str) -> None:
    for problem in problems(parse_line(text)):
        argv = driver_argv(problem)
        assert all(isinstance(item, str) for item in argv)
        again = parse_line("MIOpenDriver " + " ".join(argv))
        assert problems(again) == [problem]


def test_driver_argv_refuses_bad_params() -> None:
    problem = problems(parse_line(RESNET))[0]
    with pytest.raises(DriverLineError, match="direction"):
        driver_argv({**problem, "direction": "X"})
    with pytest.raises(DriverLineError, match="lack"):
        driver_argv({k: v for k, v in problem.items() if k != "pad_h"})
    with pytest.raises(DriverLineError, match="bias 1"):
        driver_argv({**problem, "bias": 1})
    with pytest.raises(DriverLineError, match="neither"):
        driver_argv({"direction": "F"})
