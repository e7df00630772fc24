"""MIOpen problems: import driver lines, tag them, find them by key, select them, show what is known.

Writes are bulk (COPY on PostgreSQL, executemany on SQLite: see :mod:`fleet.tuna.bulk`; never one ORM object
per row), so a file of a hundred thousand problems imports in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select

from fleet.canonical import digest
from fleet.errors import FleetError, SpecError
from fleet.store import Campaign, Measurement, Problem, Store, Trial, utcnow
from fleet.store._models import MiopenKey, ProblemTag
from fleet.tuna import KINDS, POOL, RAW, RECURRENT

NO_POOL_DB = "MIOpen keeps no tuning database for pooling: this problem has no db key and is never tuned"
RAW_NOTE = "a database record that maps to no driver problem: kept as it is, never tuned"

CHUNK = 5000  # rows per IN (...) list: well inside SQLite's limit of bound variables


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def db_key_of(kind: str, params: dict[str, Any]) -> str | None:
    """MIOpen's database key of a problem, or None when MIOpen has none for it (bnorm, pool)."""
    from fleet.miopen.keys import db_key

    if kind == RAW:
        return params.get("key")
    if kind != "conv":
        return None
    try:
        return db_key(params)
    except (FleetError, KeyError, ValueError, TypeError):
        return None


def ensure_problems(
    connection: Connection,
    store: Store,
    problems: Sequence[tuple[str, dict[str, Any]]],
    *,
    create: bool = True,
    tags: Sequence[str] = (),
    params_keys: Sequence[str] | None = None,
    db_keys: Sequence[str | None] | None = None,
) -> tuple[list[int | None], int]:
    """The ids of ``problems`` (kind, params), created when missing if ``create``; and how many were created.

    Each new problem gets its MIOpen key; ``tags`` go on every problem found or created. Runs inside the
    caller's transaction (``connection``), so an error leaves nothing half written. ``params_keys``, when
    given, are the problems' ``digest(params)``, which the caller computed already; ``db_keys`` their MIOpen
    keys where the caller knows them (None where not: derived here).
    """
    from fleet.tuna import bulk

    if params_keys is None:
        params_keys = [digest(params) for _, params in problems]
    keyed = [(kind, params, key) for (kind, params), key in zip(problems, params_keys, strict=True)]
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, params, key in keyed:
        unique.setdefault((kind, key), params)
    known: dict[tuple[str, str], str] = {}
    for (kind, _, key), db_key in zip(keyed, db_keys or (), strict=False):
        if db_key is not None:
            known.setdefault((kind, key), db_key)
    columns = ("kind", "params_key", "params", "created_at")
    if create:
        now = utcnow()
        rows = [(kind, key, params, now) for (kind, key), params in unique.items()]
        ids, new = bulk.insert_new(connection, Problem, columns, rows, ("kind", "params_key"))
        keys = []
        for kind, key in new:
            db_key = known.get((kind, key)) or db_key_of(kind, unique[(kind, key)])
            if db_key is not None:
                keys.append((ids[(kind, key)], db_key))
        # The problems are this transaction's own: no other writer can have keyed them.
        bulk.insert(connection, MiopenKey, ("problem_id", "db_key"), keys)
        created = len(new)
    else:
        ids = {}
        for kind in {k for k, _ in unique}:
            for part in chunks(sorted(key for k, key in unique if k == kind)):
                found_ids = connection.execute(
                    select(Problem.params_key, Problem.id).where(Problem.kind == kind, Problem.params_key.in_(part))
                ).all()
                ids.update({(kind, r.params_key): r.id for r in found_ids})
        created = 0
    found = [ids.get((kind, key)) for kind, _, key in keyed]
    tag_rows = [(pid, tag) for pid in sorted({p for p in found if p is not None}) for tag in tags]
    bulk.insert(connection, ProblemTag, ("problem_id", "tag"), tag_rows, ignore=True)
    return found, created


@dataclass
class ImportReport:
    """What ``fleet import`` did, counted in distinct problems (one per direction)."""

    created: int = 0
    known: int = 0
    tagged: int = 0
    missing: int = 0
    lines: int = 0
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    problem_ids: list[int] = field(default_factory=list)


