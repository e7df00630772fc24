"""MIOpen's databases in and out of Fleet: import a find-db or perf-db as results, export find-db, perf-db, kernel-db.

Results live as ordinary trials and measurements: a ``find`` result keeps MIOpen's find entries (fastest
first) in its metrics under ``find``, a ``perf`` result the tuned parameters of each solver under ``perf``.
An imported file becomes a campaign ``import-<file>-<sha256 prefix>@<target>`` whose provenance names the
file and its hash; its trials are ``evaluated`` at once.

Exports read the valid results of one campaign, of the campaigns on the target the asker names (``--from``,
fleet.trust's rule: the fastest find result and the latest perf result of each problem among them), or of a
golden version; invalid trials are never read. Named none, an export reads the one campaign on the target that
has results, and refuses in one line when several have: one campaign's numbers go into another's export only
when its asker said so. The sidecar and the command's line say which campaigns an export drew on. The
same data always gives the same bytes: records are sorted by key, and nothing time-dependent is written.
Where each result came from goes into a sidecar ``FILE.provenance.json``: find-db text has no comment
syntax (every line is ``KEY=VALUE``), and MIOpen opens the SQLite files it reads by their own tables, so a
sidecar is the one place that cannot disturb MIOpen.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from fleet.canonical import digest
from fleet.errors import FleetError, NotFound, SpecError
from fleet.files import plain_copy
from fleet.provenance import provenance
from fleet.states import ArtifactState, CampaignStatus, TrialState
from fleet.store import Artifact, Campaign, Measurement, Store, Trial, utcnow
from fleet.store._models import GoldenEntry, GoldenVersion
from fleet.targets import check_target
from fleet.trust import Trusted, choose, resolve
from fleet.tuna import KINDS, RAW
from fleet.tuna.problems import chunks, db_key_of, ensure_problems, select_problems

SQLITE_MAGIC = b"SQLite format 3\x00"


# -- import ---------------------------------------------------------------------------------------------------


@dataclass
class Imported:
    """What ``import_db`` did: the campaign, the file's format, and what it held."""

    campaign: str
    format: str
    records: int
    problems: int
    created: int
    sha256: str
    unmapped: list[str] = field(default_factory=list)
    line_format: str | None = None


@dataclass
class Record:
    """One record of a database file as the import writes it: a problem (or a raw record) and its result."""

    kind: str
    params: dict[str, Any]
    metrics: dict[str, Any]
    objective: float | None
    why: str | None = None  # why it maps to no driver problem
    params_key: str = ""  # digest(params), computed once for the whole import
    db_key: str | None = None  # the problem's MIOpen key where the record spells it so; else derived


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def detect_format(path: Path) -> str:
    """``perf-db`` for a SQLite file, ``find-db`` for text."""
    with path.open("rb") as handle:
        return "perf-db" if handle.read(16) == SQLITE_MAGIC else "find-db"


def entry_row(entry: Any) -> list[Any]:
    """A find entry as stored in a result's metrics: [algorithm, solver, time_ms, workspace, group, kernel algo]
    and, when the file spelt the time its own way, that spelling."""
    row = [entry.algorithm, entry.solver, entry.time_ms, entry.workspace, entry.kernel_group, entry.kernel_algorithm]
    return [*row, entry.time_text] if getattr(entry, "time_text", "") else row


# The user's names of the find-db line formats, by fleet.miopen.finddb's style names.
LINE_FORMATS = {"legacy": "older", "current": "newer"}


