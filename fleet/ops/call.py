"""``fleet call``: send one task by hand, the way a person tries one configuration, and print its result.

Fleet's tasks take a trial (or chain) id, not a configuration, so a call first writes the configuration as a
trial of an *ad-hoc campaign*: ``<campaign>.adhoc``, a copy of the problem's campaign on that target (its
workload, space and toolchain; the newest such campaign, or ``--campaign``), or of the campaign a ``--spec``
file describes. Its trials have the same build and measure keys as the campaign's, so an artifact already
built is reused and a configuration already measured is answered from the database (``--remeasure``
measures it again). The ad-hoc campaign's status is ``adhoc``: no driver ever runs it.

No result backend is configured (results live in the database, not in Redis), so the call waits for the
trial's state in the database, never for a Celery result. ``--no-send`` only writes the trial and prints
its id, for ``celery -A fleet.tasks call fleet.compile --kwargs '{"trial_id": N, "target": "T"}'``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fleet.errors import BrokerError, FleetError, NotFound
from fleet.settings import get_settings, redact
from fleet.states import FINISHED, ChainState, TrialState

ADHOC = "adhoc"


@dataclass(frozen=True)
class Kind:
    """How ``fleet call KIND`` runs: the Celery task, what it takes, and what the call waits for.

    Parameters
    ----------
    task:
        The Celery task's name.
    takes:
        ``trial`` (kwargs ``trial_id``, ``target``) or ``chain`` (``chain_id``, ``step``, ``target``).
    until:
        ``compiled``: the trial is built; ``result``: the trial is finished; ``step``: the chain step is recorded.
    builds_first:
        A trial not built yet is sent to ``fleet.compile`` instead, which sends this task itself once built.
    """

    task: str
    takes: str
    until: str
    builds_first: bool = False


# Adding a task kind is one line here (and its queue in fleet.tasks.TASK_QUEUES).
KINDS: dict[str, Kind] = {
    "compile": Kind("fleet.compile", "trial", TrialState.COMPILED),
    "evaluate": Kind("fleet.evaluate", "trial", "result", builds_first=True),
    "anneal-step": Kind("fleet.anneal_step", "chain", "step"),
    "tvm-measure": Kind("fleet.tvm_measure", "trial", "result"),
}


def find_problem(store: Any, ref: str, target: str | None) -> Any:
    """The problem ``ref`` names: an id, or a kind with one problem (on ``target``'s campaigns, if several)."""
    if ref.isdigit():
        return store.problem(int(ref))
    problems = store.find_problems(kind=ref, params={})
    if len(problems) > 1 and target:
        on_target = {p.id for c in store.campaigns() if c.target == target for p in store.campaign_problems(c.id)}
        problems = [p for p in problems if p.id in on_target] or problems
    if not problems:
        raise NotFound(f"no problem {ref!r}")
    if len(problems) > 1:
        ids = ", ".join(str(p.id) for p in problems[:10])
        raise FleetError(f"{len(problems)} problems of kind {ref!r} (ids {ids}): give --problem ID")
    return problems[0]


def source_campaign(store: Any, problem_id: int, target: str | None, name: str | None) -> Any:
    """The campaign whose workload and space an ad-hoc call of ``problem_id`` on ``target`` uses."""
    if name is not None:
        campaign = store.campaign(name)
        if problem_id not in {p.id for p in store.campaign_problems(campaign.id)}:
            raise NotFound(f"problem {problem_id} is not in campaign {campaign.name}")
        if target and campaign.target != target:
            raise FleetError(f"campaign {campaign.name} tunes for {campaign.target}, not {target}")
        return campaign
    found = [
        c
        for c in store.campaigns()
        if (target is None or c.target == target) and problem_id in {p.id for p in store.campaign_problems(c.id)}
    ]
    # A campaign that tunes is the source of truth; its ad-hoc copy only when nothing else is left.
    found.sort(key=lambda c: (c.status != ADHOC, c.id))
    if not found:
        where = f" on {target}" if target else ""
        raise NotFound(f"no campaign of problem {problem_id}{where}: give --spec SPEC to say how to build and run it")
    if target is None and len({c.target for c in found}) > 1:
        raise FleetError(f"problem {problem_id} is tuned for several targets: give --target")
    return found[-1]


def adhoc_campaign(store: Any, source: Any) -> Any:
    """The ad-hoc copy of ``source`` (created the first time)."""
    if source.status == ADHOC:
        return source
    campaign = store.create_campaign(
        name=f"{source.name}.{ADHOC}",
        target=source.target,
        problem_ids=[p.id for p in store.campaign_problems(source.id)],
        space=source.space,
        strategy={"name": ADHOC},
        workload=source.workload,
        options={},
        provenance=source.provenance,
    )
    if campaign.status != ADHOC:
        store.set_campaign_status(campaign.id, ADHOC)
    return store.campaign(campaign.id)


def adhoc_from_spec(store: Any, spec: Any) -> Any:
    """The ad-hoc campaign of a loaded spec (its problems, workload and space), created if new."""
    from fleet.provenance import provenance

    problem_ids = [store.add_problem(p.kind, p.params, p.tags) for p in spec.problems]
    for data in spec.files.values():
        store.put_blob(data)
    campaign = store.create_campaign(
        name=f"{spec.name}.{ADHOC}",
        target=spec.target,
        problem_ids=problem_ids,
        space=spec.space.to_dict(),
        strategy={"name": ADHOC},
        workload=spec.workload,
        options={},
        provenance=provenance(),  # the toolchain is the build worker's, taken where it builds
    )
    store.set_campaign_status(campaign.id, ADHOC)
    return store.campaign(campaign.id)


def new_trial(campaign: Any, problem_id: int, config: dict[str, Any]) -> Any:
    """``config`` (checked against the campaign's knobs) as a trial of ``campaign``, with its keys."""
    from fleet.keys import trial_keys
    from fleet.space import Space
    from fleet.store import NewTrial

    space = Space.from_dict(campaign.space)
    config = space.check(config)
    build_key, measure_key = trial_keys(campaign, problem_id, config, space)
    return NewTrial(problem_id, config, build_key, measure_key)


def measured_before(store: Any, measure_key: str) -> int | None:
    """The trial that holds a measurement of the same problem, target, configuration, workload and toolchain."""
    from sqlalchemy import select

    from fleet.store._models import Measurement

    with store.session() as session:
        return session.scalar(
            select(Measurement.trial_id).where(Measurement.measure_key == measure_key).order_by(Measurement.id.desc())
        )


def add_chain(store: Any, campaign: Any, problem_id: int, config: dict[str, Any], steps: int) -> int:
    """A new annealing chain of ``campaign`` that starts at ``config``; return its id."""
    from fleet.search.anneal import TEMPERATURE
    from fleet.space import Space

    config = Space.from_dict(campaign.space).check(config)
    for _ in range(3):  # another call may take the same index at the same time: then take the next one
        existing = [c for c in store.chains(campaign.id) if c.problem_id == problem_id]
        starts = [c.config for c in sorted(existing, key=lambda c: c.index)] + [config]
        ids = store.create_chains(
            campaign.id, problem_id, starts, seed=len(existing), steps=steps, temperature=TEMPERATURE
        )
        chain = store.chain(ids[len(existing)])
        if chain.config == config and chain.step == 0:
            return chain.id
    raise FleetError("could not create a chain: other calls keep taking its place; try again")


def send(task: str, kwargs: dict[str, Any]) -> str:
    """Send ``task`` with ``kwargs`` (the router picks the target's queue); return the Celery task id."""
    from fleet.tasks import app

    settings = get_settings()
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0.2, timeout=5)
            return app.send_task(task, kwargs=kwargs, connection=connection).id
    except Exception as error:  # kombu raises several kinds; all mean the broker cannot take the message
        raise BrokerError(f"broker {redact(settings.broker_url)} does not answer: {error}") from None


