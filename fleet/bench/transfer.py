"""``fleet bench search --history``: ``auto`` with history, leave one space out.

Each recorded space's history is the *other* recorded spaces of the same kernel (the family before ``__`` in the
file name: ``convolution_milo__A100`` is ``convolution_milo`` on an A100), never the space itself and never
another space of the same GPU and kernel. ``auto`` gets their transferred configurations
(:func:`fleet.search.history.transfer`) and runs beside ``auto`` without history and random search, on the same
seeds, scored with the methodology score (:mod:`fleet.bench.search`) over the simulated time, which includes
what the history trials cost. A space with no related space runs ``auto`` with no history: it scores as today.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.errors import SpecError
from fleet.replay import RecordedSpace, load_recorded, recorded_files
from fleet.search.history import Source, first_count, to_options, transfer

if TYPE_CHECKING:
    from fleet.store import HistorySource

WITH = "auto history"
WITHOUT = "auto"
RANDOM = "random"


def family(recorded: RecordedSpace) -> str:
    """The kernel a recorded space belongs to: its file name before ``__``."""
    return recorded.name.split("__", 1)[0]


def source_of(recorded: RecordedSpace) -> Source:
    """A recorded space as a history source: every valid configuration with its time."""
    runs = tuple(
        (recorded.config(key), record.time_ms) for key, record in recorded.records.items() if record.time_ms is not None
    )
    return Source(recorded.name, runs)


def related(recorded: RecordedSpace, others: Sequence[RecordedSpace]) -> list[RecordedSpace]:
    """The spaces of ``others`` that are history for ``recorded``: same kernel, another space, another GPU."""
    return [
        other
        for other in others
        if family(other) == family(recorded)
        and other.name != recorded.name
        and not (other.device and other.device == recorded.device)
    ]


def histories(spaces: Sequence[Path], history: Path | str) -> dict[str, dict[str, Any]]:
    """Per space name, ``auto``'s ``history`` option from the related spaces in the folder ``history``, or from a
    database (:func:`store_histories`) when ``history`` is a database URL.

    Parameters
    ----------
    spaces:
        The recorded spaces to score.
    history:
        A folder of recorded spaces (``*.json.gz``) to take history from, or a database URL.
    """
    if "://" in str(history):
        return store_histories(spaces, str(history))
    history = Path(history)
    if not history.is_dir():
        raise SpecError(f"--history {history}: not a folder of recorded spaces (*.json.gz)")
    pool = [load_recorded(path) for path in recorded_files(history)]
    if not pool:
        raise SpecError(f"--history {history}: no recorded spaces (*.json.gz) there")
    result = {}
    for path in spaces:
        recorded = load_recorded(path)
        mine = related(recorded, pool)
        if not mine:
            continue
        transferred = transfer(recorded.space, [source_of(other) for other in mine])
        if transferred:
            result[recorded.name] = {
                **to_options(transferred, first_count(transferred)),
                "related": [other.name for other in mine],
            }
    return result


def store_histories(spaces: Sequence[Path], url: str) -> dict[str, dict[str, Any]]:
    """Per space name, ``auto``'s ``history`` option from a database's Kernel Tuner imports (``fleet import kt``:
    problems of kind ``kernel``) of the same kernel on other GPUs than the space's.

    Each imported GPU is a source of its own, told apart by the device name its file gave (the import keeps it):
    two GPUs of one target (an RTX A4000 and an RTX A6000 are both sm_86) are two sources, each history for the
    other, and neither mixes its best runs with the other's. A space or an import whose file names no device is
    told apart by target only (every source on its target is left out), and a source that is the space's own
    records, imported under whatever name, never counts.

    Parameters
    ----------
    spaces:
        The recorded spaces to score.
    url:
        The database.
    """
    from fleet.interop.kerneltuner import target_of_device
    from fleet.interop.records import KIND
    from fleet.store import Store

    store = Store(url)
    try:
        found = store.history(KIND, by_device=True)
    finally:
        store.close()
    result = {}
    for path in spaces:
        recorded = load_recorded(path)
        try:
            mine = target_of_device(recorded.device)
        except SpecError:
            mine = None
        sources = [
            Source(s.name, tuple(s.runs))
            for s in found
            if s.params.get("kernel_name") == recorded.kernel
            and not _same_gpu(recorded.device, mine, s)
            and not _same(recorded, s.runs)
        ]
        transferred = transfer(recorded.space, sources)
        if transferred:
            result[recorded.name] = {
                **to_options(transferred, first_count(transferred)),
                "related": [s.name for s in sources],
            }
    return result


def _same_gpu(device: str, target: str | None, source: HistorySource) -> bool:
    """Whether ``source`` was measured on the GPU named ``device`` (of ``target``): by device name where both have
    one, else by target."""
    if device and source.device:
        return source.device == device
    return source.target == target


def _same(recorded: RecordedSpace, runs: Sequence[tuple[Mapping[str, Any], float]]) -> bool:
    """Whether ``runs`` are ``recorded``'s own records (the space imported under a target its file does not name)."""
    records = [recorded.lookup(config) for config, _ in runs]
    return all(r is not None and r.time_ms == objective for r, (_, objective) in zip(records, runs, strict=True))


