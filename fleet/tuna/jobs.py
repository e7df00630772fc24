"""Tuna's jobs as Fleet trials.

A *reason* (Tuna's label for why jobs exist: "alexnet-2026-11", "rocm-7.1 retune") is one campaign per
target, named ``REASON@TARGET``, running the ``miopen`` workload over one knob, ``step``: ``perf`` (tune the
solvers' parameters, MIOpen's perf-db) or ``find`` (time every solver, MIOpen's find-db). A job is one trial
(problem, step) of that campaign, so any ``fleet worker`` of the target runs it through the ordinary
compile and evaluate tasks. An invalidated job is a trial in state ``invalid``: no worker claims it, and no
export reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, select, update

from fleet.canonical import digest
from fleet.errors import NotFound, SpecError
from fleet.keys import trial_keys
from fleet.provenance import provenance
from fleet.space import Config, Space
from fleet.states import CampaignStatus, TrialState
from fleet.store import Campaign, Requeue, Store, Trial, utcnow
from fleet.store._models import CampaignProblem
from fleet.targets import check_target
from fleet.tuna.problems import chunks

STEPS = ("perf", "find")
SPACE = {"knobs": {"step": {"values": list(STEPS), "build": True}}, "constraints": [], "base": {}}
WORKLOAD = {"kind": "miopen"}
INVALIDATED = "invalidated by fleet jobs invalidate"


def campaign_name(reason: str, target: str) -> str:
    return f"{reason}@{target}"


def check_reason(reason: str) -> str:
    if not reason or "@" in reason or reason != reason.strip():
        raise SpecError(f"reason {reason!r}: give a non-empty label without '@' or surrounding spaces")
    return reason


def find_campaign(store: Store, ref: str, target: str | None = None) -> Campaign:
    """The campaign named ``ref``, else the one of reason ``ref`` on ``target``."""
    try:
        campaign = store.campaign(ref)
    except NotFound:
        if target is None:
            raise
        try:
            campaign = store.campaign(campaign_name(ref, target))
        except NotFound:
            raise NotFound(f"no campaign {ref!r}, nor reason {ref!r} on {target}") from None
    if target is not None and campaign.target != target:
        raise SpecError(f"campaign {campaign.name!r} is on {campaign.target}, not {target}")
    return campaign


def reason_campaigns(store: Store, reason: str | None = None, target: str | None = None) -> list[Campaign]:
    """The jobs' campaigns (those of the ``miopen`` workload), of one reason and one target when given."""
    found = []
    for campaign in store.campaigns():
        if campaign.workload.get("kind") != "miopen":
            continue
        mine = (campaign.options or {}).get("tuna", {}).get("reason", campaign.name)
        if (reason is None or mine == reason) and (target is None or campaign.target == target):
            found.append(campaign)
    return found


def reason_of(campaign: Campaign) -> str:
    return str((campaign.options or {}).get("tuna", {}).get("reason", campaign.name))


def ensure_campaign(store: Store, reason: str, target: str) -> Campaign:
    """The campaign of ``reason`` on ``target``, created when missing."""
    check_reason(reason)
    check_target(target)
    name = campaign_name(reason, target)
    # The miopen workload's spec names no toolchain (WorkloadSpec.toolchain: its builds' are their workers'), so
    # the reason's campaign is keyed as a submitted campaign of the workload is (Store.create_campaign).
    toolchain = ""
    with store.transaction() as connection:
        connection.execute(
            store.insert(Campaign)
            .values(
                name=name,
                target=target,
                space=SPACE,
                strategy={"name": "grid"},
                workload=WORKLOAD,
                workload_key=digest({"workload": WORKLOAD, "provenance": toolchain}),
                baseline=None,
                options={"tuna": {"reason": reason}},
                provenance=provenance(toolchain),
                status=CampaignStatus.RUNNING,
                created_at=utcnow(),
            )
            .on_conflict_do_nothing()
        )
    campaign = store.campaign(name)
    if campaign.workload.get("kind") != "miopen" or campaign.target != target:
        raise SpecError(f"campaign {name!r} exists and is not the jobs of reason {reason!r} on {target}")
    return campaign


