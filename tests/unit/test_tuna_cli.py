"""How the Tuna commands turn flags into a selection, and name MIOpen's files."""

from __future__ import annotations

import pytest

from fleet.cli.miopen import default_name, selection_of
from fleet.errors import SpecError
from fleet.miopen.select import compile_selection

FORWARD_NHWC_64 = {"kind": "conv", "direction": "F", "in_layout": "NHWC", "in_channels": 64, "spatial_dim": 2,
                   "fil_h": 3, "fil_w": 3, "out_channels": 8}  # fmt: skip


def test_no_flags_select_everything() -> None:
    assert selection_of(None, {"direction": None, "channels_multiple_of": None}) is None


def test_flags_and_an_expression_are_all_required() -> None:
    text = selection_of("fil_h == 3", {"direction": "F", "layout": "NHWC", "channels_multiple_of": "8"})
    assert text is not None
    select = compile_selection(text)
    assert select(FORWARD_NHWC_64)
    assert not select({**FORWARD_NHWC_64, "in_channels": 60})
    assert not select({**FORWARD_NHWC_64, "direction": "B"})
    assert not select({**FORWARD_NHWC_64, "fil_h": 1})


def test_a_bad_multiple_is_refused() -> None:
    with pytest.raises(SpecError, match="positive integer"):
        selection_of(None, {"channels_multiple_of": "eight"})


def test_exports_take_miopen_file_names() -> None:
    assert default_name("find-db", "gfx906:60") == "gfx906_60.HIP.fdb.txt"
    assert default_name("perf-db", "gfx90a:104") == "gfx90a_104.db"
    assert default_name("kernel-db", "gfx906:60") == "gfx906_60.kdb"
