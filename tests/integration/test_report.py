"""`fleet report`: the page of a real campaign (CLI, PostgreSQL, Redis, worker processes, gcc), opened in a real
headless Chromium, which must show its charts; hostile knob values stay text; a campaign with nothing measured
yet still has a page; annealing chains each get a line; the page read through a glance (no SQLAlchemy) is the
store's.

Screenshots and pages are kept under test-artifacts/ (ignored by git) for a person to look at.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from fleet import report
from fleet.glance import open_glance
from fleet.report import render
from fleet.settings import redact
from fleet.space import digest
from fleet.store import NewTrial, Store
from tests.browser import headless_chromium
from tests.conftest import ROOT, Fleet, write_spec
from tests.integration.test_campaign import kernel_spec

ARTIFACTS = ROOT / "test-artifacts"
HOSTILE = "<script>alert(1)</script>"


# -- helpers ----------------------------------------------------------------------------------------------


def browser(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on the file ``page`` with a private profile and no network."""
    return headless_chromium(page.resolve().as_uri(), profile, *args)


def screenshot(page: Path, tmp_path: Path, name: str) -> bytes:
    """A 1280x2000 screenshot of ``page``, saved as test-artifacts/NAME.png (with the page beside it)."""
    ARTIFACTS.mkdir(exist_ok=True)
    png = ARTIFACTS / f"{name}.png"
    png.unlink(missing_ok=True)
    done = browser(page, tmp_path / f"profile-{name}", f"--screenshot={png}", "--window-size=1280,2000")
    assert done.returncode == 0 and png.is_file(), f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}"
    shutil.copyfile(page, ARTIFACTS / f"{name}.html")
    return png.read_bytes()


def dom(page: Path, tmp_path: Path, name: str) -> str:
    """The page's DOM as Chromium built it."""
    done = browser(page, tmp_path / f"profile-dom-{name}", "--dump-dom")
    assert done.returncode == 0, f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def png_facts(data: bytes) -> tuple[int, int, int]:
    """Width, height and how many distinct byte values its pixels hold (a blank page has very few)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    offset, pixels = 8, b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        if kind == b"IDAT":
            pixels += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    return width, height, len(set(zlib.decompress(pixels)))


class Page(HTMLParser):
    """The parts of a report a test looks at: tables' rows as text, SVG elements, links and scripts."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.elements: list[tuple[str, dict[str, str]]] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes))
        if tag == "table":
            self._table = attributes.get("class", "")
            self.tables.setdefault(self._table, [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k) == v for k, v in attrs.items())]

    def classed(self, css_class: str) -> list[tuple[str, dict[str, str]]]:
        return [(t, a) for t, a in self.elements if css_class in a.get("class", "").split()]


def table(page: Page, css_class: str) -> list[dict[str, str]]:
    """A table's body rows as dicts keyed by its header."""
    rows = page.tables[css_class]
    head, body = rows[0], rows[1:]
    return [dict(zip(head, row, strict=False)) for row in body]


def assert_self_contained(text: str) -> None:
    """Nothing the page needs comes from elsewhere: no links, no fetched resources, no script but its own (which
    sorts and filters the table of every trial), allowed by its hash."""
    lowered = text.lower()
    assert lowered.count("<script") == 1 and f"<script>{report.page.SCRIPT}</script>" in text
    assert f"script-src '{report.page.SCRIPT_HASH}'" in text
    assert "<link" not in lowered and "@import" not in lowered and "url(" not in lowered
    assert not re.search(r"\b(src|href)\s*=", lowered)
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= {"http://www.w3.org/2000/svg"}


# -- a real campaign --------------------------------------------------------------------------------------