@dataclass(frozen=True)
class Added:
    campaign: Campaign
    created: int
    existing: int
    work: list[Requeue]
    again: int = 0  # existing jobs that had errored, new again (``remeasure``)


def add_jobs(
    store: Store,
    reason: str,
    target: str,
    problem_ids: Sequence[int],
    steps: Sequence[str],
    remeasure: bool = False,
) -> Added:
    """Create one trial per problem and step in the campaign of ``reason`` on ``target``.

    Jobs that exist already are found, not duplicated. Returns the work to send (trials in state ``new``).
    ``remeasure`` measures them even where a measurement exists, builds again what failed to build before, and
    runs the reason's errored jobs among them again (after a node's MIOpen was installed or fixed).
    """
    for step in steps:
        if step not in STEPS:
            raise SpecError(f"unknown step {step!r}: expected one of {', '.join(STEPS)}")
    jobs = [(problem_id, step) for problem_id in problem_ids for step in steps]
    return _add(store, reason, target, jobs, remeasure)


def _add(store: Store, reason: str, target: str, jobs: Sequence[tuple[int, str]], remeasure: bool = False) -> Added:
    campaign = ensure_campaign(store, reason, target)
    space = Space.from_dict(campaign.space)
    now = utcnow()
    trials: list[dict[str, Any]] = []
    problem_ids = list(dict.fromkeys(problem_id for problem_id, _ in jobs))
    for problem_id, step in jobs:
        config: Config = {"step": step}
        build_key, measure_key = trial_keys(campaign, problem_id, config, space)
        trials.append(
            {
                "campaign_id": campaign.id,
                "problem_id": problem_id,
                "target": target,
                "config": config,
                "config_key": digest(config),
                "build_key": build_key,
                # The reason is part of the measure key: a new reason measures again, as Tuna's new jobs do.
                "measure_key": digest([measure_key, campaign.name]),
                "seq": 0,
                "baseline": False,
                "state": TrialState.NEW,
                "attempts": 0,
                "remeasure": remeasure,
                "created_at": now,
                "queued_at": now,
            }
        )
    with store.transaction() as connection:
        position = (
            connection.scalar(
                select(func.count()).select_from(CampaignProblem).where(CampaignProblem.campaign_id == campaign.id)
            )
            or 0
        )
        rows = [
            {"campaign_id": campaign.id, "problem_id": pid, "position": position + i}
            for i, pid in enumerate(problem_ids)
        ]
        store.insert_many(connection, CampaignProblem, rows)
        before = connection.scalar(select(func.count()).select_from(Trial).where(Trial.campaign_id == campaign.id)) or 0
        store.insert_many(connection, Trial, trials)
        states: dict[tuple[int, str], tuple[int, str]] = {}
        for part in chunks(sorted(set(problem_ids))):
            for r in connection.execute(
                select(Trial.id, Trial.problem_id, Trial.config_key, Trial.state).where(
                    Trial.campaign_id == campaign.id, Trial.target == target, Trial.problem_id.in_(part)
                )
            ):
                states[(r.problem_id, r.config_key)] = (r.id, r.state)
        after = connection.scalar(select(func.count()).select_from(Trial).where(Trial.campaign_id == campaign.id)) or 0
        wanted = [states[(t["problem_id"], t["config_key"])] for t in trials]
        again = {trial_id for trial_id, state in wanted if state == TrialState.ERRORED} if remeasure else set()
        for part in chunks(sorted(again)):
            connection.execute(
                update(Trial)
                .where(Trial.id.in_(part), Trial.state == TrialState.ERRORED)
                .values(state=TrialState.NEW, reason=None, worker=None, lease_expires_at=None, finished_at=None,
                        attempts=0, remeasure=True, queued_at=now)
            )  # fmt: skip
    if remeasure:
        store.forget_failed_builds(campaign.id, {t["build_key"] for t in trials}, until=now)
    created = after - before
    store.set_campaign_status(campaign.id, CampaignStatus.RUNNING)
    work = [
        Requeue(trial_id, target, "compile")
        for trial_id, state in wanted
        if state == TrialState.NEW or trial_id in again
    ]
    return Added(campaign, created, len(wanted) - created, work, len(again))


