"""Selecting MIOpen problems by their parameters, as Tuna's SQL does."""

from __future__ import annotations

import pytest

from fleet.errors import SpecError
from fleet.miopen.driver import DriverLine, parse_line, parse_lines, problems
from fleet.miopen.select import compile_selection, selection_from_flags, selection_values
from tests.conftest import MIOPEN


def load(name: str) -> list[dict]:
    with open(MIOPEN / name) as lines:
        found = [line for _, line in parse_lines(lines) if isinstance(line, DriverLine) and line.kind != "pool"]
        return [p for line in found for p in problems(line)]


@pytest.fixture(scope="module")
def convs() -> list[dict]:
    return load("google_net.txt") + load("alexnet.txt") + load("conv_configs_NHWC.txt")


@pytest.fixture(scope="module")
def bnorms() -> list[dict]:
    return load("batch_norm.txt")


def count(text: str, problems_: list[dict]) -> int:
    predicate = compile_selection(text)
    return sum(1 for p in problems_ if predicate(p))


def expected(problems_: list[dict], test) -> int:
    return sum(1 for p in problems_ if test(p))


def test_tuna_style_selections(convs: list[dict]) -> None:
    assert len(convs) == 147 + 14 + 5
    assert count('direction == "F"', convs) == expected(convs, lambda p: p["direction"] == "F") == 49 + 5 + 2
    assert count('layout == "NHWC"', convs) == 5
    assert count('precision == "FP32" and spatial_dim == 2', convs) == len(convs)
    assert count('filter == "3x3"', convs) == expected(convs, lambda p: (p["fil_h"], p["fil_w"]) == (3, 3))
    assert count("in_channels % 8 == 0", convs) == expected(convs, lambda p: p["in_channels"] % 8 == 0)
    assert count('stride == "4x4" or pad == "2x2"', convs) == expected(
        convs, lambda p: p["conv_stride_h"] == 4 or p["pad_h"] == 2
    )
    assert count('dilation == "1x1" and groups == 1 and k >= 256', convs) == expected(
        convs, lambda p: p["out_channels"] >= 256
    )
    assert count("fil_h * fil_w >= 25 and batch == 512", convs) == expected(
        convs, lambda p: p["fil_h"] * p["fil_w"] >= 25 and p["batchsize"] == 512
    )
    assert count('direction in ("B", "W") and not c < 100', convs) == expected(
        convs, lambda p: p["direction"] != "F" and p["in_channels"] >= 100
    )
    assert count("", convs) == len(convs)


def test_3d_values() -> None:
    problem = problems(parse_line("MIOpenDriver conv --spatial_dim 3 -! 4 -@ 1 -# 2 -u 2 -v 2 -F 1"))[0]
    values = selection_values(problem)
    assert (values["filter"], values["stride"], values["dims"], values["layout"]) == ("1x3x3", "2x2x2", 3, "NCDHW")
    assert compile_selection('spatial_dim == 3 and filter == "1x3x3" and fil_d == 1')(problem)


def test_one_selection_over_both_kinds(convs: list[dict], bnorms: list[dict]) -> None:
    assert count('kind == "bnorm" and mode == "spatial"', bnorms) == 28
    assert count('kind == "bnorm"', convs) == 0
    # A conv-only name has no value for bnorm problems: not selected, and no error.
    assert count("fil_h == 3 or in_channels % 7 == 0", bnorms) == 0
    assert count('layout == "NCHW" and direction == "I"', bnorms) == 4  # the four --forw 2 lines
    assert count('layout == "NCHW" and in_h > 28', convs + bnorms) == expected(
        convs + bnorms, lambda p: p.get("in_layout", p.get("layout")) == "NCHW" and p["in_h"] > 28
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("layout == NHWC", 'names NHWC, which no problem has (put values in quotes: layout == "NHWC")'),
        ("colour == 1", "names colour, which no problem has"),
        ("().__class__", "Attribute is not allowed"),
        ('__import__("os")', "only min(), max() and abs() may be called"),
        ("open('x')", "only min(), max() and abs() may be called"),
        ("in_channels %", "invalid syntax"),
        ("[x for x in (1, 2)]", "is not allowed"),
    ],
)
def test_bad_selections_raise_spec_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        compile_selection(text)
    assert message in str(raised.value)


def test_selections_from_cli_flags(convs: list[dict]) -> None:
    text = selection_from_flags(direction="f", layout="NCHW", precision="FP32", spatial_dim=2, filter=["3x3", "5x5"])
    assert text == (
        "direction == 'F' and layout == 'NCHW' and precision == 'FP32' and spatial_dim == 2 "
        "and filter in ('3x3', '5x5')"
    )
    assert count(text, convs) == expected(
        convs, lambda p: p["direction"] == "F" and p["in_layout"] == "NCHW" and p["fil_h"] in (3, 5)
    )
    assert selection_from_flags(direction=None, layout=[], groups=None) == ""
    assert (
        selection_from_flags(groups=32, stride="2x2", batch=128)
        == "groups == 32 and stride == '2x2' and batchsize == 128"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"colour": "red"}, "no selection flag 'colour'"),
        ({"filter": "3"}, "--filter must look like 3x3"),
        ({"spatial_dim": "two"}, "--spatial-dim must be an integer"),
        ({"groups": 0}, "--groups must be a positive integer"),
        ({"layout": "NC'HW"}, "is not a layout"),
    ],
)
def test_bad_flags(flags: dict, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        selection_from_flags(**flags)
    assert message in str(raised.value)
