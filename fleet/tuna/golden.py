"""Golden sets: the best results of chosen campaigns, promoted to a numbered version per target, as Tuna does.

Version N is version N-1 with the chosen campaigns' best results laid over it (per problem and step: the
fastest find result, the latest perf result). Entries are copies, so an export of version N gives the same
bytes later, whatever happens to the campaigns since.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select

from fleet.errors import SpecError
from fleet.provenance import provenance
from fleet.store import Store, utcnow
from fleet.store._models import GoldenEntry, GoldenVersion
from fleet.targets import check_target
from fleet.tuna.databases import campaign_results, golden_results
from fleet.tuna.jobs import find_campaign


@dataclass(frozen=True)
class Promoted:
    target: str
    version: int
    entries: int
    promoted: int
    campaigns: list[str]


def update_golden(store: Store, target: str, campaigns: Sequence[str], version: int | None = None) -> Promoted:
    """Promote the best results of ``campaigns`` (names, or reasons on ``target``) to a new golden version."""
    check_target(target)
    if not campaigns:
        raise SpecError("name the campaigns to promote with --campaign")
    chosen = [find_campaign(store, ref, target) for ref in campaigns]
    new = campaign_results(store, chosen)
    if not new:
        raise SpecError(f"campaigns {', '.join(c.name for c in chosen)} have no valid result to promote")
    with store.transaction() as connection:
        latest = connection.scalar(select(func.max(GoldenVersion.version)).where(GoldenVersion.target == target))
        previous_id = connection.scalar(
            select(GoldenVersion.id).where(GoldenVersion.target == target, GoldenVersion.version == latest)
        )
    if version is None:
        version = (latest or 0) + 1
    elif latest is not None and version <= latest:
        raise SpecError(f"golden version {version} on {target} exists or is older than {latest}: versions only grow")
    entries = golden_results(store, previous_id) if previous_id is not None else {}
    entries.update(new)
    names = [c.name for c in chosen]
    now = utcnow()
    with store.transaction() as connection:
        version_id = connection.scalar(
            store.insert(GoldenVersion)
            .values(target=target, version=version, campaigns=names, provenance=provenance(""), created_at=now)
            .returning(GoldenVersion.id)
        )
        rows = [
            {
                "version_id": version_id,
                "problem_id": r.problem_id,
                "step": r.step,
                "trial_id": r.trial_id,
                "objective": r.objective,
                "payload": r.payload,
                "toolchain": r.toolchain,
            }
            for _, r in sorted(entries.items())
        ]
        store.insert_many(connection, GoldenEntry, rows)
    return Promoted(target, version, len(rows), len(new), names)


def versions(store: Store, target: str | None = None) -> list[dict]:
    """Every golden version (of ``target``), with its entry count."""
    query = (
        select(GoldenVersion, func.count(GoldenEntry.problem_id))
        .outerjoin(GoldenEntry, GoldenEntry.version_id == GoldenVersion.id)
        .group_by(GoldenVersion.id)
        .order_by(GoldenVersion.target, GoldenVersion.version)
    )
    if target is not None:
        query = query.where(GoldenVersion.target == target)
    with store.session() as session:
        rows = session.execute(query).all()
        return [
            {
                "target": v.target,
                "version": v.version,
                "campaigns": v.campaigns,
                "entries": n,
                "created_at": v.created_at.isoformat(timespec="seconds"),
            }
            for v, n in rows
        ]
