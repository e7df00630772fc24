"""fleet/spec/schema.json, the JSON Schema of a spec file: a valid schema, every example spec validates, and
the loader (load_spec) and the schema agree on good and bad specs. The complete specs in docs/spec.md are
checked the same way, so that the page shows nothing the loader refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fleet.driving.campaign import load_spec
from fleet.errors import SpecError
from fleet.search import STRATEGIES
from fleet.space_files import load_space_file
from fleet.spec.workloads import SPECS
from fleet.targets import TARGET
from fleet.tvm.operators import KIND_OF_OP
from tests.unit.test_spec import SPEC, make

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "fleet" / "spec" / "schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def with_workload(**overrides: Any) -> dict[str, Any]:
    workload = {**SPEC["workload"], **overrides}
    return make(workload={k: v for k, v in workload.items() if v is not None})


def with_space(**overrides: Any) -> dict[str, Any]:
    space = {**SPEC["space"], **overrides}
    return make(space={k: v for k, v in space.items() if v is not None})


def with_strategy(**overrides: Any) -> dict[str, Any]:
    strategy = {**SPEC["strategy"], **overrides}
    return make(strategy={k: v for k, v in strategy.items() if v is not None})


TVM = {
    "name": "dense",
    "problems": [{"kind": "tvm.dense", "params": {"m": 64, "n": 64, "k": 64}}],
    "space": {"knobs": {"tile_x": [8, 16], "tile_y": [8, 16]}},
    "workload": {"kind": "tvm", "op": "dense", "repeats": 2, "min_repeat_ms": 5},
}
MIOPEN = {
    "name": "conv",
    "target": "gfx90a:104",
    "problems": [{"kind": "conv", "params": {"n": 1}}],
    "space": {"knobs": {"step": ["perf", "find"]}},
    "workload": {"kind": "miopen", "run_timeout": 600},
}
NOOP = {"problems": [{"kind": "noop"}], "space": {"knobs": {"x": [1, 2]}}, "workload": {"kind": "noop"}}
ANNEAL = {"name": "anneal", "budget": 10, "options": {"on_fleet": True, "chains": 2, "temperature": 0.5}}

GOOD = [
    make(),
    make(name=None, target=None, strategy=None, baseline=None),
    make(name=""),  # a file's empty name falls back to the file's
    make(target="sm_90a"),
    make(target="gfx90a:104"),
    make(problems=[{"kind": "tiny", "params": {"n": 1.5}}, {"kind": "tiny", "params": {"n": True}, "tags": []}]),
    with_space(knobs={"size": [1, 2], "scale": {"values": [1, 3], "build": False}}, run_time=None),
    # Strings and mixed values; no constraint ("size < 4" holds for no string: a space with nothing to try).
    with_space(knobs={"size": {"values": ["a", "b"]}, "scale": [1.5, True]}, constraints=None),
    with_space(base={"limit": 4}, constraints=["size * scale <= limit", "min(size, 2) in (1, 2)"]),
    with_strategy(name="grid", budget=None),
    make(strategy={"name": "anneal", "budget": 5, "options": {"temperature": 2.0}}),
    make(strategy=ANNEAL, space={"knobs": {"size": [1, 2], "scale": [1, 3]}}, baseline=None),
    make(options={"remeasure": True}),
    make(baseline={"size": 99, "scale": 1}),
    with_workload(build=None),
    with_workload(sources=None, build=["cc", "-o", "k", "k.c"]),
    with_workload(build=["gcc", {"if": "size", "then": ["-DBIG"], "else": []}, "-o", "k", "k.c"]),
    with_workload(run=["./k", '--json={{"n": {n}}}', "{scale}"]),
    with_workload(objective={"regex": r"score: (\d+)", "goal": "max"}),
    with_workload(warmup=0, repeats=5, build_timeout=0.5, run_timeout=10, toolchain=["gcc", "-dumpversion"]),
    TVM,
    MIOPEN,
    NOOP,
]

BAD = [
    make(budget=10),
    make(problems=None),
    make(problems=[]),
    make(problems=[{"params": {"n": 1}}]),
    make(problems=[{"kind": ""}]),
    make(problems=[{"kind": "tiny", "params": [1]}]),
    make(problems=[{"kind": "tiny", "params": {"n": None}}]),
    make(problems=[{"kind": "tiny", "params": {"n": 1}, "tags": "small"}]),
    make(space=None),
    make(space={"knobs": {}}),
    make(space={"knobs": {"size": [1]}, "ranges": {"scale": [1, 4]}}),
    with_space(knobs={"size": [[1, 2]], "scale": [1]}),
    with_space(knobs={"size": [None], "scale": [1]}),
    with_space(knobs={"size": [], "scale": [1]}),
    with_space(knobs={"size": [1, 1], "scale": [1]}),
    with_space(knobs={"size": "1,2", "scale": [1]}),
    with_space(knobs={"size": {"values": [1], "build": "no"}, "scale": [1]}),
    with_space(knobs={"size": {"values": [1], "run": True}, "scale": [1]}),
    with_space(knobs={"size-x": [1], "scale": [1]}),
    with_space(constraints="size < 4"),
    make(space={"file": "grid.json", "extra": 1}),
    make(space="grid.yaml"),
    make(strategy="random"),
    make(strategy={"name": "magic"}),
    with_strategy(budgte=3),
    with_strategy(budget=0),
    with_strategy(budget="ten"),
    with_strategy(budget=True),
    with_strategy(seed="ten"),
    make(strategy={**ANNEAL, "options": {**ANNEAL["options"], "steps": 3}}),
    make(strategy={**ANNEAL, "options": {**ANNEAL["options"], "chains": 0}}),
    make(target="gpu9000"),
    make(target="sm_9"),
    make(workload=None),
    with_workload(kind="shell"),
    with_workload(sources="k.c"),
    with_workload(sources=["../k.c"]),
    with_workload(sources=["/etc/passwd"]),
    with_workload(run="./k 1"),
    with_workload(run=[]),
    with_workload(run=None),
    with_workload(build="gcc k.c"),
    with_workload(build=[]),
    with_workload(build=["gcc", 3]),
    with_workload(build=["gcc", {"when": "size", "then": ["-O3"]}]),
    with_workload(objective=None),
    with_workload(objective={"name": "score"}),
    with_workload(objective={"json": "score", "regex": "(x)"}),
    with_workload(objective={"json": "score", "goal": "maximize"}),
    with_workload(repeats=0),
    with_workload(warmup=-1),
    with_workload(repeats=True),
    with_workload(run_timeout=0),
    with_workload(build_timeout="1m"),
    with_workload(artifacts="k"),
    with_workload(timeout=30),
    make(baseline=[1]),
    make(baseline={"size": [1]}),
    make(options=[1]),
    make(name=3),
    {**TVM, "workload": {"kind": "tvm", "op": "softmax"}},
    {**TVM, "workload": {"kind": "tvm", "op": "dense", "repeats": 0}},
    {**TVM, "workload": {"kind": "tvm", "op": "dense", "sources": ["k.c"]}},
    {**MIOPEN, "workload": {"kind": "miopen", "run_timeout": -1}},
    {**MIOPEN, "workload": {"kind": "miopen", "driver": "x"}},
    {"problems": [{"kind": "r"}], "space": {"knobs": {"x": [1]}}, "workload": {"kind": "replay"}},
    [SPEC],
]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "k.c").write_text("int main(void) { return 0; }\n")
    (tmp_path / "grid.json").write_text('{"size": [1, 2], "scale": [1, 3]}')
    return tmp_path


def schema_accepts(data: Any) -> bool:
    return VALIDATOR.is_valid(data)


def load(data: Any, directory: Path) -> None:
    """Load ``data`` as a spec file in ``directory``, as `fleet tune` does (its name defaults to the file's)."""
    path = directory / "spec.json"
    path.write_text(json.dumps(data))
    load_spec(path)


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_schema_is_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '"fleet.spec" = ["schema.json"]' in text


def test_the_schema_names_what_the_loader_knows() -> None:
    defs = SCHEMA["$defs"]
    # kernel_tuner is what `fleet import kt` writes, never a spec's: the loader refuses it in a spec, and so does
    # the schema, which leaves it out.
    assert set(defs["workload"]["properties"]["kind"]["enum"]) == set(SPECS) - {"kernel_tuner"}
    assert set(defs["strategy"]["properties"]["name"]["enum"]) == set(STRATEGIES)
    assert set(defs["tvm"]["properties"]["op"]["enum"]) == set(KIND_OF_OP)
    assert SCHEMA["properties"]["target"]["pattern"] == TARGET.pattern


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("**/*.json")), ids=lambda p: p.parent.name)
def test_every_example_spec_validates(path: Path) -> None:
    data = json.loads(path.read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(data)]
    assert errors == []
    load_spec(path)