def test_report_of_a_real_campaign_shows_convergence_knobs_and_the_best(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker("--build-procs", "2")
    # SIZE=oops does not compile: two errored trials, one reason.
    spec = kernel_spec(fleet)
    spec["space"] = {"knobs": {"size": [2, 3, 4, "oops"], "scale": {"values": [1, 10], "build": False}}}
    fleet.cli("tune", str(write_spec(fleet.home, spec)), check=True)
    out = tmp_path / "out" / "report.html"

    done = fleet.cli("report", "kernel", "-o", str(out), check=True)

    assert str(out) in done.stdout
    text = out.read_text()
    assert_self_contained(text)
    page = Page(text)
    best = table(page, "best")
    assert [(r["size"], r["scale"], r["score"]) for r in best[:3]] == [
        ("4", "10", "40"),
        ("3", "10", "30"),
        ("2", "10", "20"),
    ]
    assert best[0]["speedup"] == "4.00\u00d7"  # over the baseline size=1 at the same scale
    assert best[0]["samples"] == "3"
    assert len(best) == 6
    assert {(r["size"], r["scale"], r["score"]) for r in table(page, "baseline")} == {
        ("1", "1", "1"),
        ("1", "10", "10"),
    }
    # One series, the strategy's, in both charts; the y axis names the objective and its direction.
    charts = page.classed("chart")
    assert [a["class"] for _, a in charts] == ["chart chart-trials", "chart chart-time"]
    assert len(page.find("path", **{"class": "series", "data-series": "grid"})) == 2
    assert "best score so far (higher is better)" in text
    assert len(page.find("line", **{"class": "mark mark-errored"})) == 2 * 2  # two errored trials, both charts
    # A section per knob, the knob that matters most first.
    assert [a["data-knob"] for _, a in page.classed("knob")] == ["scale", "size"]
    effect = {tuple(r) for r in page.tables["effect"]}
    assert ("4 ★", "2", "22", "40", "") in effect  # size=4: scores 4 and 40
    # Trials by state, errors by reason, provenance.
    whole = " ".join(" ".join(page.text).split())
    assert "8 evaluated" in whole and "2 errored" in whole
    errors = table(page, "errors")
    assert len(errors) == 1 and errors[0]["trials"] == "2"
    assert "the build exited with status 1" in errors[0]["reason"]
    assert "oops" in errors[0]["example"]
    assert "gcc" in dict(r for r in page.tables["kv"] if len(r) == 2)["toolchain"]

    png = screenshot(out, tmp_path, "report-kernel")
    width, height, variety = png_facts(png)
    assert (width, height) == (1280, 2000)
    assert len(png) > 30_000 and variety > 50, "the screenshot looks blank"
    rendered = dom(out, tmp_path, "kernel")
    assert rendered.count("<svg") == 2
    assert rendered.count('class="series"') == 2
    assert 'class="knob card"' in rendered


def test_a_hostile_knob_value_stays_text(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    spec = kernel_spec(
        fleet,
        name="hostile",
        problems=[{"kind": "kernel", "params": {"sleep": 0, "scale": 3}}],
        space={"knobs": {"size": [2, "<b>bold</b>"], "label": {"values": [HOSTILE, "plain"], "build": False}}},
        baseline=None,
    )
    spec["workload"]["run"] = ["./kernel", "{scale}", "{sleep}", "{label}"]
    fleet.cli("tune", str(write_spec(fleet.home, spec)), check=True)
    out = tmp_path / "hostile.html"

    fleet.cli("report", "hostile", "-o", str(out), check=True)

    text = out.read_text()
    assert HOSTILE not in text and "<b>bold</b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert_self_contained(text)
    page = Page(text)
    assert {r["label"] for r in table(page, "best")} == {HOSTILE, "plain"}
    assert [a["data-knob"] for _, a in page.classed("knob")] == ["label", "size"]
    assert "<b>bold</b>" in " ".join(r["example"] for r in table(page, "errors"))
    screenshot(out, tmp_path, "report-hostile")
    rendered = dom(out, tmp_path, "hostile")
    assert rendered.count("<script") == 1 and "<b>bold</b>" not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered


def test_a_campaign_with_nothing_measured_yet_still_has_a_page(fleet: Fleet, tmp_path: Path) -> None:
    spec = write_spec(fleet.home, kernel_spec(fleet, name="waiting"))
    fleet.cli("tune", str(spec), "--detach", check=True)  # no worker: every trial, baselines too, waits
    out = tmp_path / "waiting.html"

    fleet.cli("report", "waiting", "-o", str(out), check=True)

    text = out.read_text()
    assert "This campaign has no measurements yet (8 trials, none measured)." in text
    assert "No valid measurement yet: nothing to plot." in text
    assert "<svg" not in text
    assert "8 new" in " ".join(" ".join(Page(text).text).split())


def test_a_campaign_of_reused_measurements_has_a_page(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    fleet.cli("tune", str(write_spec(fleet.home, kernel_spec(fleet))), check=True)
    again = write_spec(fleet.home, kernel_spec(fleet, name="again"), name="again.json")
    fleet.cli("tune", str(again), check=True)  # measures nothing: every trial points at one of `kernel`
    out = tmp_path / "again.html"

    fleet.cli("report", "again", "-o", str(out), check=True)

    page = Page(out.read_text())
    best = table(page, "best")
    assert (best[0]["size"], best[0]["scale"], best[0]["score"]) == ("4", "10", "40")
    assert "(measured in " in best[0]["trial id"]
    assert "8 trials reused a measurement made before." in " ".join(" ".join(page.text).split())
    assert len(page.find("path", **{"class": "series", "data-series": "grid"})) == 2


def test_an_unknown_campaign_is_one_line_and_exit_1(fleet: Fleet, tmp_path: Path) -> None:
    done = fleet.cli("report", "x", "-o", str(tmp_path / "r.html"))

    assert done.returncode == 1
    # The error names the database it searched: from another directory, another database.
    assert done.stderr == f"fleet: error: no campaign 'x' in {redact(fleet.env['FLEET_DATABASE_URL'])}\n"
    assert not (tmp_path / "r.html").exists()


# -- chains, straight from the store ----------------------------------------------------------------------


def _measure(store: Store, trial_id: int, seconds: float, chain: int | None, state: str = "evaluated") -> None:
    assert store.claim(trial_id, "compile", "builder", 60, 3) is not None
    assert store.mark_compiled(trial_id, "builder")
    assert store.claim(trial_id, "evaluate", "evaluator", 60, 3) is not None
    metrics: dict[str, Any] = {"seconds": seconds} if chain is None else {"seconds": seconds, "chain": chain}
    measurement = {
        "objective_name": "seconds",
        "maximize": False,
        "objective": seconds,
        "valid": state == "evaluated",
        "samples": [seconds] * 5,
        "metrics": metrics,
        "toolchain": "gcc 13",
        "node": "node-a",
        "gpu": "0",
        "worker": "eval-gpu0@node-a",
    }
    assert store.record(trial_id, "evaluator", state=state, measurement=measurement)


def through_glance(store: Store, name: str) -> str:
    """The page of campaign ``name`` as `fleet report` reads it, through a glance (no SQLAlchemy), its time aside;
    :func:`same_page` compares it with the store's."""
    glance = open_glance(store.url)
    assert glance is not None
    try:
        return render(glance, name)
    finally:
        glance.close()


def same_page(a: str, b: str) -> bool:
    """Whether two pages are the same but for the time in their footers."""
    generated = re.compile(r"at [0-9-]+ [0-9:]+ UTC\.")
    return generated.sub("", a) == generated.sub("", b)


def test_each_annealing_chain_is_a_line_and_times_go_down(store: Store, tmp_path: Path) -> None:
    problem = store.add_problem("conv", {"n": 1})
    campaign = store.create_campaign(
        name="chains",
        target="sm_90",
        problem_ids=[problem],
        space={"knobs": {"block": {"values": [32, 64, 128, 256], "build": True}, "unroll": [1, 2, 4]}},
        strategy={"name": "anneal", "options": {"chains": 2}},
        workload={"kind": "command", "run": ["./k"], "objective": {"json": "seconds", "goal": "min"}},
        options={},
        provenance={"toolchain": "nvcc 12.4"},
    )
    configs = [{"block": b, "unroll": u} for b in (32, 64, 128, 256) for u in (1, 2, 4)]
    trials = [NewTrial(problem, c, digest(["b", c]), digest(["m", c]), seq=i) for i, c in enumerate(configs, start=1)]
    ids = [trial_id for trial_id, _ in store.add_trials(campaign.id, "sm_90", trials)]
    for index, (trial_id, config) in enumerate(zip(ids, configs, strict=True)):
        seconds = 1.0 / config["block"] + 0.001 * config["unroll"]
        _measure(store, trial_id, seconds, chain=index % 2, state="invalid" if index == 5 else "evaluated")

    text = render(store, store.campaign("chains"))
    assert same_page(through_glance(store, "chains"), text)

    page = Page(text)
    for series in ("chain 0", "chain 1", "best of all chains"):
        assert len(page.find("path", **{"class": "series", "data-series": series})) == 2
    assert "best seconds so far (lower is better)" in text
    assert table(page, "best")[0]["block"] == "256" and table(page, "best")[0]["unroll"] == "1"
    assert table(page, "best")[0]["series"] == "chain 1"
    assert len(page.find("line", **{"class": "mark mark-invalid"})) == 2
    assert [a["data-knob"] for _, a in page.classed("knob")] == ["block", "unroll"]
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"report-chains-{store.dialect}.html").write_text(text)


def test_a_large_campaign_draws_some_dots_and_a_long_knob_its_extremes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The limits made small, so that 80 trials stand for 100,000.
    for module in (report.page, report.charts):
        monkeypatch.setattr(module, "DOTS", 20)
    monkeypatch.setattr(report.page, "KNOB_VALUES", 8)
    problem = store.add_problem("conv", {"n": 2})
    campaign = store.create_campaign(
        name="large",
        target="sm_90",
        problem_ids=[problem],
        space={"knobs": {"b": [1, 2], "i": {"values": list(range(40)), "build": False}}},
        strategy={"name": "random"},
        workload={"kind": "command", "run": ["./k"], "objective": {"json": "seconds", "goal": "min"}},
        options={},
        provenance={},
    )
    configs = [{"b": b, "i": i} for i in range(40) for b in (1, 2)]
    trials = [NewTrial(problem, c, digest(["b", c]), digest(["m", c]), seq=n) for n, c in enumerate(configs, start=1)]
    ids = [trial_id for trial_id, _ in store.add_trials(campaign.id, "sm_90", trials)]
    for n, (trial_id, config) in enumerate(zip(ids, configs, strict=True)):
        seconds = config["b"] * (1 + (config["i"] + 13) * 17 % 40) / 1000  # the least for i=27
        _measure(store, trial_id, seconds, chain=None, state="invalid" if n in (10, 11) else "evaluated")

    text = render(store, store.campaign("large"))
    assert same_page(through_glance(store, "large"), text)

    page = Page(text)
    note = re.search(r"([0-9]+) of 78 trials drawn as dots", text)
    assert note is not None and int(note[1]) < 78
    dots = [a for t, a in page.elements if t == "circle" and a.get("r") == "2.6"]
    assert len(dots) == 2 * int(note[1])
    # Lines, axes, marks and the best's ring are those of every dot drawn: only the dots differ.
    for module in (report.page, report.charts):
        monkeypatch.setattr(module, "DOTS", 10**6)
    everything = render(store, store.campaign("large"))
    assert "drawn as dots" not in everything

    def charts(page: str) -> str:
        found = re.search(r'<div class="charts".*?</div>', page, re.S)
        assert found is not None
        return re.sub(r'<circle cx="[^"]*" cy="[^"]*" r="2.6"/>\n', "", found[0])

    assert charts(text) == charts(everything)
    assert len(re.findall(r'r="2.6"', everything)) == 2 * 78
    # The knob of 40 values: its 10 best medians, a line for the 20 between, its 10 worst.
    card = re.search(r'<div class="knob card"[^>]*data-knob="i">.*?</table></div>', text, re.S)
    assert card is not None
    assert "40 values: the 10 with the best medians and the 10 with the worst; 20 not shown." in card[0]
    rows = Page(card[0]).tables["effect"][1:]
    assert len(rows) == 21 and rows[10] == ["\u2026 20 values between these"]
    medians = [float(r[2]) for r in rows[:10] + rows[11:]]
    assert medians == sorted(medians)
    assert rows[0][0] == "27 \u2605"  # the best configuration's value, best median first
    assert "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, \u2026, 39 (40 values)" in text