def _read(path: Path, kind: str) -> list[Record]:
    """Every record of a database file, each as it came: a problem where it maps to one, else a raw record."""
    from fleet.miopen.keys import is_legacy_spelling, parse_key

    out: list[Record] = []
    seen: dict[str, str] = {}

    def add(
        params: dict[str, Any] | None,
        raw: dict[str, Any],
        name: str,
        metrics: dict,
        objective: Any,
        why: str,
        db_key: str | None = None,
    ) -> None:
        if params is not None:
            key = digest(params)
            first = seen.setdefault(key, name)
            if first == name:
                out.append(Record("conv", params, metrics, objective, params_key=key, db_key=db_key))
                return
            # One problem, two records (two spellings of one key): both are kept, the second as it is.
            why = f"the same problem as {first}"
        out.append(Record(RAW, raw, metrics, objective, f"{name}: {why}", digest(raw)))

    if kind == "find-db":
        from fleet.miopen.finddb import read_find_db

        for record in read_find_db(path):
            entries = [entry_row(e) for e in record.entries]  # as the file orders them
            metrics: dict[str, Any] = {"find": entries, "key": record.key, "format": LINE_FORMATS.get(record.style)}
            objective = min(e[2] for e in entries)
            try:
                params, why = parse_key(record.key), ""
            except FleetError as error:
                params, why = None, str(error)
            # A key spelt as Fleet writes it is its problem's key: no need to derive it again.
            known = record.key if params is not None and is_legacy_spelling(record.key) else None
            add(params, {"db": "find-db", "key": record.key}, record.key, metrics, objective, why, known)
        return out
    from fleet.miopen.perfdb import config_key, params_from_config, read_perf_rows

    rows = read_perf_rows(path)  # MIOpenDbError names the file and what is wrong with it
    by_config: dict[int, list[tuple[int, str, str]]] = {}
    for number, solver, config, values in rows.perf:
        by_config.setdefault(config, []).append((number, solver, values))
    for number, row in rows.configs:
        perf = by_config.get(number, [])
        metrics = {
            "perf": [[solver, values] for _, solver, values in perf],
            "perf_ids": [n for n, _, _ in perf],
            "config": {"id": number, **row},
        }
        key = config_key(row)
        try:
            params, why = params_from_config(row), ""
        except FleetError as error:
            params, why = None, str(error).rsplit(": ", 1)[-1]
        add(params, {"db": "perf-db", "key": key, "config": row}, f"config {number}", metrics, None, why)
    return out


def import_db(store: Store, path: Path, target: str, *, tags: Sequence[str] = (), strict: bool = False) -> Imported:
    """Load a find-db text or perf-db SQLite file (``.bz2`` too) as results on ``target``, every record of it.

    A record that maps to a driver problem becomes that problem's result; one that does not (a data type
    MIOpenDriver cannot run, a row no input size gives, a second spelling of one problem) is kept as it is, as
    a ``miopen-record`` problem: queryable by its key, exported unchanged, never tuned. One transaction: a file
    that fails half way leaves nothing behind. Importing the same file again finds its campaign and adds
    nothing.

    Parameters
    ----------
    path:
        The file.
    target:
        The target it was tuned for.
    tags:
        Tags for every problem of the file.
    strict:
        Import nothing, and raise, when any record maps to no driver problem.
    """
    check_target(target)
    with plain_copy(path) as plain:  # refuses a file over FLEET_IMPORT_BYTES before it is hashed or read
        sha = _sha256(path)
        kind = detect_format(plain)
        rows = _read(plain, kind)
    if not rows:
        raise SpecError(f"{path}: no {kind} record in it")
    unmapped = [r.why or "" for r in rows if r.kind == RAW]
    if strict and unmapped:
        raise SpecError(
            f"{path}: {len(unmapped)} of {len(rows)} records map to no driver problem "
            f"(first: {unmapped[0]}); --strict imports nothing"
        )
    step = "find" if kind == "find-db" else "perf"
    formats = sorted({r.metrics.get("format") or "" for r in rows} - {""})
    # A find-db line is one record; a perf-db record is one row of either table.
    records = len(rows) if step == "find" else len(rows) + sum(len(r.metrics["perf"]) for r in rows)
    stem = path.name.removesuffix(".bz2")
    name = f"import-{stem}-{sha[:12]}@{target}"
    toolchain = f"imported {stem} sha256:{sha}"
    source = {"source": str(path.resolve()), "file": path.name, "sha256": sha, "format": kind}
    now = utcnow()
    with store.transaction() as connection:
        ids, created = ensure_problems(
            connection,
            store,
            [(r.kind, r.params) for r in rows],
            tags=tags,
            params_keys=[r.params_key for r in rows],
            db_keys=[r.db_key for r in rows],
        )
        campaign_id = connection.scalar(
            store.insert(Campaign)
            .values(
                name=name,
                target=target,
                space={"knobs": {"step": {"values": [step], "build": True}}, "constraints": [], "base": {}},
                strategy={"name": "grid"},
                workload={"kind": "miopen", "imported": True},
                workload_key=digest(["import", sha]),
                baseline=None,
                options={"tuna": {"reason": f"import-{stem}", "import": source}},
                provenance={**provenance(toolchain), **source},
                status=CampaignStatus.DONE,
                created_at=now,
                finished_at=now,
            )
            .on_conflict_do_nothing()
            .returning(Campaign.id)
        )
        if campaign_id is None:
            return Imported(name, kind, records, len(set(ids)), 0, sha, unmapped, "/".join(formats) or None)
        _write_results(connection, campaign_id, target, sha, step, toolchain, ids, rows, now)
    return Imported(name, kind, records, len(set(ids)), created, sha, unmapped, "/".join(formats) or None)