@pytest.mark.parametrize("data", GOOD)
def test_loader_and_schema_accept_a_good_spec(base: Path, data: Any) -> None:
    load(data, base)
    assert schema_accepts(data), [e.message for e in VALIDATOR.iter_errors(data)]


@pytest.mark.parametrize("data", BAD)
def test_loader_and_schema_refuse_a_bad_spec(base: Path, data: Any) -> None:
    with pytest.raises(SpecError):
        load(data, base)
    assert not schema_accepts(data)


def test_a_space_file_validates(base: Path) -> None:
    for space in ("grid.json", {"file": "grid.json", "base": {"limit": 2}}):
        data = make(space=space, baseline=None)
        load(data, base)
        assert schema_accepts(data)


# --- docs/spec.md: every complete spec on the page loads --------------------------------------------

DOC = ROOT / "docs" / "spec.md"
_BLOCK = re.compile(r"(?:`([\w.-]+)`:\n\n)?```(json|python)\n(.*?)```", re.S)


def doc_blocks() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The page's specs (```json blocks) and files (a block right after a line "`NAME`:")."""
    specs, files = [], {}
    for name, language, text in _BLOCK.findall(DOC.read_text()):
        if name:
            files[name] = text
        elif language == "json":
            specs.append(json.loads(text))
    return specs, files


def test_the_spec_page_has_examples(tmp_path: Path) -> None:
    specs, files = doc_blocks()
    assert len(specs) >= 3 and {"grid.json", "grid.py"} <= set(files)
    for name, text in files.items():  # each space file on the page loads
        (tmp_path / name).write_text(text)
        assert load_space_file(tmp_path / name).space.run_knobs == ["threads"]


@pytest.mark.parametrize("index", range(len(doc_blocks()[0])) if DOC.exists() else [])
def test_every_spec_in_the_spec_page_loads_and_validates(tmp_path: Path, index: int) -> None:
    specs, files = doc_blocks()
    data = specs[index]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for source in data["workload"].get("sources", []):
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).touch()
    load(data, tmp_path)
    assert schema_accepts(data), [e.message for e in VALIDATOR.iter_errors(data)]