def import_lines(
    store: Store,
    lines: Iterable[str],
    *,
    tags: Sequence[str] = (),
    tag_only: bool = False,
    batches: Sequence[int] = (),
    command: str | None = None,
    recurrent: bool = False,
) -> ImportReport:
    """Import MIOpenDriver command lines as problems, one per direction; see ``fleet import --help``.

    Parameters
    ----------
    lines:
        The file's lines; logging preambles and flags that do not change the problem are tolerated.
    tags:
        Tags to put on every problem of the file.
    tag_only:
        Tag the problems that exist already; create nothing.
    batches:
        Batch sizes that replace each line's ``-n`` (one problem per size).
    command:
        ``conv``, ``convfp16`` or ``convbfp16``, replacing each conv line's command (its precision).
    recurrent:
        Tag every problem ``recurrent`` too.
    """
    from fleet.miopen.driver import DriverLineError, parse_lines, problems, with_batch, with_command

    report = ImportReport()
    wanted: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for lineno, item in parse_lines(lines):
        if isinstance(item, DriverLineError):
            report.unreadable.append((lineno, str(item)))
            continue
        report.lines += 1
        try:
            variants = [with_command(item, command) if command else item]
            if batches:
                variants = [with_batch(v, n) for v in variants for n in batches]
            for variant in variants:
                for params in problems(variant):
                    wanted.setdefault((variant.kind, digest(params)), (variant.kind, params))
        except (SpecError, ValueError) as error:
            report.unreadable.append((lineno, str(error)))
    all_tags = list(tags) + ([RECURRENT] if recurrent else [])
    items = list(wanted.values())
    with store.transaction() as connection:
        ids, created = ensure_problems(connection, store, items, create=not tag_only, tags=all_tags)
    present = [i for i in ids if i is not None]
    report.created = created
    report.known = len(present) - created
    report.missing = len(ids) - len(present)
    report.tagged = len(present) if all_tags else 0
    report.problem_ids = present
    return report


def problems_by_key(store: Store, key: str) -> list[Problem]:
    """The problems whose MIOpen key is ``key`` (an index lookup), raw records included.

    A key spelt another way than Fleet keeps it (MIOpen 3.x's 3-D keys) finds its problem through the
    problem's own key.
    """
    from fleet.miopen.keys import db_key, parse_key

    with store.session() as session:

        def lookup(text: str) -> list[Problem]:
            query = select(Problem).join(MiopenKey, MiopenKey.problem_id == Problem.id).where(MiopenKey.db_key == text)
            return list(session.scalars(query.order_by(Problem.id)))

        found = lookup(key)
        try:
            canonical = db_key(parse_key(key))
        except FleetError:
            return found
        if canonical != key:
            found += [p for p in lookup(canonical) if p.id not in {f.id for f in found}]
        return found


def select_problems(
    store: Store,
    *,
    tags: Sequence[str] = (),
    selection: str | None = None,
    kinds: Sequence[str] = KINDS,
) -> list[tuple[int, str, dict[str, Any]]]:
    """(id, kind, params) of the MIOpen problems carrying every tag in ``tags`` and matching ``selection``.

    ``selection`` is the selection language of :mod:`fleet.miopen.select` (``direction == "F" and
    in_channels % 8 == 0``); the tags are matched in SQL, the selection on each problem's parameters.
    """
    predicate: Callable[[dict[str, Any]], bool] | None = None
    if selection:
        from fleet.miopen.select import compile_selection

        predicate = compile_selection(selection)
    query = select(Problem.id, Problem.kind, Problem.params).where(Problem.kind.in_(list(kinds))).order_by(Problem.id)
    for tag in tags:
        query = query.where(
            Problem.id.in_(select(ProblemTag.problem_id).where(ProblemTag.tag == tag).scalar_subquery())
        )
    with store.transaction() as connection:
        rows = connection.execute(query).all()
    return [(r.id, r.kind, r.params) for r in rows if predicate is None or predicate({"kind": r.kind, **r.params})]