def _import_key(sha: str, problem_id: int, step: str) -> str:
    """``digest(["import", sha, problem_id, step])``: an imported trial's build and measure key.

    Written out because it is computed once a record: the canonical JSON of that list is this text (a hex
    digest, an integer and a step name need no escaping), so the keys are those of earlier imports.
    """
    return hashlib.sha256(f'["import","{sha}",{problem_id},"{step}"]'.encode()).hexdigest()


def _write_results(
    connection: Any,
    campaign_id: int,
    target: str,
    sha: str,
    step: str,
    toolchain: str,
    ids: Sequence[int | None],
    rows: Sequence[Record],
    now: Any,
) -> None:
    """The campaign's problems, one evaluated trial each, and its measurement: the record's result.

    The campaign was created in this transaction, so none of these rows can exist: they are written
    without conflict handling (COPY on PostgreSQL).
    """
    from fleet.store._models import CampaignProblem
    from fleet.tuna import bulk

    unique: dict[int, Record] = {}
    for problem_id, row in zip(ids, rows, strict=True):
        assert problem_id is not None
        unique[problem_id] = row
    order = sorted(unique)
    bulk.insert(
        connection,
        CampaignProblem,
        ("problem_id", "position"),
        ((p, i) for i, p in enumerate(order)),
        same={"campaign_id": campaign_id},
    )
    config = {"step": step}
    keys = {p: _import_key(sha, p, step) for p in order}
    trials = bulk.Rows(
        ("problem_id", "build_key", "measure_key", "seq"),
        ((p, keys[p], keys[p], i) for i, p in enumerate(order)),
        {"config": config, "config_key": digest(config), "state": TrialState.EVALUATED},
    )
    # Each measurement row begins with its trial's problem (insert_finished's key for it), then its own columns.
    measurements = bulk.Rows(
        ("problem_id", "measure_key", "objective", "metrics"),
        (
            (p, p, keys[p], unique[p].objective, {k: v for k, v in unique[p].metrics.items() if v is not None})
            for p in order
        ),
        {"objective_name": "time_ms", "maximize": False, "valid": True, "samples": []},
    )
    bulk.insert_finished(connection, campaign_id, target, toolchain, now, trials, Trial.problem_id, measurements)


# -- what an export reads -------------------------------------------------------------------------------------


@dataclass
class Result:
    """One problem's result of one step, as an export reads it."""

    problem_id: int
    step: str
    payload: dict[str, Any]
    objective: float | None
    toolchain: str
    trial_id: int | None
    build_key: str | None = None
    campaign: str | None = None


# What an import keeps beside a result so that the export writes the record as it came: the key as spelt,
# the find-db line format, the perf-db config row (with its id) and its perf rows' ids.
KEPT = ("key", "format", "config", "perf_ids")