def compare(rows: Sequence[Mapping[str, Any]], known: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per space, ``auto`` with history beside ``auto`` and random search; then the mean and worst over the spaces
    that have a related space, and which spaces fall below ``auto`` by more than its standard error.

    Parameters
    ----------
    rows:
        :func:`fleet.bench.search.run` rows of the three variants.
    known:
        :func:`histories`' result.
    """
    by_key = {(row["space"], row["strategy"]): row for row in rows}
    spaces = list(dict.fromkeys(row["space"] for row in rows))
    result = []
    for space in spaces:
        row: dict[str, Any] = {"space": space, "related": list(known.get(space, {}).get("related", []))}
        for label in (WITH, WITHOUT, RANDOM):
            found = by_key[space, label]
            row[label] = {"score": found["score"], "score_sem": found.get("score_sem")}
        history = known.get(space, {})
        row["history_first"] = history.get("first")
        with_, without = row[WITH], row[WITHOUT]
        row["below_auto"] = (
            with_["score"] is not None
            and without["score"] is not None
            and with_["score"] < without["score"] - (without["score_sem"] or 0.0)
        )
        result.append(row)
    having = [r for r in result if r["related"]]
    summary: dict[str, Any] = {"space": "summary", "spaces": len(result), "with_related": len(having)}
    for label in (WITH, WITHOUT, RANDOM):
        values = [r[label]["score"] for r in having if r[label]["score"] is not None]
        summary[label] = {
            "mean": statistics.fmean(values) if values else None,
            "worst": min(values) if values else None,
        }
    summary["below_auto"] = [r["space"] for r in result if r["below_auto"]]
    return [*result, summary]


def table(result: Sequence[Mapping[str, Any]]) -> list[str]:
    """The comparison as text lines."""
    rows, summary = result[:-1], result[-1]
    width = max(len("space"), *(len(r["space"]) for r in rows))

    def cell(value: Mapping[str, Any]) -> str:
        if value["score"] is None:
            return f"{'failed':>15}"
        return f"{value['score']:>7.3f} ± {value['score_sem'] or 0:.3f}"

    lines = [f"  {'space':<{width}}  {'related':>7}  {'first':>5}  {WITH:>15}  {WITHOUT:>15}  {RANDOM:>15}"]
    for r in rows:
        first = "-" if r["history_first"] is None else str(r["history_first"])
        mark = "  below auto" if r["below_auto"] else ""
        lines.append(
            f"  {r['space']:<{width}}  {len(r['related']):>7}  {first:>5}  {cell(r[WITH])}  {cell(r[WITHOUT])}  "
            f"{cell(r[RANDOM])}{mark}"
        )
    for what in ("mean", "worst"):
        values = [summary[label][what] for label in (WITH, WITHOUT, RANDOM)]
        shown = "  ".join(f"{v:>7.3f}        " if v is not None else f"{'-':>15}" for v in values)
        lines.append(f"  {what + ' (with a related space)':<{width + 16}}  {shown}")
    return lines