def copy_jobs(
    store: Store,
    from_reason: str,
    reason: str,
    target: str | None = None,
    include_invalid: bool = False,
    remeasure: bool = False,
) -> list[Added]:
    """Copy the jobs of ``from_reason`` (on ``target``, or on every target it has) to ``reason``, as new jobs
    (``remeasure``: as :func:`add_jobs`)."""
    check_reason(reason)
    sources = reason_campaigns(store, from_reason, target)
    if not sources:
        raise NotFound(f"no jobs of reason {from_reason!r}" + (f" on {target}" if target else ""))
    copied = []
    for source in sources:
        query = select(Trial.problem_id, Trial.config).where(Trial.campaign_id == source.id).order_by(Trial.id)
        if not include_invalid:
            query = query.where(Trial.state != TrialState.INVALID)
        with store.transaction() as connection:
            rows = connection.execute(query).all()
        jobs = [(row.problem_id, str(row.config["step"])) for row in rows]
        copied.append(_add(store, reason, source.target, jobs, remeasure))
    return copied


def invalidate(
    store: Store,
    *,
    reason: str | None = None,
    target: str | None = None,
    problem_ids: Sequence[int] | None = None,
    steps: Sequence[str] = (),
) -> int:
    """Mark the matching jobs ``invalid`` (never run, never exported); return how many changed."""
    if reason is None and target is None and problem_ids is None:
        raise SpecError("invalidate what? give --reason, --target, or a selection (--tag, --select, flags)")
    campaigns = [c.id for c in reason_campaigns(store, reason, target)]
    if not campaigns:
        return 0
    now = utcnow()
    changed = 0
    condition = [Trial.campaign_id.in_(campaigns), Trial.state != TrialState.INVALID]
    values = {
        "state": TrialState.INVALID,
        "reason": INVALIDATED,
        "worker": None,
        "lease_expires_at": None,
        "finished_at": now,
    }
    with store.transaction() as connection:
        parts = [None] if problem_ids is None else list(chunks(sorted(set(problem_ids))))
        for part in parts:
            where = list(condition)
            if part is not None:
                where.append(Trial.problem_id.in_(part))
            if steps:  # the step is a knob, inside the JSON configuration: chosen here, not in SQL
                rows = connection.execute(select(Trial.id, Trial.config).where(*where)).all()
                ids = [row.id for row in rows if row.config.get("step") in steps]
                chosen: list[ColumnElement[bool]] = [Trial.id.in_(ids_part) for ids_part in chunks(ids)]
            else:
                chosen = [and_(*where)]
            for condition_part in chosen:
                changed += connection.execute(update(Trial).where(condition_part).values(**values)).rowcount
    return changed


def list_jobs(
    store: Store,
    *,
    reason: str | None = None,
    target: str | None = None,
    problem_ids: Sequence[int] | None = None,
    state: str | None = None,
) -> list[dict[str, Any]]:
    """Counts of jobs per reason, target, step and state (filtered by the problems given)."""
    wanted = None if problem_ids is None else set(problem_ids)
    out = []
    for campaign in reason_campaigns(store, reason, target):
        query = select(Trial.problem_id, Trial.config, Trial.state).where(Trial.campaign_id == campaign.id)
        if state is not None:
            query = query.where(Trial.state == state)
        with store.transaction() as connection:
            rows = connection.execute(query).all()
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            if wanted is not None and row.problem_id not in wanted:
                continue
            key = (str(row.config.get("step")), row.state)
            counts[key] = counts.get(key, 0) + 1
        steps: dict[str, dict[str, int]] = {}
        for (step, st), n in sorted(counts.items()):
            steps.setdefault(step, {})[st] = n
        out.append(
            {
                "reason": reason_of(campaign),
                "target": campaign.target,
                "campaign": campaign.name,
                "steps": steps,
                "total": sum(counts.values()),
            }
        )
    return out