def parse_query(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """What ``fleet query`` was given: ("driver", problems) for a driver line, ("db", [problem]) for a db line.

    A find-db or perf-db text line (``KEY=...``), or a bare key, gives the one problem of its key; a key that
    is no driver problem gives the raw record ``(miopen-record, {"key": KEY})``, found by its key.
    """
    from fleet.miopen.driver import DriverLineError, parse_line, problems
    from fleet.miopen.keys import parse_key

    text = text.strip()
    try:
        line = parse_line(text)
    except DriverLineError as driver_error:
        key = text.split("=", 1)[0].strip()
        try:
            params = parse_key(key)
        except FleetError:
            if key.count("-") < 14 or " " in key:
                raise SpecError(f"not a MIOpenDriver line, nor a find-db or perf-db line: {driver_error}") from None
            return "db", [(RAW, {"key": key})]
        return "db", [("conv", params)]
    return "driver", [(line.kind, params) for params in problems(line)]


def describe(store: Store, text: str) -> dict[str, Any]:
    """Everything ``fleet query`` shows for a driver line or a db line: problems, tags, trials, keys."""
    source, items = parse_query(text)
    out: list[dict[str, Any]] = []
    keys: list[str] = []
    with store.transaction() as connection:
        for kind, params in _resolved(connection, items):
            key = db_key_of(kind, params)
            if key is not None and key not in keys:
                keys.append(key)
            problem_id = params.pop("_id", None) if kind == RAW else None
            if kind != RAW:
                problem_id = connection.scalar(
                    select(Problem.id).where(Problem.kind == kind, Problem.params_key == digest(params))
                )
            entry: dict[str, Any] = {
                "id": problem_id,
                "kind": kind,
                "direction": params.get("direction"),
                "key": key,
                "params": params,
                "tags": [],
                "trials": [],
            }
            if kind == POOL:
                entry["note"] = NO_POOL_DB
            elif kind == RAW:
                entry["note"] = RAW_NOTE
            if problem_id is not None:
                entry["tags"] = sorted(
                    connection.scalars(select(ProblemTag.tag).where(ProblemTag.problem_id == problem_id))
                )
                entry["trials"] = _trials(connection, problem_id)
            out.append(entry)
    return {"query": text.strip(), "source": source, "problems": out, "keys": keys}


def _resolved(connection: Connection, items: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The items, a raw record's key replaced by the records kept under it (or left as is when none is)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for kind, params in items:
        if kind != RAW:
            out.append((kind, params))
            continue
        rows = connection.execute(
            select(Problem.id, Problem.params)
            .join(MiopenKey, MiopenKey.problem_id == Problem.id)
            .where(MiopenKey.db_key == params["key"], Problem.kind == RAW)
            .order_by(Problem.id)
        ).all()
        out += [(RAW, {**r.params, "_id": r.id}) for r in rows] or [(RAW, dict(params))]
    return out


def _trials(connection: Connection, problem_id: int) -> list[dict[str, Any]]:
    measured = Trial.measured_in.label("measured_in")
    rows = connection.execute(
        select(
            Trial.id,
            Trial.target,
            Trial.state,
            Trial.reason,
            Trial.config,
            Trial.created_at,
            Trial.started_at,
            Trial.finished_at,
            measured,
            Campaign.name,
            Campaign.options,
        )
        .join(Campaign, Campaign.id == Trial.campaign_id)
        .where(Trial.problem_id == problem_id)
        .order_by(Trial.target, Trial.id)
    ).all()
    by_trial = {}
    ids = [r.measured_in for r in rows]
    for part in chunks(ids):
        for fetched in connection.execute(
            select(Measurement.trial_id, Measurement.objective, Measurement.valid, Measurement.metrics).where(
                Measurement.trial_id.in_(part)
            )
        ).all():
            by_trial[fetched.trial_id] = fetched
    trials = []
    for r in rows:
        m = by_trial.get(r.measured_in)
        best = None
        if m is not None and m.valid:
            best = {"time_ms": m.objective, **_best_entry(m.metrics or {})}
        trials.append(
            {
                "trial": r.id,
                "target": r.target,
                "campaign": r.name,
                "reason": (r.options or {}).get("tuna", {}).get("reason", r.name),
                "step": r.config.get("step"),
                "state": r.state,
                "why": r.reason,
                "created_at": _iso(r.created_at),
                "started_at": _iso(r.started_at),
                "finished_at": _iso(r.finished_at),
                "best": best,
            }
        )
    return trials


def _best_entry(metrics: dict[str, Any]) -> dict[str, Any]:
    find = metrics.get("find") or []
    if find:
        algorithm, solver, time_ms, workspace = find[0][:4]
        return {"algorithm": algorithm, "solver": solver, "time_ms": time_ms, "workspace": workspace}
    perf = metrics.get("perf") or []
    if perf:
        return {"solvers": {solver: values for solver, values in perf}}
    return {}


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")