def _better(step: str, new: Result, old: Result | None) -> bool:
    """The fastest find result; the latest perf result (by trial id, so the choice never depends on order)."""
    if old is None:
        return True
    if step == "find" and new.objective is not None and old.objective is not None and new.objective != old.objective:
        return new.objective < old.objective
    return (new.trial_id or 0) > (old.trial_id or 0)


def _well_formed(step: str, payload: Any) -> bool:
    """Whether a result's ``step`` payload is what MIOpen's records hold: find entries (each six or seven fields, a
    number for its time) or perf rows (solver, values). Any campaign's workload may print a metric of that name, and
    an export must neither ship nor trip over it."""
    if not isinstance(payload, list):
        return False
    if step == "find":
        return bool(payload) and all(
            isinstance(e, list) and len(e) in (6, 7) and isinstance(e[2], int | float) and not isinstance(e[2], bool)
            for e in payload
        )
    if step == "perf":
        return all(isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in payload)
    return True


def campaign_results(
    store: Store, campaigns: Sequence[Campaign], step: str | None = None
) -> dict[tuple[int, str], Result]:
    """The best valid result per (problem, step) of ``campaigns``; trials not ``evaluated`` are never read."""
    best: dict[tuple[int, str], Result] = {}
    measured = Trial.measured_in.label("measured_in")
    for campaign in campaigns:
        with store.transaction() as connection:
            rows = connection.execute(
                select(
                    Trial.id,
                    Trial.problem_id,
                    Trial.config,
                    Trial.build_key,
                    measured,
                )
                .where(Trial.campaign_id == campaign.id, Trial.state == TrialState.EVALUATED)
                .order_by(Trial.id)
            ).all()
            wanted = [r.measured_in for r in rows]
            found: dict[int, Any] = {}
            for part in chunks(wanted):
                for fetched in connection.execute(
                    select(
                        Measurement.trial_id,
                        Measurement.objective,
                        Measurement.metrics,
                        Measurement.toolchain,
                        Measurement.valid,
                    ).where(Measurement.trial_id.in_(part))
                ).all():
                    found[fetched.trial_id] = fetched
        for row in rows:
            row_step = str(row.config.get("step", "find"))
            m = found.get(row.measured_in)
            if m is None or not m.valid or (step is not None and row_step != step):
                continue
            metrics = m.metrics or {}
            if not _well_formed(row_step, metrics.get(row_step)):
                continue
            result = Result(
                row.problem_id,
                row_step,
                {name: metrics[name] for name in (row_step, *KEPT) if name in metrics},
                m.objective,
                # A job's campaign is created where MIOpen may be absent; the worker records the version it ran.
                m.toolchain or (f"MIOpen {metrics['miopen_version']}" if metrics.get("miopen_version") else ""),
                row.id,
                row.build_key,
                campaign.name,
            )
            if _better(row_step, result, best.get((row.problem_id, row_step))):
                best[(row.problem_id, row_step)] = result
    return best


def golden_version(store: Store, target: str, version: int | None) -> GoldenVersion:
    with store.session() as session:
        query = select(GoldenVersion).where(GoldenVersion.target == target)
        if version is not None:
            query = query.where(GoldenVersion.version == version)
        found = session.scalars(query.order_by(GoldenVersion.version.desc())).first()
    if found is None:
        raise NotFound(f"no golden version {version} on {target}" if version else f"no golden set on {target}")
    return found


def golden_results(store: Store, version_id: int) -> dict[tuple[int, str], Result]:
    """The entries of one golden version, each with the campaign whose trial it was (None once that is deleted)."""
    g = GoldenEntry
    with store.transaction() as connection:
        rows = connection.execute(
            select(g.problem_id, g.step, g.payload, g.objective, g.toolchain, g.trial_id, Campaign.name)
            .outerjoin(Trial, Trial.id == g.trial_id)
            .outerjoin(Campaign, Campaign.id == Trial.campaign_id)
            .where(g.version_id == version_id)
        ).all()
    return {
        (r.problem_id, r.step): Result(
            r.problem_id, r.step, r.payload, r.objective, r.toolchain, r.trial_id, campaign=r.name
        )
        for r in rows
    }


