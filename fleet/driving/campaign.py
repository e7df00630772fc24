"""Campaigns: writing a spec to the store, and the driver that keeps the fleet busy with it.

A :class:`~fleet.spec.CampaignSpec` is validated whole before anything is written. :func:`submit` writes it;
:class:`Driver` asks each problem's searcher for configurations, writes trials, sends them with a bounded
window, and feeds finished runs back. Everything it knows is in the database, so a driver that dies is
resumed by running it again: trials are found instead of created, and finished ones are replayed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from fleet.canonical import digest
from fleet.driving.history import campaign_history
from fleet.driving.judging import campaign_space, searched
from fleet.driving.pace import MAX_BATCH, SLOT_DEPTH, Pace
from fleet.driving.summary import Summary, summarize
from fleet.errors import FleetError
from fleet.keys import trial_keys
from fleet.provenance import provenance
from fleet.search import Searcher
from fleet.search.feed import Feed
from fleet.settings import liveness_window
from fleet.space import Config, Space
from fleet.spec import (  # noqa: F401 - the spec's names, re-exported for callers that predate fleet.spec
    CampaignSpec,
    ProblemSpec,
    chains_on_fleet,
    check_target,
    load_spec,
    new_searcher,
    parse_spec,
)
from fleet.spec.workloads import load_workload_spec
from fleet.states import DRIVEN, TERMINAL, WAITING, CampaignStatus, TrialState
from fleet.store import Campaign, NewTrial, Requeue, Store, TrialResult


def submit(store: Store, spec: CampaignSpec, team: str | None = None) -> Campaign:
    """Write ``spec`` (problems, source bundle, campaign); resubmitting the same spec returns the campaign.

    Parameters
    ----------
    team:
        The team that owns it (PostgreSQL); default: the one team the login is a member of.
    """
    problem_ids = [store.add_problem(p.kind, p.params) for p in spec.problems]
    for data in spec.files.values():
        store.put_blob(data)
    campaign = store.create_campaign(
        name=spec.name,
        target=spec.target,
        problem_ids=problem_ids,
        space=spec.space.to_dict(),
        strategy=spec.strategy,
        workload=spec.workload,
        options=spec.options,
        provenance=provenance(),
        baseline=spec.baseline,
        team=team,
    )
    # Tagged once the campaign holds them: a team's login tags only its own campaigns' problems (migration 0015).
    store.tag_problems(zip(problem_ids, (p.tags for p in spec.problems), strict=True))
    if spec.priority != campaign.priority:
        store.set_priority(campaign.id, spec.priority)
        campaign.priority = spec.priority
    return campaign


def baseline_configs(space: Space, baseline: Mapping[str, Any]) -> list[Config]:
    """The baseline once for each combination of the run-time knobs it leaves open."""
    open_knobs = [k for k in space.knobs if k.name not in baseline]
    return [
        {
            name: ({**baseline, **dict(zip([k.name for k in open_knobs], values, strict=True))})[name]
            for name in space.names
        }
        for values in itertools.product(*(k.values for k in open_knobs))
    ]


def build_order(work: list[Requeue], keys: list[str | None], build_slots: int) -> list[Requeue]:
    """``work`` (its build keys beside it, None for an evaluation) in an order that keeps every build slot building.

    A compile whose artifact another worker is building waits for it, holding its build slot: sent back to back,
    the trials of one build key would leave every build slot but one waiting. So each key's first trial goes
    first, and the key's other trials (quick to compile: they find the artifact) follow once the first trials
    of as many other keys as there are build slots beside it have been sent: they are taken about when their
    build ends, and their evaluations start then. With one build slot this is the searcher's own order.
    """
    groups: dict[str, list[Requeue]] = {}
    order = [requeue for requeue, key in zip(work, keys, strict=True) if key is None]
    for requeue, key in zip(work, keys, strict=True):
        if key is not None:
            groups.setdefault(key, []).append(requeue)
    lag = max(1, build_slots) - 1
    firsts = list(groups)
    for position, key in enumerate(firsts):
        order.append(groups[key][0])
        if position >= lag:
            order.extend(groups[firsts[position - lag]][1:])
    for key in firsts[max(0, len(firsts) - lag) :]:
        order.extend(groups[key][1:])
    return order


class LeaseLost(FleetError):
    """Another driver holds the campaign now: this one stalled past its lease, and must stop driving."""


class CampaignBusy(FleetError):
    """A live driver holds the campaign: watch it instead of driving it."""


class Steering:
    """A driver's view of its campaign's row: its lease (renewed here), a pause, a cancel.

    Parameters
    ----------
    owner:
        The driver's name when it holds the campaign's lease; None for a driver that holds none.
    lease_seconds:
        How long the lease lasts without renewal; another driver takes the campaign after that.
    every:
        Seconds between looks at the row: how fast a cancel or pause is seen.
    force:
        Take the lease from a driver that holds it (``fleet resume`` of a campaign its user drives).
    """

    def __init__(
        self,
        store: Store,
        campaign_id: int,
        owner: str | None = None,
        *,
        lease_seconds: float = 30.0,
        every: float = 1.0,
        force: bool = False,
    ) -> None:
        self.store = store
        self.campaign_id = campaign_id
        self.owner = owner
        self.force = force
        self.lease_seconds = lease_seconds
        self.every = min(every, lease_seconds / 3)
        self.last = -1e9
        self.status: str = CampaignStatus.RUNNING
        # Set by a stopping ``fleet driver``: the campaign is let go, for another driver to take.
        self.stop: threading.Event | None = None

    def take(self) -> None:
        """Hold the campaign's lease before driving it; raises :class:`CampaignBusy` when a live driver has it."""
        if self.owner is None or self.store.take_campaign(
            self.campaign_id, self.owner, self.lease_seconds, force=self.force
        ):
            return
        campaign = self.store.campaign(self.campaign_id)
        if campaign.status not in DRIVEN:
            return  # ended: the driver returns what it found without driving
        raise CampaignBusy(
            f"campaign {campaign.name!r} is driven by {campaign.driver}; `fleet status {campaign.name}` shows how far"
        )

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every

    def check(self) -> str:
        """The campaign's status now; raises :class:`LeaseLost` when another driver took it."""
        self.last = time.monotonic()
        if self.stop is not None and self.stop.is_set():
            self.status = "let go"
            return self.status
        if self.owner is None:
            self.status = self.store.campaign(self.campaign_id).status
            return self.status
        status = self.store.renew_campaign(self.campaign_id, self.owner, self.lease_seconds)
        if status is None:
            status = self.store.campaign(self.campaign_id).status
            if status not in DRIVEN:
                self.status = status  # a cancel lets go of the lease: not a takeover
                return status
            raise LeaseLost(f"campaign {self.campaign_id}: another driver took it over")
        self.status = status
        return status

    def release(self) -> None:
        if self.owner is not None:
            self.store.release_campaign(self.campaign_id, self.owner)

    def __enter__(self) -> Steering:
        self.take()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Driver:
    """Runs a campaign to its end on whatever workers listen on its target's queues.

    Parameters
    ----------
    store:
        The database.
    campaign:
        The campaign to run (or resume).
    dispatch:
        Sends work to the broker, up to the given number of trials per message (``fleet.tasks.send``);
        the driver itself knows no Celery.
    window:
        Most trials in flight at once; enough to keep every evaluation slot busy.
    on_progress:
        Called with (finished, total, best so far of the latest result's problem) after each poll.
    on_warning:
        Called with one line when something needs the user's attention (no worker listening).
    steering:
        Where the driver learns of a pause or a cancel, and renews its lease on the campaign.
    window_for:
        Called at each look at the campaign with the messages to keep in flight per evaluation slot of the
        target (:meth:`Pace.depth`); returns the campaign's share of them, which admits a message's worth of
        trials each (one trial, or for cheap trials :data:`MAX_BATCH`).
    user_code:
        True in the submitting user's own process only (see :func:`campaign_space`).
    """

    @property
    def dynamic(self) -> bool:
        """Whether the searchers use past runs; static ones need no bounded window."""
        return any(searcher.is_dynamic for searcher in self.searchers)

    def __init__(
        self,
        store: Store,
        campaign: Campaign,
        dispatch: Callable[[list[Requeue], int], int],
        *,
        window: int = 8,
        on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        poll_seconds: float = 0.05,
        max_attempts: int = 3,
        heartbeat_seconds: float = 5.0,
        liveness_seconds: float | None = None,
        requeue_seconds: float = 300.0,
        steering: Steering | None = None,
        window_for: Callable[[float], int] | None = None,
        user_code: bool = False,
    ) -> None:
        self.store = store
        self.campaign = campaign
        self.dispatch = dispatch
        self.steering = steering or Steering(store, campaign.id)
        self.window_for = window_for
        self.paused = False
        self.window = max(1, window)
        self.on_progress = on_progress or (lambda *_: None)
        self.on_warning = on_warning or (lambda _: None)
        self.poll_seconds = poll_seconds
        self.max_attempts = max_attempts
        self.heartbeat_seconds = heartbeat_seconds
        self.liveness_seconds = liveness_window(heartbeat_seconds) if liveness_seconds is None else liveness_seconds
        self.requeue_seconds = requeue_seconds
        self.space, factory = campaign_space(campaign, user_code)
        workload = load_workload_spec(campaign.workload)
        self.maximize, self.objectives = workload.maximize, workload.objectives
        # A TVM trial is built and measured on the evaluation worker in one task (see fleet.tasks.tvm).
        self.first_task = "tvm_measure" if campaign.workload.get("kind") == "tvm" else "compile"
        self.problems = [p.id for p in store.campaign_problems(campaign.id)]
        self._start_searchers(store, factory)
        self.in_flight: dict[int, tuple[int, int]] = {}  # trial id -> (problem index, times the searcher asked)
        # Trials that ended, those of earlier drivers too, so that a resumed campaign counts on from where it was
        # (its total is the campaign's); keeping their results would grow with the campaign.
        self.finished = sum(n for state, n in store.trial_counts(campaign.id).items() if state in TERMINAL)
        self.counted: set[int] = set()  # trials in flight again (to feed their searcher) that ended before
        self.best: dict[int, TrialResult] = {}
        self.latest: int | None = None  # the problem of the latest result, whose best the progress shows
        self.seq = 0
        self.unsent: list[Requeue] = []
        self.broker_warned = -1e9
        self.pace = Pace()
        self.unheard: float | None = None  # since when no evaluation worker of the target has been seen
        self._count_budget(store)

    def _start_searchers(self, store: Store, factory: Callable[[Space], Searcher] | None) -> None:
        """A searcher per problem, each with its feed, and the campaign's baselines."""
        campaign = self.campaign
        # A baseline that is also a configuration of the space is a trial the searcher may propose: it is measured
        # already, so it is no trial of the budget (the driver does not count it), and the searcher may propose
        # one more for each such baseline (a grid whose first configuration is the baseline spent its budget one
        # short: 4 became 3).
        self.baselines = baseline_configs(self.space, campaign.baseline) if campaign.baseline else []
        inside = sum(1 for config in self.baselines if self._in_space(config))
        self.searchers = [
            new_searcher(
                _more_budget(self._strategy(store, problem), inside),
                self.space,
                maximize=self.maximize,
                index=index,
                factory=factory,
                objectives=self.objectives,
            )
            for index, problem in enumerate(store.campaign_problems(campaign.id))
        ]
        self.feeds = [Feed(searcher.generate()) for searcher in self.searchers]
        # A reason's jobs are the trials `fleet miopen jobs add|copy` wrote, of the steps asked for: a driver runs
        # those and proposes none (its grid over both steps would add the step the reason did not ask for).
        self.written = "tuna" in (campaign.options or {})
        if self.written:
            for feed in self.feeds:
                feed.done = True

    def _count_budget(self, store: Store) -> None:
        """The budget, and per problem the configurations tried and the searcher's trials counted against it."""
        campaign = self.campaign
        # The budget counts the campaign's trials, not this driver's proposals: a driver that takes a campaign
        # over (a failover, ``fleet resume``) has a searcher that may propose other configurations than the
        # first one's did, and each new one would be a trial past the budget (40 became 44).
        budget = campaign.strategy.get("budget")
        self.budget: int | None = None if budget is None else int(budget)
        baselines = {digest(config) for config in self.baselines}
        self.tried: list[set[str]] = [set(baselines) for _ in self.problems]
        self.searched = [0] * len(self.problems)
        if self.budget is not None:
            position = {problem_id: index for index, problem_id in enumerate(self.problems)}
            for problem_id, key, baseline in store.tried_configs(campaign.id):
                if problem_id in position:
                    self.tried[position[problem_id]].add(key)
                    self.searched[position[problem_id]] += not baseline

    def _strategy(self, store: Store, problem: Any) -> dict[str, Any]:
        """The campaign's strategy; ``auto`` starts from what related problems found best (fleet.driving.history)."""
        strategy = self.campaign.strategy
        options = dict(strategy.get("options") or {})
        # History is of the best by one objective: a search of several objectives' front starts without it.
        if strategy.get("name") != "auto" or "history" in options or len(self.objectives) > 1:
            return strategy
        history = campaign_history(store, self.campaign, problem, self.space, self.maximize)
        if history is None:
            return strategy
        return {**strategy, "options": {**options, "history": history}}

    def total(self) -> int | None:
        """How many trials the campaign will have, when that is cheap to know."""
        budget = self.campaign.strategy.get("budget")
        if self.space.size > 200_000:
            return None if budget is None else budget * len(self.problems)
        # The baselines the space holds are among its valid configurations, and trials once.
        valid = sum(1 for _ in self.space) - sum(1 for config in self.baselines if self._in_space(config))
        per_problem = valid if budget is None else min(budget, valid)
        return (per_problem + len(self.baselines)) * len(self.problems)

    def _label(self, trial: NewTrial) -> str:
        """Whose trial it is, for a person watching the queues (Flower): campaign, problem, configuration."""
        config = " ".join(f"{k}={v}" for k, v in trial.config.items())
        return f"{self.campaign.name}: problem {trial.problem_id}{' baseline' if trial.baseline else ''} {config}"

    def _submit(self, proposals: list[tuple[int, Config, bool]]) -> None:
        trials = []
        for index, config, baseline in proposals:
            problem_id = self.problems[index]
            build_key, measure_key = trial_keys(self.campaign, problem_id, config, self.space)
            self.seq += 1
            # A proposal the searcher took from history says so (``auto``'s origin()); a baseline never does.
            origin = getattr(self.searchers[index], "origin", None)
            history = origin(config) if origin is not None and not baseline else None
            trials.append(NewTrial(problem_id, config, build_key, measure_key, self.seq, baseline, history))
        remeasure = bool(self.campaign.options.get("remeasure"))
        created = self.store.add_trials(self.campaign.id, self.campaign.target, trials, remeasure=remeasure)
        send = []
        keys: list[str | None] = []
        for (index, _, baseline), trial, (trial_id, state) in zip(proposals, trials, created, strict=True):
            # A baseline that is also in the space is one trial; only the searcher's proposals go back to it.
            asked = 0 if baseline else 1
            if trial_id in self.in_flight:
                self.in_flight[trial_id] = (index, self.in_flight[trial_id][1] + asked)
                continue
            self.in_flight[trial_id] = (index, asked)
            if state in TERMINAL:
                self.counted.add(trial_id)  # the baseline, or an earlier driver's trial: it ended already
            if state in WAITING:
                task = self.first_task if state == TrialState.NEW else "evaluate"
                send.append(Requeue(trial_id, self.campaign.target, task, label=self._label(trial)))
                keys.append(trial.build_key if state == TrialState.NEW and self.first_task == "compile" else None)
        if len(set(keys) - {None}) > 1:
            builders = self.store.workers(target=self.campaign.target, role="build", within=self.liveness_seconds)
            send = build_order(send, keys, sum(w.concurrency for w in builders))
        self._send(send)

    def _send(self, work: list[Requeue]) -> None:
        """Send work, keeping what the broker refused for the next loop: the trials are safe in the database."""
        work = self.unsent + work
        self.unsent = []
        if not work:
            return
        try:
            self.dispatch(work, self.pace.batch(len(work)))
            self.pace.sent(time.monotonic())
        except Exception as error:  # kombu raises several kinds when the broker is away
            self.unsent = work
            now = time.monotonic()
            if now - self.broker_warned > 30:
                self.broker_warned = now
                self.on_warning(f"the broker does not answer ({error}); {len(work)} trials will be sent when it does")

    def submit_all(self) -> None:
        """Write and send every proposal a static strategy has, then leave: the workers need no driver."""
        self.window = 1 << 30
        self._submit_baselines()
        self._fill()

    def _submit_baselines(self) -> None:
        if self.baselines:
            self._submit([(index, config, True) for index in range(len(self.problems)) for config in self.baselines])

    def _in_space(self, config: Config) -> bool:
        """Whether ``config`` is one the space holds: a value of each knob, and valid under its constraints."""
        values = all(config[knob.name] in knob.values for knob in self.space.knobs)
        return values and self.space.is_valid(config)

    def _fill(self, window: int | None = None) -> None:
        """Ask the searchers for proposals until ``window`` trials (default: the driver's window) are in flight."""
        if self.paused:
            return
        window = self.window if window is None else window
        # Cheap trials go out a message's worth at a time (or half the window, when that is less). Sending
        # whatever finished since the last look can split the window into ever smaller messages, and a message
        # costs the worker and the driver about what a cheap trial does.
        whole = min(MAX_BATCH, max(1, window // 2))
        if self.pace.cheap and not self.dynamic and self._live() and window - self._live() < whole:
            return
        # A driver that takes a campaign over is proposed again what the campaign has already: those trials ended,
        # take no room in the window, and are passed straight through (a window's worth per look took 42 s to get
        # past 1,500 of them before the first new trial went out).
        while proposals := self._propose(window - self._live()):
            ended_before = len(self.counted)
            self._submit(proposals)
            if len(self.counted) - ended_before < len(proposals):
                return

    def _live(self) -> int:
        """Trials in flight that have not ended yet."""
        return len(self.in_flight) - len(self.counted)

    def _propose(self, room: int) -> list[tuple[int, Config, bool]]:
        """Up to ``room`` proposals of the searchers, each within its problem's budget."""
        proposals: list[tuple[int, Config, bool]] = []
        asking = True
        while asking and len(proposals) < room:
            asking = False
            for index, feed in enumerate(self.feeds):
                if len(proposals) >= room:
                    break
                config = feed.ask()
                if config is not None:
                    config = self.space.check(config)
                    if not self._within_budget(index, config):
                        feed.done = True  # the campaign's trials of this problem are its budget already
                        continue
                    proposals.append((index, config, False))
                    asking = True
        return proposals

    def _within_budget(self, index: int, config: Config) -> bool:
        """Whether proposing ``config`` for problem ``index`` keeps the campaign within its budget: it is a trial
        the campaign has already, or one more that the budget allows."""
        if self.budget is None:
            return True
        key = digest(config)
        if key in self.tried[index]:
            return True
        if self.searched[index] >= self.budget:
            return False
        self.tried[index].add(key)
        self.searched[index] += 1
        return True

    def _adopt_orphans(self) -> bool:
        """Wait for the trials an earlier driver sent that this one's searchers did not propose again (their
        results go to no searcher); False when there are none."""
        position = {problem_id: index for index, problem_id in enumerate(self.problems)}
        orphans = [(t, p) for t, p in self.store.unfinished_trials(self.campaign.id) if t not in self.in_flight]
        for trial_id, problem_id in orphans:
            self.in_flight[trial_id] = (position.get(problem_id, 0), 0)
        return bool(orphans)

    def _collect(self) -> list[TrialResult]:
        # The oldest in flight finish first; asking about all of a large window every poll costs too much.
        finished = self.store.results(sorted(self.in_flight)[:500])
        for result in finished:
            index, times = self.in_flight.pop(result.trial_id)
            if result.trial_id in self.counted:
                self.counted.discard(result.trial_id)
            else:
                self.finished += 1
            run = searched(result)
            self.feeds[index].inbox.extend([run] * times)
            self.latest = result.problem_id
            current = self.best.get(result.problem_id)
            if self.searchers[index].accepts(run) and (
                current is None
                or (result.objective > current.objective if self.maximize else result.objective < current.objective)  # type: ignore[operator]  # only results with an objective are compared
            ):
                self.best[result.problem_id] = result
        return finished

    def _check_workers(self, started: float, warned: list[float]) -> None:
        live = self.store.workers(target=self.campaign.target, role="eval", within=self.liveness_seconds)
        # Its share of them: with other campaigns on the target, it sees only its own trials finish.
        slots = max(1, sum(w.concurrency for w in live))
        self.pace.slots = max(0.01, slots * self.store.share(self.campaign.id, self.campaign.target))
        now = time.monotonic()
        if live:
            warned.clear()
            self.unheard = None
            return
        # Heartbeats are written to the database: after an outage every worker looks silent until its next one.
        # So a worker is missing only once it has been missing for as long as a heartbeat counts, seen from
        # after the store answered (``now`` is taken then).
        self.unheard = now if self.unheard is None else self.unheard
        heard_of = now - self.unheard <= self.liveness_seconds
        if not heard_of and now - started > 2 * self.heartbeat_seconds and (not warned or now - warned[-1] > 60):
            warned.append(now)
            self.on_warning(
                f"no worker is listening on eval.{self.campaign.target}: start one on a node of that target "
                f"with `fleet worker --target {self.campaign.target}`; trials wait in the queue until then"
            )

    def _steer(self) -> bool:
        """Act on the campaign's status; False when the campaign has ended (cancelled, or ended elsewhere)."""
        status = self.steering.check()
        if status == CampaignStatus.CANCELLED:
            # Trials written after the cancel (this driver had not yet seen it) end as well.
            self.store.cancel_trials(self.campaign.id)
            return False
        if status == CampaignStatus.PAUSED:
            self.paused = True
        elif status == CampaignStatus.RUNNING and self.paused:
            self.paused = False
            # Workers dropped the messages of trials that waited during the pause.
            self._send(self.store.pending(self.campaign.id))
        if self.window_for is not None:
            # A share of the target's slots is counted in messages: a cheap trial's message holds several.
            # Not for a dynamic search, whose window says how far ahead of its results it may run.
            batched = self.pace.cheap and not self.dynamic
            depth = self.pace.depth() if batched else SLOT_DEPTH
            self.window = max(1, self.window_for(depth)) * (MAX_BATCH if batched else 1)
        return status in DRIVEN

    def run(self) -> list[Summary]:
        """Drive the campaign to its end and return what it found per problem.

        A cancelled campaign stops at once and returns what it found so far; a paused one waits.
        """
        self.drive()
        return summarize(self.store, self.campaign, self.searchers)

    def drive(self) -> None:
        """Drive the campaign to its end, or until it is cancelled or let go: :meth:`run` without the summary,
        which ``fleet driver`` does not show (on a large database it costs tens of milliseconds a problem)."""
        with self.steering:
            self._drive()

    def _drive(self) -> None:
        if not self._steer():
            return
        if self.written:
            self._send(self.store.pending(self.campaign.id))  # jobs written with --no-send wait for their message
        self._submit_baselines()
        total = self.total()
        started = time.monotonic()
        last_check = 0.0
        warned: list[float] = []
        self._check_workers(started, warned)  # the evaluation slots, which the first trials sent depend on
        idle = 0
        while True:
            if self.steering.due() and not self._steer():
                return
            # Until the first trials say how long trials take, a few go out, one per message.
            self._fill(min(self.window, self.pace.probe) if self.pace.probing else None)
            ended = not self.in_flight and not self.unsent and all(feed.done or feed.blocked for feed in self.feeds)
            if ended and (self.paused or not self._adopt_orphans()):
                break
            finished = self._collect()
            now = time.monotonic()
            self.pace.finished(
                len(finished),
                now,
                evaluated=[r.eval_seconds for r in finished if r.eval_seconds is not None],
                compiled=[r.compile_seconds for r in finished if r.compile_seconds is not None],
            )
            if finished:
                self.on_progress(self.finished, total, self._overall_best())
                idle = 0
            else:
                idle += 1
            if now - last_check > self.heartbeat_seconds:
                last_check = now
                self._check_workers(started, warned)
                # Not to a queue that no one consumes: each pass would add a message to it.
                served = self.liveness_seconds
                stale = [] if self.paused else self.store.stale(self.requeue_seconds, self.campaign.id, served)
                self._send(self.store.reap(self.max_attempts) + stale)
            if self.pace.probing:
                time.sleep(self.poll_seconds)  # the first trials' pace is taken from when they are seen back
            elif idle:
                # Back off while nothing finishes: long measurements need no tight polling.
                time.sleep(min(0.5, self.poll_seconds * 2 ** min(idle - 1, 4)))
            elif len(self.in_flight) > 16:
                # A wide window has plenty queued: polling less often leaves the CPU to the workers.
                time.sleep(0.25)
        self.on_progress(self.finished, self.finished, self._overall_best())
        self.store.set_campaign_status(self.campaign.id, CampaignStatus.DONE)

    def _overall_best(self) -> TrialResult | None:
        """The best so far of the problem the latest result is of: a campaign's problems differ in size (n=512 and
        n=4096), so a best over all of them would only ever show the largest's, or the smallest's."""
        if len(self.problems) == 1:
            return next(iter(self.best.values()), None)
        return self.best.get(self.latest) if self.latest is not None else None


def _more_budget(strategy: dict[str, Any], more: int) -> dict[str, Any]:
    """``strategy`` with ``more`` trials to its budget, if it has one."""
    if not more or strategy.get("budget") is None:
        return strategy
    return {**strategy, "budget": int(strategy["budget"]) + more}