def wait(store: Any, until: str, subject: int, step: int = 0, timeout: float = 600, poll: float = 0.1) -> Any:
    """Wait in the database until the trial (or chain step) ``subject`` is done; return what it recorded."""
    deadline = time.monotonic() + timeout
    while True:
        if until == "step":
            # The chain's state first, then its steps: a chain that stopped has recorded its steps by then, where
            # read the other way round a step recorded between the two reads was missed (and the call said the chain
            # stopped before it).
            chain = store.chain(subject)
            steps = [s for c, s in store.chain_steps(chain.campaign_id) if c.id == subject]
            done = next((s for s in steps if s.step == step), None)
            if done is not None or chain.state != ChainState.RUNNING:
                return done
        else:
            trial = store.trial(subject)
            if until == TrialState.COMPILED and trial.state not in (TrialState.NEW, TrialState.COMPILING):
                return trial
            if trial.state in FINISHED:
                return trial
        if time.monotonic() > deadline:
            what = f"chain {subject} step {step}" if until == "step" else f"trial {subject}"
            raise FleetError(
                f"{what} is not done after {timeout:g} s; it goes on: see `fleet status` and `fleet logs --trial`"
            )
        time.sleep(poll)


def describe(store: Any, trial_id: int) -> dict[str, Any]:
    """What the database holds about a trial: state, reason, and its measurement."""
    from sqlalchemy import select

    from fleet.store._models import Measurement

    trial = store.trial(trial_id)
    out: dict[str, Any] = {
        "trial": trial.id,
        "campaign": store.campaign(trial.campaign_id).name,
        "problem": trial.problem_id,
        "target": trial.target,
        "config": trial.config,
        "state": trial.state,
        "reason": trial.reason,
    }
    if trial.source_trial_id is not None:
        out["measured_by_trial"] = trial.source_trial_id
    with store.session() as session:
        m = session.scalars(select(Measurement).where(Measurement.trial_id == trial.measured_in)).first()
    if m is not None:
        out |= {
            "objective_name": m.objective_name,
            "objective": m.objective,
            "valid": m.valid,
            "samples": m.samples,
            "metrics": m.metrics,
            "worker": m.worker,
            "node": m.node,
            "toolchain": m.toolchain,
            "device": m.device,
        }
    # The artifact its compile took: one of its build key's, built with its toolchain.
    artifact = store.artifact(trial.build_key, trial.toolchain)
    if artifact is not None:
        out["artifact"] = {"state": artifact.state, "digest": artifact.blob_digest, "worker": artifact.worker}
    return out