@dataclass
class Selection:
    """Which results an export reads.

    Parameters
    ----------
    campaign:
        One campaign (a name, or a reason on the target).
    golden:
        The golden set (``version``, or its latest).
    trusted:
        The campaigns ``--from`` names, or every one (fleet.trust); with none of the three, the one campaign on the
        target that has results.
    """

    target: str
    campaign: str | None = None
    golden: bool = False
    version: int | None = None
    tags: Sequence[str] = ()
    selection: str | None = None
    trusted: Trusted | None = None


def gather(store: Store, what: Selection, step: str | None) -> tuple[dict[tuple[int, str], Result], dict[str, Any]]:
    """The results ``what`` names (of ``step``, or every step), and where they came from: the target, the
    campaigns the results drew on, their toolchains, and the golden version."""
    from fleet.tuna.jobs import find_campaign

    check_target(what.target)
    if sum((what.golden, what.campaign is not None, what.trusted is not None)) > 1:
        raise SpecError("give one of --campaign, --from and --golden")
    if what.version is not None and not what.golden:
        raise SpecError("--version goes with --golden")
    keep = None
    if what.tags or what.selection:
        kinds = KINDS if what.selection else (*KINDS, RAW)  # a selection is over driver parameters
        keep = {pid for pid, _, _ in select_problems(store, tags=what.tags, selection=what.selection, kinds=kinds)}

    def wanted(results: dict[tuple[int, str], Result]) -> dict[tuple[int, str], Result]:
        return {k: v for k, v in results.items() if (step is None or k[1] == step) and (keep is None or k[0] in keep)}

    source: dict[str, Any] = {"target": what.target}
    if what.golden:
        version = golden_version(store, what.target, what.version)
        results = wanted(golden_results(store, version.id))
        source["golden"] = version.version
    elif what.campaign:
        results = wanted(campaign_results(store, [find_campaign(store, what.campaign, what.target)], step))
    else:
        results = _trusted_results(store, what, step, wanted)
    # The campaigns the exported results came from; a golden entry whose trial is deleted names none.
    source["campaigns"] = sorted({r.campaign for r in results.values() if r.campaign})
    source["toolchains"] = sorted({r.toolchain for r in results.values()})
    return results, source


def _trusted_results(
    store: Store,
    what: Selection,
    step: str | None,
    wanted: Callable[[dict[tuple[int, str], Result]], dict[tuple[int, str], Result]],
) -> dict[tuple[int, str], Result]:
    """The best results on ``what.target`` of the campaigns its asker trusts (fleet.trust's rule), merged.

    Each campaign's results are read apart, so that the campaigns holding some of what is exported are known
    before any is chosen; merging their bests picks what reading them together would (:func:`_better` depends on
    no order)."""
    resolve(store, what.trusted)
    names = None if what.trusted is None else what.trusted.names
    on_target = [c for c in store.campaigns() if c.target == what.target and (names is None or c.name in names)]
    per_campaign = {c.id: wanted(campaign_results(store, [c], step)) for c in on_target}
    measured = {c.id: c.name for c in on_target if per_campaign[c.id]}
    drawn = choose(f"target {what.target}" + (f" ({step})" if step else ""), measured, what.trusted)
    merged: dict[tuple[int, str], Result] = {}
    for campaign_id in drawn:
        for key, result in per_campaign[campaign_id].items():
            if _better(key[1], result, merged.get(key)):
                merged[key] = result
    return merged


def _problems(store: Store, problem_ids: Sequence[int]) -> dict[int, tuple[str, dict[str, Any], str | None]]:
    """id -> (kind, params, MIOpen key)."""
    from fleet.store import Problem
    from fleet.store._models import MiopenKey

    out: dict[int, tuple[str, dict[str, Any], str | None]] = {}
    with store.transaction() as connection:
        for part in chunks(sorted(set(problem_ids))):
            for r in connection.execute(
                select(Problem.id, Problem.kind, Problem.params, MiopenKey.db_key)
                .outerjoin(MiopenKey, MiopenKey.problem_id == Problem.id)
                .where(Problem.id.in_(part))
            ).all():
                out[r.id] = (r.kind, r.params, r.db_key or db_key_of(r.kind, r.params))
    return out


# -- export ---------------------------------------------------------------------------------------------------


@contextmanager
def _atomic(output: Path) -> Iterator[Path]:
    """A temporary path beside ``output`` that replaces it only when the block succeeds."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        yield partial
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)


def _sidecar(output: Path, kind: str, source: dict[str, Any], records: int) -> Path:
    sidecar = output.with_name(output.name + ".provenance.json")
    data = {"file": output.name, "format": kind, "records": records, **source}
    with _atomic(sidecar) as partial:
        partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return sidecar


@dataclass
class Written:
    """What an export wrote: how many records, the campaigns they came from, and for a find-db the line format and
    what the records came in."""

    records: int
    line_format: str | None = None
    came_in: dict[str, int] = field(default_factory=dict)
    campaigns: list[str] = field(default_factory=list)


def choose_format(came_in: dict[str, int], wanted: str | None) -> str:
    """The find-db line format to write: ``wanted``, else the one the records came in, else the commoner one.

    Parameters
    ----------
    came_in:
        How many records came in each format (``older``, ``newer``); results of Fleet's own jobs count in none.
    wanted:
        ``older``, ``newer`` or None.
    """
    from fleet.miopen.finddb import FORMATS

    if wanted is not None:
        if wanted not in FORMATS:
            raise SpecError(f"find-db line format must be one of {', '.join(FORMATS)}, not {wanted!r}")
        return wanted
    if not came_in:
        return "older"
    # The commoner format; on a tie the older one, which every MIOpen of the shipped files reads.
    return max(sorted(came_in), key=lambda name: (came_in[name], name == "older"))


def export_find_db(store: Store, what: Selection, output: Path, line_format: str | None = None) -> Written:
    """Write the find-db text of ``what`` to ``output`` (and its sidecar).

    Imported records come out as they came in: key as spelt, entries in the file's order, times as written;
    Fleet's own results fastest first. ``line_format`` (``older`` or ``newer``) chooses the line format;
    without it, the format the records came in (the commoner one when they came in both).
    """
    from fleet.miopen.finddb import FORMATS, FindEntry, FindRecord, write_find_db

    results, source = gather(store, what, "find")
    # An imported record keeps its key as spelt; only Fleet's own results need their problem's key looked up.
    problems = _problems(store, [pid for (pid, _), r in results.items() if not r.payload.get("key")])
    records = []
    came_in: dict[str, int] = {}
    for (pid, _), result in results.items():
        key = result.payload.get("key") or problems[pid][2]
        if key is None:
            continue
        entries = result.payload["find"]
        if "format" in result.payload:
            came_in[result.payload["format"]] = came_in.get(result.payload["format"], 0) + 1
        else:
            entries = sorted(entries, key=lambda e: e[2])
        records.append(FindRecord(key, tuple(FindEntry(*entry) for entry in entries)))
    if not records:
        raise NotFound(f"no find results to export on {what.target}")
    chosen = choose_format(came_in, line_format)
    records.sort(key=lambda r: r.key)
    with _atomic(output) as partial, partial.open("w", newline="\n") as out:
        write_find_db(records, out, style=FORMATS[chosen], keep_order=True)
    _sidecar(output, "find-db", {**source, "line_format": chosen, "came_in": came_in}, len(records))
    return Written(len(records), chosen, came_in, source["campaigns"])


def export_perf_db(store: Store, what: Selection, output: Path) -> Written:
    """Write the perf-db (MIOpen's SQLite schema) of ``what`` to ``output``.

    Imported rows come out as they came in, ids included; where two sources claim one id (a merge), or for
    Fleet's own results, rows get the next free ids, in key order. Returns the perf rows written.
    """
    from fleet.miopen.perfdb import CONFIG_COLUMNS, perf_config, write_perf_rows

    results, source = gather(store, what, "perf")
    problems = _problems(store, [pid for pid, _ in results])
    items = []
    for (pid, _), result in results.items():
        stored = result.payload.get("config")
        row = {name: stored[name] for name in CONFIG_COLUMNS} if stored else perf_config(problems[pid][1])
        perf = result.payload["perf"]
        ids = result.payload.get("perf_ids") or [None] * len(perf)
        items.append((stored["id"] if stored else None, problems[pid][2] or "", row, list(zip(ids, perf, strict=True))))
    if not any(perf for *_, perf in items) and not any(stored is not None for stored, *_ in items):
        raise NotFound(f"no perf results to export on {what.target}")
    # Rows that keep their id first (in id order), then the others in key order.
    items.sort(key=lambda item: (item[0] is None, item[0] or 0, item[1]))
    configs: list[tuple[int, dict[str, Any]]] = []
    perf_rows: list[tuple[int, str, int, str]] = []
    used_configs: set[int] = set()
    used_perf: set[int] = set()
    wanted_perf = [n for *_, perf in items for n, _ in perf if n is not None]
    next_config = max([i for i, *_ in items if i is not None], default=0)
    next_perf = max(wanted_perf, default=0)
    for number, _, row, perf in items:
        if number is None or number in used_configs:
            next_config += 1
            number = next_config
        used_configs.add(number)
        configs.append((number, row))
        for perf_id, (solver, values) in sorted(perf, key=lambda p: (p[0] is None, p[0] or 0, p[1][0])):
            if perf_id is None or perf_id in used_perf:
                next_perf += 1
                perf_id = next_perf
            used_perf.add(perf_id)
            perf_rows.append((perf_id, solver, number, values))
    with _atomic(output) as partial:
        write_perf_rows(partial, configs, perf_rows)
    _sidecar(output, "perf-db", source, len(perf_rows))
    return Written(len(perf_rows), campaigns=source["campaigns"])


def export_kernel_db(store: Store, what: Selection, output: Path) -> Written:
    """Write the kernel-db (``kern_db``) of the kernels built for ``what``'s results; the kernels written."""
    from fleet.bundle import unpack
    from fleet.miopen.kerneldb import read_kernel_db, write_kernel_db

    results, source = gather(store, what, None)
    build_keys = sorted({r.build_key for r in results.values() if r.build_key})
    if what.golden:
        # A golden entry keeps its trial id; its kernels are that trial's artifact.
        trial_ids = sorted({r.trial_id for r in results.values() if r.trial_id})
        with store.transaction() as connection:
            for part in chunks(trial_ids):
                build_keys += list(connection.scalars(select(Trial.build_key).where(Trial.id.in_(part))))
    kernels: dict[tuple[str, str], Any] = {}
    with store.transaction() as connection:
        digests: list[str] = []
        for part in chunks(sorted(set(build_keys))):
            digests += list(
                connection.scalars(
                    select(Artifact.blob_digest).where(
                        Artifact.build_key.in_(part),
                        Artifact.state == ArtifactState.BUILT,
                        Artifact.blob_digest.is_not(None),
                    )
                )
            )
    with tempfile.TemporaryDirectory(prefix="fleet-kdb-") as tmp:
        for n, blob in enumerate(sorted(set(digests))):
            folder = Path(tmp) / str(n)
            folder.mkdir()
            try:
                names = unpack(store.get_blob(blob), folder)
            except Exception:  # an artifact that is not a bundle holds no kernel database
                continue
            for name in names:
                path = folder / name
                if path.is_file() and path.suffix in (".kdb", ".ukdb") and _is_sqlite(path):
                    for kernel in read_kernel_db(path):
                        kernels.setdefault((kernel.name, kernel.args), kernel)
    if not kernels:
        raise NotFound(f"no built kernels to export on {what.target}")
    ordered = [kernels[k] for k in sorted(kernels)]
    with _atomic(output) as partial:
        write_kernel_db(partial, ordered)
    _sidecar(output, "kernel-db", source, len(ordered))
    return Written(len(ordered), campaigns=source["campaigns"])


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(16) == SQLITE_MAGIC
