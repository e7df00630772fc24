"""The store's contract, on both backends (SQLite file, real PostgreSQL): every test runs against each.

Leases are what make "nothing lost, nothing stuck" hold: a claim is a conditional update, only the lease
holder records, and the reaper gives back work whose lease expired. These tests drive those rules directly.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import event, func, select, text, update
from sqlalchemy.engine import Engine

from fleet.driving.campaign import Summary, summarize
from fleet.errors import NotFound, StoreError
from fleet.space import Space, digest
from fleet.spec.workloads import load_workload_spec
from fleet.store import (
    Artifact,
    Campaign,
    Machine,
    Measurement,
    NewTrial,
    Requeue,
    Store,
    Trial,
    TrialWork,
    Worker,
    utcnow,
)
from fleet.store._models import Base, Blob

T = TypeVar("T")

TARGET = "gfx90a:104"
DEVICE = "NVIDIA H100 80GB HBM3"
OTHER_TARGET = "sm_90"
LEASE = 60.0
MAX = 3


# -- helpers ----------------------------------------------------------------------------------------------


def make_problem(store: Store, n: int = 0, kind: str = "matmul") -> int:
    return store.add_problem(kind, {"m": 64, "n": n})


def make_campaign(
    store: Store, name: str = "c", target: str = TARGET, problem_ids: list[int] | None = None, **overrides: Any
) -> Campaign:
    definition: dict[str, Any] = {
        "name": name, "target": target,
        "problem_ids": problem_ids if problem_ids is not None else [make_problem(store)],
        "space": {"knobs": {"tile": [1, 2, 4]}}, "strategy": {"name": "grid"},
        "workload": {"kind": "command", "run": ["./k", "{tile}"]}, "options": {},
        "provenance": {"toolchain": "gcc 13"},
    }  # fmt: skip
    definition.update(overrides)
    return store.create_campaign(**definition)


def new_trial(problem_id: int, config: dict[str, Any], target: str = TARGET, **kw: Any) -> NewTrial:
    """A trial whose keys depend on problem, target and configuration only (like the driver's, minus workload)."""
    build_key = digest(["build", problem_id, target, config])
    measure_key = digest(["measure", problem_id, target, config])
    return NewTrial(problem_id, config, build_key, measure_key, **kw)


def add(store: Store, campaign: Campaign, *configs: dict[str, Any], problem_id: int | None = None) -> list[int]:
    """Add trials of ``campaign``'s first problem (or ``problem_id``); return their ids."""
    pid = problem_id if problem_id is not None else store.campaign_problems(campaign.id)[0].id
    created = store.add_trials(campaign.id, campaign.target, [new_trial(pid, c, campaign.target) for c in configs])
    return [trial_id for trial_id, _ in created]


def one_trial(store: Store, config: dict[str, Any] | None = None) -> int:
    campaign = make_campaign(store)
    return add(store, campaign, config or {"tile": 1})[0]


def compile_(store: Store, trial_id: int, worker: str = "builder", toolchain: str = "gcc 13") -> None:
    """new -> compiled, by a builder whose toolchain is ``toolchain``."""
    assert store.claim(trial_id, "compile", worker, LEASE, MAX) is not None
    assert store.mark_compiled(trial_id, worker, toolchain)


def measurement(objective: float, *, maximize: bool = False, valid: bool = True, name: str = "seconds",
                metrics: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "objective_name": name, "maximize": maximize, "objective": objective, "valid": valid,
        "samples": [objective, objective], "metrics": metrics or {}, "toolchain": "gcc 13", "node": "n1",
        "gpu": "0", "device_kind": DEVICE, "device": f"{DEVICE}, driver 550.54.15, CUDA 12.4", "worker": "eval-gpu0@n1",
    }  # fmt: skip


def evaluate(store: Store, trial_id: int, objective: float, *, state: str = "evaluated", **kw: Any) -> None:
    """new -> evaluated (or ``state``), with a measurement taken with gcc 13 on a ``DEVICE``."""
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "evaluator", LEASE, MAX, DEVICE) is not None
    assert store.record(trial_id, "evaluator", state=state, measurement=measurement(objective, **kw))


def expire_trial(store: Store, trial_id: int) -> None:
    with store.session() as session:
        session.execute(
            update(Trial).where(Trial.id == trial_id).values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )


def expire_artifact(store: Store, build_key: str) -> None:
    with store.session() as session:
        session.execute(
            update(Artifact)
            .where(Artifact.build_key == build_key)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )


def measurements(store: Store, trial_id: int | None = None) -> int:
    query = select(func.count()).select_from(Measurement)
    if trial_id is not None:
        query = query.where(Measurement.trial_id == trial_id)
    with store.session() as session:
        return session.scalar(query) or 0


def count(store: Store, model: type) -> int:
    with store.session() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def work_for(store: Store, config: dict[str, Any] | None = None) -> TrialWork:
    """A claimed compile of a fresh trial: what ``claim_build`` takes."""
    trial_id = one_trial(store, config)
    work = store.claim(trial_id, "compile", "builder", LEASE, MAX)
    assert work is not None
    return work


def race(n: int, fn: Callable[[int], T]) -> list[T]:
    """Run ``fn(0..n-1)`` in ``n`` threads released at once; return their results (re-raising any error)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def wait_until_blocked(store: Store, thread: threading.Thread) -> None:
    """Wait until ``thread``'s transaction waits for a lock this test holds."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and thread.is_alive():
        if store.dialect == "sqlite":
            time.sleep(0.5)  # its BEGIN IMMEDIATE waits on the write lock (busy_timeout)
            return
        with store.engine.connect() as connection:
            waiting = connection.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ))  # fmt: skip
        if waiting:
            return
        time.sleep(0.02)


@pytest.fixture
def fresh_url(store: Store, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty, never migrated database on the same backend as ``store``."""
    if store.dialect == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    return request.getfixturevalue("postgres_server").create_database(f"f{uuid.uuid4().hex[:12]}")


# -- schema and connection --------------------------------------------------------------------------------


def test_upgrade_is_idempotent_and_reaches_head(store: Store) -> None:
    assert store.upgrade() == store.head()
    assert store.upgrade() == store.head()
    assert store.revision() == store.head() != ""
    store.check()


def test_the_migrations_build_the_schema_the_models_describe(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with store.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_check_on_an_empty_database_says_to_run_fleet_db_upgrade(fresh_url: str) -> None:
    fresh = Store(fresh_url)
    try:
        assert fresh.revision() is None
        with pytest.raises(StoreError, match="fleet db upgrade"):
            fresh.check()
        fresh.upgrade()
        fresh.check()
    finally:
        fresh.close()


def test_using_a_database_that_was_never_upgraded_says_to_run_fleet_db_upgrade(fresh_url: str) -> None:
    # Workers do not call check(); their first write must still say what to do, not "does not answer".
    fresh = Store(fresh_url)
    try:
        with pytest.raises(StoreError, match="fleet db upgrade"):
            fresh.add_problem("conv", {"n": 1})
    finally:
        fresh.close()


@pytest.mark.parametrize("use", ["check", "upgrade", "add_problem", "campaigns"])
def test_a_postgres_server_that_does_not_answer_is_a_one_line_store_error(use: str) -> None:
    dead = Store("postgresql+psycopg2://fleet:secret@127.0.0.1:1/fleet")
    calls: dict[str, Callable[[], object]] = {
        "check": dead.check, "upgrade": dead.upgrade, "add_problem": lambda: dead.add_problem("k", {}),
        "campaigns": dead.campaigns,
    }  # fmt: skip
    try:
        with pytest.raises(StoreError) as raised:
            calls[use]()
    finally:
        dead.close()
    message = str(raised.value)
    assert "does not answer" in message
    assert "\n" not in message
    assert "secret" not in message  # the password is hidden


@pytest.mark.parametrize("url", ["", "not a url", "http://example.com/db", "mysql://u@h/db"])
def test_a_garbage_url_is_a_store_error(url: str) -> None:
    with pytest.raises(StoreError):
        Store(url)


@pytest.mark.parametrize("url", ["postgresql+nodriver://u@h/db", "postgresql+psycopg://u@h/db"])
def test_a_url_with_a_missing_driver_is_a_store_error(url: str) -> None:
    # postgresql+psycopg:// is SQLAlchemy's name for psycopg 3, which Fleet does not install.
    with pytest.raises(StoreError):
        Store(url)


# -- problems ---------------------------------------------------------------------------------------------


def test_add_problem_dedupes_by_kind_and_canonical_params(store: Store) -> None:
    first = store.add_problem("conv", {"n": 1, "c": 64, "k": 3})
    assert store.add_problem("conv", {"k": 3, "c": 64, "n": 1}) == first
    assert store.add_problem("matmul", {"n": 1, "c": 64, "k": 3}) != first
    assert store.add_problem("conv", {"n": 2, "c": 64, "k": 3}) != first
    assert store.problem(first).params == {"n": 1, "c": 64, "k": 3}
    assert len(store.find_problems()) == 3


def test_add_problem_adds_tags_without_duplicating(store: Store) -> None:
    problem = store.add_problem("conv", {"n": 1}, tags=["resnet", "fp16"])
    assert store.add_problem("conv", {"n": 1}, tags=["resnet", "bert"]) == problem
    assert store.tags(problem) == ["bert", "fp16", "resnet"]


def test_find_problems_by_kind_params_and_tag(store: Store) -> None:
    a = store.add_problem("conv", {"n": 1, "c": 64}, tags=["resnet"])
    b = store.add_problem("conv", {"n": 2, "c": 64}, tags=["resnet", "big"])
    c = store.add_problem("matmul", {"n": 1, "c": 64}, tags=["big"])
    ids = lambda problems: [p.id for p in problems]  # noqa: E731
    assert ids(store.find_problems(kind="conv")) == [a, b]
    assert ids(store.find_problems(params={"c": 64})) == [a, b, c]
    assert ids(store.find_problems(kind="conv", params={"n": 2})) == [b]
    assert ids(store.find_problems(tag="big")) == [b, c]
    assert ids(store.find_problems(kind="conv", tag="big")) == [b]
    assert store.find_problems(tag="nobody") == []


def test_a_missing_problem_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.problem(12345)


# -- blobs ------------------------------------------------------------------------------------------------


def test_blobs_are_content_addressed_and_stored_once(store: Store) -> None:
    data = b"\x00kernel\xff" * 100
    key = store.put_blob(data)
    assert store.put_blob(data) == key
    assert len(key) == 64
    assert store.get_blob(key) == data
    assert store.put_blob(b"other") != key
    assert count(store, Blob) == 2


def test_a_missing_blob_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_blob("0" * 64)


# -- campaigns --------------------------------------------------------------------------------------------


def test_create_campaign_and_find_it_by_name_and_id(store: Store) -> None:
    campaign = make_campaign(store, name="tune-conv")
    assert campaign.status == "running"
    assert store.campaign("tune-conv").id == campaign.id
    assert store.campaign(campaign.id).name == "tune-conv"
    assert store.campaign(str(campaign.id)).name == "tune-conv"
    assert [c.id for c in store.campaigns()] == [campaign.id]
    with pytest.raises(NotFound):
        store.campaign("nobody")
    with pytest.raises(NotFound):
        store.campaign(campaign.id + 100)


def test_resubmitting_the_same_definition_returns_the_same_campaign(store: Store) -> None:
    problem = make_problem(store)
    first = make_campaign(store, problem_ids=[problem])
    again = make_campaign(store, problem_ids=[problem], space={"knobs": {"tile": [1, 2, 4]}})
    assert again.id == first.id
    assert len(store.campaigns()) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"target": OTHER_TARGET},
        {"space": {"knobs": {"tile": [1, 2]}}},
        {"strategy": {"name": "random"}},
        {"workload": {"kind": "command", "run": ["./other"]}},
        {"provenance": {"toolchain": "gcc 14"}},
    ],
)
def test_another_definition_under_the_same_name_is_a_store_error(store: Store, change: dict[str, Any]) -> None:
    problem = make_problem(store)
    make_campaign(store, problem_ids=[problem])
    with pytest.raises(StoreError, match="another definition"):
        make_campaign(store, problem_ids=[problem], **change)


def test_another_problem_list_under_the_same_name_is_a_store_error(store: Store) -> None:
    make_campaign(store, problem_ids=[make_problem(store, 1)])
    with pytest.raises(StoreError, match="another definition"):
        make_campaign(store, problem_ids=[make_problem(store, 2)])


def test_racing_submissions_of_one_campaign_get_the_same_campaign(store: Store) -> None:
    # Not a raw IntegrityError on the unique name: the loser compares with the winner's campaign.
    problem = make_problem(store)
    for round_ in range(3):
        ids = race(6, lambda _, r=round_: make_campaign(store, name=f"same{r}", problem_ids=[problem]).id)
        assert len(set(ids)) == 1
    assert len(store.campaigns()) == 3


def test_campaign_problems_keep_their_order(store: Store) -> None:
    ids = [make_problem(store, n) for n in (5, 1, 3)]
    campaign = make_campaign(store, problem_ids=ids)
    assert [p.id for p in store.campaign_problems(campaign.id)] == ids


def test_set_campaign_status_finishes_it(store: Store) -> None:
    campaign = make_campaign(store)
    store.set_campaign_status(campaign.id, "done")
    done = store.campaign(campaign.id)
    assert done.status == "done"
    assert done.finished_at is not None


# -- trials -----------------------------------------------------------------------------------------------


def test_add_trials_creates_new_trials_in_order(store: Store) -> None:
    campaign = make_campaign(store)
    problem = store.campaign_problems(campaign.id)[0].id
    created = store.add_trials(campaign.id, TARGET, [new_trial(problem, {"tile": t}, seq=t) for t in (4, 1, 2)])
    assert [state for _, state in created] == ["new", "new", "new"]
    trials = {t.id: t for t in store.trials(campaign.id)}
    assert [trials[i].config for i, _ in created] == [{"tile": 4}, {"tile": 1}, {"tile": 2}]
    assert all(trials[i].queued_at is not None and trials[i].attempts == 0 for i, _ in created)
    assert store.trial_counts(campaign.id) == {"new": 3}


def test_adding_the_same_configs_again_returns_the_same_trials(store: Store) -> None:
    campaign = make_campaign(store)
    first = add(store, campaign, {"tile": 1, "unroll": True}, {"tile": 2, "unroll": False})
    evaluate(store, first[0], 1.0)
    again = store.add_trials(
        campaign.id, TARGET,
        [new_trial(store.campaign_problems(campaign.id)[0].id, c)
         for c in ({"tile": 2, "unroll": False}, {"unroll": True, "tile": 1})],
    )  # fmt: skip
    assert again == [(first[1], "new"), (first[0], "evaluated")]
    assert len(store.trials(campaign.id)) == 2


def test_trials_are_unique_per_campaign_problem_target_and_config(store: Store) -> None:
    p1, p2 = make_problem(store, 1), make_problem(store, 2)
    campaign = make_campaign(store, problem_ids=[p1, p2])
    config = {"tile": 1}
    created = store.add_trials(
        campaign.id, TARGET, [new_trial(p1, config), new_trial(p2, config), new_trial(p1, config)]
    )
    other_target = store.add_trials(campaign.id, OTHER_TARGET, [new_trial(p1, config, OTHER_TARGET)])
    other_campaign = make_campaign(store, name="c2", problem_ids=[p1])
    elsewhere = store.add_trials(other_campaign.id, TARGET, [new_trial(p1, {"tile": 2})])
    ids = [created[0][0], created[1][0], other_target[0][0], elsewhere[0][0]]
    assert created[0] == created[2]
    assert len(set(ids)) == 4
    assert len(store.trials(campaign.id)) == 3


def reuse_claim(store: Store, trial_id: int, toolchain: str = "gcc 13", device_kind: str | None = DEVICE) -> TrialWork:
    """Compile ``trial_id`` with ``toolchain`` and claim its evaluation on a device of ``device_kind``."""
    compile_(store, trial_id, toolchain=toolchain)
    work = store.claim(trial_id, "evaluate", "evaluator", LEASE, MAX, device_kind)
    assert work is not None
    return work


def test_an_already_measured_config_is_reused_by_another_campaign(store: Store) -> None:
    problem = make_problem(store)
    first = make_campaign(store, name="first", problem_ids=[problem])
    [measured] = add(store, first, {"tile": 2})
    evaluate(store, measured, 1.5, metrics={"gflops": 10.0})

    second = make_campaign(store, name="second", problem_ids=[problem])
    [(reused, state)] = store.add_trials(second.id, TARGET, [new_trial(problem, {"tile": 2})])
    assert state == "new"  # whether it is reused is for the workers to say: they know toolchain and device
    work = reuse_claim(store, reused)
    assert (work.reuse, work.reuse_valid, work.toolchain) == (measured, True, "gcc 13")
    assert store.record(reused, "evaluator", state="evaluated", source=work.reuse)

    trial = store.trial(reused)
    assert reused != measured
    assert trial.source_trial_id == measured
    assert trial.finished_at is not None
    assert measurements(store) == 1
    [result] = store.results([reused])
    assert (result.reused, result.objective, result.metrics, result.valid) == (True, 1.5, {"gflops": 10.0}, True)


@pytest.mark.parametrize(
    ("toolchain", "device_kind"), [("gcc 14", DEVICE), ("gcc 13", "NVIDIA A100-SXM4-80GB"), ("gcc 13", None)]
)
def test_a_measurement_of_another_toolchain_or_device_kind_is_not_reused(
    store: Store, toolchain: str, device_kind: str | None
) -> None:
    problem = make_problem(store)
    first = make_campaign(store, name="first", problem_ids=[problem])
    evaluate(store, add(store, first, {"tile": 2})[0], 1.5)
    second = make_campaign(store, name="second", problem_ids=[problem])
    [trial_id] = add(store, second, {"tile": 2})
    work = reuse_claim(store, trial_id, toolchain, device_kind)
    assert work.reuse is None
    assert store.trial(trial_id).toolchain == toolchain


def test_remeasure_measures_again_instead_of_reusing(store: Store) -> None:
    problem = make_problem(store)
    first = make_campaign(store, name="first", problem_ids=[problem])
    evaluate(store, add(store, first, {"tile": 2})[0], 1.5)
    # A campaign whose options say so (fleet tune --remeasure) ...
    second = make_campaign(store, name="second", problem_ids=[problem], options={"remeasure": True})
    [trial_id] = add(store, second, {"tile": 2})
    assert reuse_claim(store, trial_id).reuse is None
    # ... or one trial created to be measured again (fleet call --remeasure), beside one that is not.
    third = make_campaign(store, name="third", problem_ids=[problem])
    [(again, _)] = store.add_trials(third.id, TARGET, [new_trial(problem, {"tile": 2})], remeasure=True)
    assert store.trial(again).remeasure
    assert reuse_claim(store, again).reuse is None
    fourth = make_campaign(store, name="fourth", problem_ids=[problem])
    [reused] = add(store, fourth, {"tile": 2})
    assert reuse_claim(store, reused).reuse is not None


def test_a_trial_without_a_measurement_is_not_reused(store: Store) -> None:
    problem = make_problem(store)
    first = make_campaign(store, name="first", problem_ids=[problem])
    [errored] = add(store, first, {"tile": 2})
    compile_(store, errored)
    assert store.claim(errored, "evaluate", "w", LEASE, MAX) is not None
    assert store.record(errored, "w", state="errored", reason="crashed")
    add(store, first, {"tile": 4})  # not measured yet
    second = make_campaign(store, name="second", problem_ids=[problem])
    again, later = add(store, second, {"tile": 2}, {"tile": 4})
    assert reuse_claim(store, again).reuse is None
    assert reuse_claim(store, later).reuse is None


def test_a_missing_trial_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.trial(12345)


# -- claims, leases and records ---------------------------------------------------------------------------


def test_claim_compile_works_only_from_new(store: Store) -> None:
    trial_id = one_trial(store)
    work = store.claim(trial_id, "compile", "a", LEASE, MAX)
    assert work is not None
    # No toolchain yet: the builder's own is recorded when the trial is compiled.
    assert (work.trial_id, work.config, work.target, work.toolchain) == (trial_id, {"tile": 1}, TARGET, "")
    assert work.problem_kind == "matmul"
    trial = store.trial(trial_id)
    assert (trial.state, trial.worker, trial.attempts) == ("compiling", "a", 0)
    assert trial.started_at is not None and trial.lease_expires_at is not None
    assert store.mark_compiled(trial_id, "a", "gcc 14.2.0")
    assert store.claim(trial_id, "compile", "b", LEASE, MAX) is None  # compiled: not compile work any more
    assert (store.trial(trial_id).state, store.trial(trial_id).toolchain) == ("compiled", "gcc 14.2.0")
    work = store.claim(trial_id, "evaluate", "e", LEASE, MAX)
    assert work is not None and work.toolchain == "gcc 14.2.0"


def test_claim_evaluate_works_only_from_compiled(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is None  # still new
    compile_(store, trial_id)
    work = store.claim(trial_id, "evaluate", "e", LEASE, MAX)
    assert work is not None and work.attempts == 1
    assert store.trial(trial_id).state == "evaluating"


def test_an_evaluation_claim_carries_its_own_trials_artifact(store: Store) -> None:
    campaign = make_campaign(store)
    trial_ids = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 4})
    digests = {}
    for n, trial_id in enumerate(trial_ids):
        start = store.start_compile(trial_id, "b", LEASE, MAX)
        assert start.outcome == "claimed" and start.work is not None
        data = b"binary %d" % n
        assert store.finish_build(start.work.build_key, "b", data=data, trial_id=trial_id)
        digests[trial_id] = hashlib.sha256(data).hexdigest()
    for trial_id in reversed(trial_ids):
        work = store.claim(trial_id, "evaluate", "e", LEASE, MAX)
        assert work is not None and work.artifact_digest == digests[trial_id]


@pytest.mark.parametrize("toolchain", ["gcc 13", None])
def test_a_compile_claim_creates_its_artifact_with_the_build_time_knobs(store: Store, toolchain: str | None) -> None:
    """With the toolchain the builder found for the campaign (None: no toolchain map, an empty toolchain)."""
    space = {
        "knobs": {
            "tile": {"values": [1, 2], "build": True},
            "n": {"values": [64, 128], "build": False},
            "unroll": [1, 2],  # a bare list of values: a build-time knob
            "vector": {"values": [False, True]},
        }
    }
    campaign = make_campaign(store, space=space, provenance={})
    (trial_id,) = add(store, campaign, {"tile": 2, "n": 64, "unroll": 1, "vector": False, "stray": "x"})
    start = store.start_compile(trial_id, "b", LEASE, MAX, None if toolchain is None else {campaign.id: toolchain})
    assert start.outcome == "claimed" and start.work is not None
    stored = store.artifact(start.work.build_key)
    assert stored is not None
    assert stored.build_config == {"tile": 2, "unroll": 1, "vector": False}
    assert (stored.toolchain, stored.state, stored.worker, stored.attempts) == (toolchain or "", "building", "b", 1)
    assert stored.lease_expires_at is not None and stored.lease_expires_at > utcnow()
    claimed = start.artifact  # what the compile task goes on with is the row it created
    assert (claimed.build_key, claimed.state, claimed.worker) == (stored.build_key, "building", "b")
    assert claimed.build_config == stored.build_config


def test_a_compile_claim_of_a_campaign_the_builder_has_not_met_leaves_the_artifact_to_it(store: Store) -> None:
    """The toolchain is the builder's, found from the claimed trial's workload: the claim cannot name it."""
    campaign = make_campaign(store)
    (trial_id,) = add(store, campaign, {"tile": 2})
    start = store.start_compile(trial_id, "b", LEASE, MAX, {campaign.id + 1: "gcc 13"})
    assert start.outcome == "claimed" and start.work is not None and start.artifact is None
    assert store.artifact(start.work.build_key) is None
    artifact = store.claim_build(start.work, "b", LEASE, MAX, "clang 19")
    assert (artifact.toolchain, artifact.state, artifact.worker) == ("clang 19", "building", "b")


def test_two_toolchains_build_a_key_twice_and_each_evaluation_takes_its_own(store: Store) -> None:
    campaign = make_campaign(store)
    old, new = add(store, campaign, {"tile": 2}, {"tile": 4})
    with store.session() as session:  # two configurations of one build: only run-time knobs differ
        session.execute(update(Trial).where(Trial.id == new).values(build_key=store.trial(old).build_key))
    for trial_id, toolchain in ((old, "gcc 12.2.0"), (new, "gcc 14.2.0")):
        start = store.start_compile(trial_id, toolchain, LEASE, MAX, {campaign.id: toolchain})
        assert start.outcome == "claimed" and start.work is not None
        assert (start.artifact.toolchain, start.artifact.worker) == (toolchain, toolchain)  # not the other's
        data = toolchain.encode()
        assert store.finish_build(start.work.build_key, toolchain, data=data, trial_id=trial_id, toolchain=toolchain)
    build_key = store.trial(old).build_key
    assert sorted(a.toolchain for a in store.artifacts(build_key)) == ["gcc 12.2.0", "gcc 14.2.0"]
    for trial_id, toolchain in ((old, "gcc 12.2.0"), (new, "gcc 14.2.0")):
        work = store.claim(trial_id, "evaluate", "e", LEASE, MAX, DEVICE)
        assert work is not None and work.toolchain == toolchain
        data = toolchain.encode()
        assert (work.artifact_digest, work.artifact_data) == (hashlib.sha256(data).hexdigest(), data)
        assert store.trial_detail(trial_id).artifact.toolchain == toolchain
    # A third builder of the same toolchain finds that artifact built: no build of its own.
    (again,) = add(store, make_campaign(store, name="again"), {"tile": 2})
    with store.session() as session:
        session.execute(update(Trial).where(Trial.id == again).values(build_key=build_key))
    assert store.start_compile(again, "b3", LEASE, MAX, {store.trial(again).campaign_id: "gcc 14.2.0"}).outcome == (
        "compiled"
    )
    assert store.trial(again).toolchain == "gcc 14.2.0"


def test_a_second_claim_while_the_lease_is_live_gets_nothing(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "compile", "a", LEASE, MAX) is not None
    assert store.claim(trial_id, "compile", "b", LEASE, MAX) is None
    assert store.claim(trial_id, "compile", "a", LEASE, MAX) is None  # a duplicate delivery to the holder too
    assert store.trial(trial_id).worker == "a"


def test_another_worker_can_claim_after_the_lease_expires(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "compile", "a", 0.05, MAX) is not None
    time.sleep(0.1)
    assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
    assert store.trial(trial_id).worker == "b"
    assert not store.mark_compiled(trial_id, "a")
    assert store.mark_compiled(trial_id, "b")


def test_only_one_of_many_racing_claims_wins(store: Store) -> None:
    trial_id = one_trial(store)
    won = race(8, lambda i: store.claim(trial_id, "compile", f"w{i}", LEASE, MAX))
    winners = [i for i, work in enumerate(won) if work is not None]
    assert len(winners) == 1
    assert store.trial(trial_id).worker == f"w{winners[0]}"


def test_evaluate_claims_count_attempts_and_stop_at_max_attempts(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    for attempt in range(1, MAX + 1):
        work = store.claim(trial_id, "evaluate", f"e{attempt}", LEASE, MAX)
        assert work is not None and work.attempts == attempt
        expire_trial(store, trial_id)
    assert store.claim(trial_id, "evaluate", "late", LEASE, MAX) is None
    trial = store.trial(trial_id)
    assert (trial.attempts, trial.worker) == (MAX, f"e{MAX}")


def test_renew_extends_the_holders_lease_only(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "compile", "a", 1.0, MAX) is not None
    before = store.trial(trial_id).lease_expires_at
    assert store.renew(trial_id, "a", LEASE)
    assert store.trial(trial_id).lease_expires_at > before
    assert not store.renew(trial_id, "b", LEASE)


def test_renew_is_false_for_a_worker_that_lost_the_trial(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "compile", "a", LEASE, MAX) is not None
    expire_trial(store, trial_id)
    assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
    assert not store.renew(trial_id, "a", LEASE)
    assert store.renew(trial_id, "b", LEASE)
    assert store.mark_compiled(trial_id, "b")
    assert not store.renew(trial_id, "b", LEASE)  # nothing to hold once compiled


def test_record_by_the_holder_writes_state_and_measurement_together(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    assert store.record(trial_id, "e", measurement=measurement(2.5, metrics={"gflops": 3.0}),
                        stdout_tail="out", stderr_tail="err")  # fmt: skip
    trial = store.trial(trial_id)
    assert (trial.state, trial.lease_expires_at, trial.stdout_tail, trial.stderr_tail) == (
        "evaluated", None, "out", "err")  # fmt: skip
    assert trial.finished_at is not None
    with store.session() as session:
        m = session.scalar(select(Measurement).where(Measurement.trial_id == trial_id))
        assert m is not None
        assert (m.problem_id, m.target, m.measure_key) == (trial.problem_id, TARGET, trial.measure_key)
        assert (m.objective, m.samples, m.metrics, m.valid) == (2.5, [2.5, 2.5], {"gflops": 3.0}, True)


def test_a_measurement_that_leaves_fields_out_gets_the_models_defaults(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    bare = {"objective_name": "ms", "objective": 1.5, "samples": [1.5], "metrics": {}}
    assert store.record(trial_id, "e", measurement=bare)
    with store.session() as session:
        m = session.scalar(select(Measurement).where(Measurement.trial_id == trial_id))
        assert m is not None
        assert (m.objective, m.maximize, m.valid, m.toolchain, m.node, m.gpu, m.worker) == (
            1.5, False, True, "", None, None, None)  # fmt: skip


def test_record_by_a_worker_that_lost_the_lease_writes_nothing(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "a", LEASE, MAX) is not None
    expire_trial(store, trial_id)
    assert store.claim(trial_id, "evaluate", "b", LEASE, MAX) is not None

    assert not store.record(trial_id, "a", measurement=measurement(1.0), stdout_tail="from a")

    trial = store.trial(trial_id)
    assert (trial.state, trial.worker, trial.stdout_tail, trial.finished_at) == ("evaluating", "b", None, None)
    assert measurements(store) == 0
    assert store.record(trial_id, "b", measurement=measurement(2.0))
    assert [r.objective for r in store.results([trial_id])] == [2.0]


def test_record_after_the_reaper_took_the_trial_back_writes_nothing(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "a", LEASE, MAX) is not None
    expire_trial(store, trial_id)
    assert store.reap(MAX) == [Requeue(trial_id, TARGET, "evaluate")]
    assert not store.record(trial_id, "a", measurement=measurement(1.0))
    assert store.trial(trial_id).state == "compiled"
    assert measurements(store) == 0


def test_recording_twice_keeps_one_measurement(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    assert store.record(trial_id, "e", measurement=measurement(1.0))
    assert not store.record(trial_id, "e", measurement=measurement(9.0))
    assert not store.record(trial_id, "e", state="errored", reason="late duplicate")
    trial = store.trial(trial_id)
    assert (trial.state, trial.reason) == ("evaluated", None)
    assert measurements(store, trial_id) == 1
    assert [r.objective for r in store.results([trial_id])] == [1.0]


def test_record_errored_keeps_the_reason_and_no_measurement(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
    assert store.record(trial_id, "b", state="errored", reason="build failed: boom")
    trial = store.trial(trial_id)
    assert (trial.state, trial.reason) == ("errored", "build failed: boom")
    assert measurements(store) == 0


def test_fail_waiting_errors_only_unheld_trials(store: Store) -> None:
    campaign = make_campaign(store)
    waiting, held = add(store, campaign, {"tile": 1}, {"tile": 2})
    assert store.claim(held, "compile", "b", LEASE, MAX) is not None
    assert store.fail_waiting(waiting, "its build failed")
    assert not store.fail_waiting(held, "its build failed")
    assert store.trial(waiting).state == "errored"
    assert store.trial(held).state == "compiling"


def test_the_hot_path_runs_prepared_statements_on_postgresql(postgres_server: Any) -> None:
    store = Store(postgres_server.create_database(f"p{uuid.uuid4().hex[:12]}"), durable=False)
    try:
        store.upgrade()
        first, second = add(store, make_campaign(store), {"tile": 1}, {"tile": 2})
        assert store.start_compile(first, "builder", LEASE, MAX).outcome == "claimed"
        with store._steps() as connection:  # the connection the hot path holds
            names = set(connection.scalars(text("SELECT name FROM pg_prepared_statements")))
            assert "fleet_claim_and_create" in names
            # What a transaction-pooling PgBouncer does: the next statement meets a backend that never saw them.
            connection.exec_driver_sql("DEALLOCATE ALL")
        start = store.start_compile(second, "builder", LEASE, MAX)
        assert start.outcome == "claimed" and start.work is not None and start.work.config == {"tile": 2}
        assert store.trial(second).state == "compiling"
        assert not store._prepared  # the store now sends its statements as text
        assert store.finish_build(start.work.build_key, "builder", data=b"k", trial_id=second)
        assert store.trial(second).state == "compiled"
    finally:
        store.close()


def test_a_forked_process_never_uses_the_connection_its_parent_holds(postgres_server: Any) -> None:
    store = Store(postgres_server.create_database(f"p{uuid.uuid4().hex[:12]}"), durable=False)
    try:
        store.upgrade()
        first, second, third = add(store, make_campaign(store), *({"tile": t} for t in (1, 2, 4)))
        assert store.start_compile(first, "parent", LEASE, MAX).outcome == "claimed"
        with store._steps() as connection:
            parent_backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        pid = os.fork()
        if pid == 0:  # the child: what a worker pool's process does with a store it inherited
            code = 1
            try:
                with store._steps() as connection:
                    child_backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
                claimed = store.start_compile(second, "child", LEASE, MAX).outcome == "claimed"
                code = 0 if claimed and child_backend != parent_backend else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store.start_compile(third, "parent", LEASE, MAX).outcome == "claimed"  # its connection still works
        with store._steps() as connection:
            assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar() == parent_backend
    finally:
        store.close()


def test_a_hot_path_connection_the_server_dropped_fails_one_call_then_is_replaced(
    postgres_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(postgres_server.create_database(f"p{uuid.uuid4().hex[:12]}"), durable=False)
    try:
        store.upgrade()
        first, second = add(store, make_campaign(store), {"tile": 1}, {"tile": 2})
        assert store.start_compile(first, "builder", LEASE, MAX).outcome == "claimed"
        with store.engine.connect() as connection:  # what a restarted server or a cut network does
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        with pytest.raises(StoreError, match="does not answer") as raised:
            store.start_compile(second, "builder", LEASE, MAX)
        assert "\n" not in str(raised.value)
        assert "Exception during reset" not in caplog.text  # thrown away, not handed back to the pool
        assert store.trial(second).state == "new"
        start = store.start_compile(second, "builder", LEASE, MAX)  # on a new connection, prepared again
        assert start.outcome == "claimed" and start.work is not None and start.work.config == {"tile": 2}
        assert store._prepared  # a dead connection is not a server that forgets prepared statements
    finally:
        store.close()


# -- the reaper -------------------------------------------------------------------------------------------


def test_reap_gives_an_expired_evaluation_back_as_compiled(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    expire_trial(store, trial_id)
    assert store.reap(MAX) == [Requeue(trial_id, TARGET, "evaluate")]
    trial = store.trial(trial_id)
    assert (trial.state, trial.worker, trial.lease_expires_at, trial.attempts) == ("compiled", None, None, 1)
    assert store.claim(trial_id, "evaluate", "e2", LEASE, MAX) is not None


def test_reap_gives_an_expired_compile_back_as_new(store: Store) -> None:
    trial_id = one_trial(store)
    assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
    expire_trial(store, trial_id)
    assert store.reap(MAX) == [Requeue(trial_id, TARGET, "compile")]
    trial = store.trial(trial_id)
    assert (trial.state, trial.worker, trial.lease_expires_at) == ("new", None, None)
    assert store.claim(trial_id, "compile", "b2", LEASE, MAX) is not None


def test_reap_errors_an_evaluation_that_lost_its_worker_max_attempts_times(store: Store) -> None:
    trial_id = one_trial(store)
    compile_(store, trial_id)
    for _ in range(MAX - 1):
        assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
        expire_trial(store, trial_id)
        assert store.reap(MAX) == [Requeue(trial_id, TARGET, "evaluate")]
    assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    expire_trial(store, trial_id)
    assert store.reap(MAX) == []
    trial = store.trial(trial_id)
    assert trial.state == "errored"
    assert "lost its worker" in (trial.reason or "")
    assert trial.finished_at is not None and trial.lease_expires_at is None
    assert not store.record(trial_id, "e", measurement=measurement(1.0))
    assert measurements(store) == 0


def test_reap_errors_a_compiled_trial_whose_attempts_ran_out_while_it_waited(store: Store) -> None:
    campaign = make_campaign(store)
    used_up, fresh = add(store, campaign, {"tile": 1}, {"tile": 2})
    compile_(store, used_up)
    compile_(store, fresh)
    with store.session() as session:  # lost its last worker, and its evaluate message was lost as well
        session.execute(update(Trial).where(Trial.id == used_up).values(attempts=MAX))
    assert store.reap(MAX) == []
    trial = store.trial(used_up)
    assert (trial.state, trial.finished_at is not None) == ("errored", True)
    assert "lost its worker" in (trial.reason or "")
    assert store.trial(fresh).state == "compiled"


def test_reap_leaves_live_leases_and_waiting_trials_alone(store: Store) -> None:
    campaign = make_campaign(store)
    compiling, evaluating, waiting = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 4})
    assert store.claim(compiling, "compile", "b", LEASE, MAX) is not None
    compile_(store, evaluating)
    assert store.claim(evaluating, "evaluate", "e", LEASE, MAX) is not None
    assert store.reap(MAX) == []
    assert [store.trial(t).state for t in (compiling, evaluating, waiting)] == ["compiling", "evaluating", "new"]
    assert store.record(evaluating, "e", measurement=measurement(1.0))


def test_two_reapers_return_each_trial_once(store: Store) -> None:
    campaign = make_campaign(store)
    ids = add(store, campaign, *({"tile": t} for t in range(6)))
    for trial_id in ids[:3]:
        compile_(store, trial_id)
        assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    for trial_id in ids[3:]:
        assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
    for trial_id in ids:
        expire_trial(store, trial_id)
    first, second = store.reap(MAX), store.reap(MAX)
    assert second == []
    assert sorted((r.trial_id, r.task) for r in first) == sorted(
        [(t, "evaluate") for t in ids[:3]] + [(t, "compile") for t in ids[3:]]
    )


def test_racing_reapers_return_each_trial_once_in_total(store: Store) -> None:
    campaign = make_campaign(store)
    ids = add(store, campaign, *({"tile": t} for t in range(20)))
    for trial_id in ids:
        compile_(store, trial_id)
        assert store.claim(trial_id, "evaluate", "e", LEASE, MAX) is not None
    with store.session() as session:
        session.execute(update(Trial).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    reaped = race(4, lambda _: store.reap(MAX))
    returned = sorted(r.trial_id for batch in reaped for r in batch)
    assert returned == sorted(ids)
    assert store.trial_counts(campaign.id) == {"compiled": 20}


# -- stale messages ---------------------------------------------------------------------------------------


def test_stale_returns_old_waiting_trials_once_and_refreshes_them(store: Store) -> None:
    campaign = make_campaign(store)
    new, compiled, fresh, running = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 4}, {"tile": 8})
    compile_(store, compiled)
    assert store.claim(running, "compile", "b", LEASE, MAX) is not None
    with store.session() as session:
        session.execute(
            update(Trial).where(Trial.id.in_([new, compiled, running]))
            .values(queued_at=utcnow() - timedelta(hours=1))
        )  # fmt: skip
    before = store.trial(new).queued_at

    assert sorted(store.stale(60), key=lambda r: r.trial_id) == [
        Requeue(new, TARGET, "compile"), Requeue(compiled, TARGET, "evaluate")]  # fmt: skip
    assert store.stale(60) == []
    assert store.trial(new).queued_at > before
    assert store.trial(fresh).state == "new"


def test_a_stale_call_that_loses_a_race_returns_nothing(store: Store) -> None:
    # Every worker's heartbeat calls stale(): the UPDATE must re-check queued_at, not only the SELECT.
    campaign = make_campaign(store)
    ids = add(store, campaign, {"tile": 1}, {"tile": 2})
    with store.session() as session:
        session.execute(update(Trial).values(queued_at=utcnow() - timedelta(hours=1)))
    got: list[Requeue] = []
    with store.session() as session:  # another stale() that refreshed them first and has yet to commit
        session.execute(update(Trial).where(Trial.id.in_(ids)).values(queued_at=utcnow()))
        thread = threading.Thread(target=lambda: got.extend(store.stale(60)))
        thread.start()
        wait_until_blocked(store, thread)
    thread.join(30)
    assert got == []


def test_racing_stale_calls_return_each_trial_once_in_total(store: Store) -> None:
    campaign = make_campaign(store)
    ids = add(store, campaign, *({"tile": t} for t in range(100)))
    with store.session() as session:
        session.execute(update(Trial).values(queued_at=utcnow() - timedelta(hours=1)))
    returned = sorted(r.trial_id for batch in race(8, lambda _: store.stale(60)) for r in batch)
    assert returned == sorted(ids)


def test_pending_lists_a_campaigns_waiting_trials(store: Store) -> None:
    campaign = make_campaign(store)
    new, compiled, done = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 4})
    compile_(store, compiled)
    evaluate(store, done, 1.0)
    assert store.pending(campaign.id) == [Requeue(new, TARGET, "compile"), Requeue(compiled, TARGET, "evaluate")]


# -- artifacts --------------------------------------------------------------------------------------------


def test_the_first_claim_build_owns_the_build(store: Store) -> None:
    work = work_for(store)
    artifact = store.claim_build(work, "a", LEASE, MAX, "gcc 13")
    assert (artifact.state, artifact.worker, artifact.attempts) == ("building", "a", 1)
    assert (artifact.build_key, artifact.target, artifact.toolchain) == (work.build_key, TARGET, "gcc 13")


def test_a_second_claim_build_sees_it_building_by_another(store: Store) -> None:
    work = work_for(store)
    store.claim_build(work, "a", LEASE, MAX)
    artifact = store.claim_build(work, "b", LEASE, MAX)
    assert (artifact.state, artifact.worker, artifact.attempts) == ("building", "a", 1)


def test_claim_build_takes_over_after_the_lease_expires(store: Store) -> None:
    work = work_for(store)
    store.claim_build(work, "a", LEASE, MAX)
    expire_artifact(store, work.build_key)
    artifact = store.claim_build(work, "b", LEASE, MAX)
    assert (artifact.state, artifact.worker, artifact.attempts) == ("building", "b", 2)
    assert not store.finish_build(work.build_key, "a", data=b"late")
    assert store.artifact(work.build_key).worker == "b"


def test_renew_extends_the_artifact_lease_of_its_builder(store: Store) -> None:
    work = work_for(store)
    store.claim_build(work, "builder", 1.0, MAX)
    before = store.artifact(work.build_key).lease_expires_at
    assert store.renew(work.trial_id, "builder", LEASE, work.build_key)
    assert store.artifact(work.build_key).lease_expires_at > before


def test_a_build_lost_max_attempts_times_fails(store: Store) -> None:
    work = work_for(store)
    for attempt in range(1, MAX + 1):
        artifact = store.claim_build(work, f"w{attempt}", LEASE, MAX)
        assert (artifact.state, artifact.worker, artifact.attempts) == ("building", f"w{attempt}", attempt)
        expire_artifact(store, work.build_key)
    artifact = store.claim_build(work, "last", LEASE, MAX)
    assert artifact.state == "failed"
    assert str(MAX) in (artifact.reason or "")


def test_only_one_of_many_racing_builders_owns_the_build(store: Store) -> None:
    work = work_for(store)
    artifacts = race(8, lambda i: store.claim_build(work, f"w{i}", LEASE, MAX))
    assert len({(a.worker, a.attempts, a.state) for a in artifacts}) == 1
    assert artifacts[0].state == "building"
    assert count(store, Artifact) == 1


def test_finish_build_by_the_owner_stores_the_artifact(store: Store) -> None:
    work = work_for(store)
    store.claim_build(work, "a", LEASE, MAX)
    assert store.finish_build(work.build_key, "a", data=b"ELF...", log_tail="ok", seconds=1.5)
    artifact = store.artifact(work.build_key)
    assert (artifact.state, artifact.build_seconds, artifact.log_tail) == ("built", 1.5, "ok")
    assert artifact.blob_digest is not None
    assert store.get_blob(artifact.blob_digest) == b"ELF..."
    assert artifact.built_at is not None and artifact.lease_expires_at is None
    assert store.claim_build(work, "b", LEASE, MAX).state == "built"
    assert not store.finish_build(work.build_key, "a", data=b"again")


def test_finish_build_without_data_fails_it_with_the_reason(store: Store) -> None:
    work = work_for(store)
    store.claim_build(work, "a", LEASE, MAX)
    assert store.finish_build(work.build_key, "a", data=None, reason="gcc: error", log_tail="line 3")
    artifact = store.artifact(work.build_key)
    assert (artifact.state, artifact.reason, artifact.blob_digest) == ("failed", "gcc: error", None)
    assert store.claim_build(work, "b", LEASE, MAX).state == "failed"


def test_finish_build_by_a_non_owner_is_refused(store: Store) -> None:
    work = work_for(store)
    store.claim_build(work, "a", LEASE, MAX)
    assert not store.finish_build(work.build_key, "b", data=b"x")
    assert store.artifact(work.build_key).state == "building"


def shared_build(store: Store, trials: int = 3) -> tuple[TrialWork, list[int]]:
    """A build claimed by "builder" for the first of ``trials`` trials of one build key; the others, each
    claimed for compile by a worker of its own ("w1", "w2", ...)."""
    campaign = make_campaign(store)
    pid = store.campaign_problems(campaign.id)[0].id
    key = digest(["build", pid, "shared"])
    created = store.add_trials(
        campaign.id,
        TARGET,
        [NewTrial(pid, {"tile": t}, key, digest(["measure", t])) for t in range(trials)],
    )
    ids = [trial_id for trial_id, _ in created]
    work = store.claim(ids[0], "compile", "builder", LEASE, MAX)
    assert work is not None
    store.claim_build(work, "builder", LEASE, MAX, "gcc 13")
    for n, other in enumerate(ids[1:], 1):
        assert store.claim(other, "compile", f"w{n}", LEASE, MAX) is not None
    return work, ids[1:]


def test_a_compile_handed_to_the_running_build_is_compiled_when_it_ends(store: Store) -> None:
    work, (first, second) = shared_build(store)
    assert store.hand_to_builder(first, "w1", work.build_key, "gcc 13", "builder", LEASE)
    assert store.hand_to_builder(second, "w2", work.build_key, "gcc 13", "builder", LEASE)
    assert store.trial(first).worker == "builder"
    assert not store.mark_compiled(first, "w1")  # no longer w1's

    handed: list[int] = []
    done = store.finish_build(
        work.build_key, "builder", data=b"ELF", trial_id=work.trial_id, toolchain="gcc 13", handed=handed
    )
    assert done and handed == [first, second]
    for trial_id in (work.trial_id, first, second):
        trial = store.trial(trial_id)
        assert (trial.state, trial.worker, trial.toolchain) == ("compiled", None, "gcc 13")


def test_a_build_whose_caller_sends_no_evaluations_leaves_its_handed_compiles_to_their_lease(store: Store) -> None:
    work, (first, _) = shared_build(store)
    assert store.hand_to_builder(first, "w1", work.build_key, "gcc 13", "builder", LEASE)
    assert store.finish_build(work.build_key, "builder", data=b"ELF", trial_id=work.trial_id, toolchain="gcc 13")
    assert (store.trial(first).state, store.trial(first).worker) == ("compiling", "builder")


def test_a_compile_is_not_handed_to_a_build_that_is_not_running(store: Store) -> None:
    work, (first, second) = shared_build(store)
    assert not store.hand_to_builder(first, "w1", work.build_key, "gcc 13", "someone else", LEASE)
    assert not store.hand_to_builder(first, "w1", work.build_key, "clang 18", "builder", LEASE)  # another artifact
    assert not store.hand_to_builder(first, "w2", work.build_key, "gcc 13", "builder", LEASE)  # not w2's trial
    assert store.finish_build(work.build_key, "builder", data=b"ELF", trial_id=work.trial_id, toolchain="gcc 13")
    assert not store.hand_to_builder(second, "w2", work.build_key, "gcc 13", "builder", LEASE)
    assert {store.trial(first).worker, store.trial(second).worker} == {"w1", "w2"}


def test_a_handed_compile_is_taken_back_only_while_the_build_has_not_ended_it(store: Store) -> None:
    work, (first, second) = shared_build(store)
    for trial_id, worker in ((first, "w1"), (second, "w2")):
        assert store.hand_to_builder(trial_id, worker, work.build_key, "gcc 13", "builder", LEASE)
    assert store.take_back(first, "w1", "builder", LEASE)
    assert store.trial(first).worker == "w1"
    handed: list[int] = []
    store.finish_build(
        work.build_key, "builder", data=b"ELF", trial_id=work.trial_id, toolchain="gcc 13", handed=handed
    )
    assert handed == [second]
    assert not store.take_back(second, "w2", "builder", LEASE)


def test_a_failed_build_leaves_its_handed_compiles_to_its_builder_to_record(store: Store) -> None:
    work, (first,) = shared_build(store, trials=2)
    assert store.hand_to_builder(first, "w1", work.build_key, "gcc 13", "builder", LEASE)
    assert store.finish_build(work.build_key, "builder", data=None, reason="gcc: error", toolchain="gcc 13")
    assert store.handed_trials(work.trial_id, work.build_key, "builder") == [first]
    assert store.record(first, "builder", state="errored", reason="build failed: gcc: error")
    assert store.trial(first).state == "errored"


def test_the_builders_renewal_holds_its_handed_compiles_and_its_death_gives_them_back(store: Store) -> None:
    work, (first,) = shared_build(store, trials=2)
    assert store.hand_to_builder(first, "w1", work.build_key, "gcc 13", "builder", 1.0)
    before = store.trial(first).lease_expires_at
    assert store.renew(work.trial_id, "builder", LEASE, work.build_key)
    assert store.trial(first).lease_expires_at > before

    expire_trial(store, first)  # the builder died: nobody renews it
    assert Requeue(first, TARGET, "compile") in store.reap(MAX)
    assert (store.trial(first).state, store.trial(first).worker) == ("new", None)


def test_a_missing_artifact_is_none(store: Store) -> None:
    assert store.artifact("0" * 64) is None


# -- machines and workers ---------------------------------------------------------------------------------


def register(store: Store, name: str, hostname: str = "node1", target: str = TARGET, **kw: Any) -> None:
    values: dict[str, Any] = {
        "name": name, "hostname": hostname, "role": "eval", "target": target, "queues": [f"eval.{target}"],
        "gpu": "0", "gpus": [{"index": 0, "name": "MI250"}], "cpus": 16, "concurrency": 1, "pid": 100,
    }  # fmt: skip
    values.update(kw)
    store.register_worker(**values)


def test_register_worker_creates_its_machine_and_worker(store: Store) -> None:
    register(store, "eval-gpu0@node1")
    [machine] = store.machines()
    [worker] = store.workers()
    assert (machine.hostname, machine.targets, machine.cpus) == ("node1", [TARGET], 16)
    assert (worker.name, worker.machine_id, worker.role, worker.gpu, worker.pid) == (
        "eval-gpu0@node1", machine.id, "eval", "0", 100)  # fmt: skip


def test_re_registering_a_worker_updates_it(store: Store) -> None:
    register(store, "eval-gpu0@node1")
    store.worker_stopped("eval-gpu0@node1")
    register(store, "eval-gpu0@node1", pid=200, target=OTHER_TARGET)
    register(store, "build@node1", role="build", gpu=None, gpus=[])
    assert count(store, Worker) == 2
    assert count(store, Machine) == 1
    worker = next(w for w in store.workers() if w.name == "eval-gpu0@node1")
    assert (worker.pid, worker.target, worker.stopped_at) == (200, OTHER_TARGET, None)
    [machine] = store.machines()
    assert machine.targets == sorted([TARGET, OTHER_TARGET])
    assert machine.gpus == [{"index": 0, "name": "MI250"}]  # a build worker's empty list does not erase them


def test_workers_registering_at_once_keep_all_their_machines_targets(store: Store) -> None:
    # The GPU workers of a node start together; read-modify-write of machine.targets must not lose any.
    for round_ in range(3):
        host = f"node{round_}"
        register(store, f"first@{host}", hostname=host, target="t-first")
        race(8, lambda i, h=host: register(store, f"w{i}@{h}", hostname=h, target=f"t{i}"))
        machine = next(m for m in store.machines() if m.hostname == host)
        assert machine.targets == sorted(["t-first", *(f"t{i}" for i in range(8))])


def test_heartbeat_updates_worker_and_machine(store: Store) -> None:
    register(store, "w@node1")
    with store.session() as session:
        session.execute(update(Worker).values(heartbeat_at=utcnow() - timedelta(hours=1)))
        session.execute(update(Machine).values(last_seen=utcnow() - timedelta(hours=1)))
    store.heartbeat("w@node1")
    store.heartbeat("nobody")  # an unknown worker is no error
    [worker] = store.workers()
    [machine] = store.machines()
    assert worker.heartbeat_at > utcnow() - timedelta(minutes=1)
    assert machine.last_seen > utcnow() - timedelta(minutes=1)


def test_workers_within_excludes_stale_and_stopped_ones(store: Store) -> None:
    register(store, "alive@node1")
    register(store, "stale@node1")
    register(store, "stopped@node2", hostname="node2", role="build")
    with store.session() as session:
        session.execute(
            update(Worker).where(Worker.name == "stale@node1").values(heartbeat_at=utcnow() - timedelta(minutes=5))
        )
    store.worker_stopped("stopped@node2")
    assert [w.name for w in store.workers()] == ["alive@node1", "stale@node1", "stopped@node2"]
    assert [w.name for w in store.workers(within=60)] == ["alive@node1"]
    assert [w.name for w in store.workers(role="build")] == ["stopped@node2"]
    assert store.workers(target=OTHER_TARGET) == []
    assert next(w for w in store.workers() if w.name == "stopped@node2").stopped_at is not None


# -- best -------------------------------------------------------------------------------------------------


def test_best_minimizes_when_the_measurements_minimize(store: Store) -> None:
    campaign = make_campaign(store)
    a, b, c = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 4})
    for trial_id, seconds in ((a, 3.0), (b, 1.0), (c, 2.0)):
        evaluate(store, trial_id, seconds, maximize=False)
    problem = store.trial(a).problem_id
    [(m, config)] = store.best(problem, TARGET)
    assert (m.objective, config, m.trial_id) == (1.0, {"tile": 2}, b)


def test_best_maximizes_when_the_measurements_maximize(store: Store) -> None:
    campaign = make_campaign(store)
    a, b, c = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 4})
    for trial_id, gflops in ((a, 3.0), (b, 1.0), (c, 2.0)):
        evaluate(store, trial_id, gflops, maximize=True, name="gflops")
    problem = store.trial(a).problem_id
    assert [(m.objective, config) for m, config in store.best(problem, TARGET, limit=2)] == [
        (3.0, {"tile": 1}), (2.0, {"tile": 4})]  # fmt: skip


def test_best_ignores_invalid_measurements_and_other_targets(store: Store) -> None:
    problem = make_problem(store)
    here = make_campaign(store, name="here", problem_ids=[problem])
    there = make_campaign(store, name="there", target=OTHER_TARGET, problem_ids=[problem])
    valid, wrong = add(store, here, {"tile": 1}, {"tile": 2})
    [elsewhere] = add(store, there, {"tile": 4})
    evaluate(store, valid, 5.0)
    evaluate(store, wrong, 0.1, valid=False, state="invalid")
    evaluate(store, elsewhere, 0.01)
    assert [(m.objective, c) for m, c in store.best(problem, TARGET, limit=10)] == [(5.0, {"tile": 1})]
    assert [(m.objective, c) for m, c in store.best(problem, OTHER_TARGET)] == [(0.01, {"tile": 4})]
    assert store.best(make_problem(store, 99), TARGET) == []


def test_best_limit(store: Store) -> None:
    campaign = make_campaign(store)
    ids = add(store, campaign, *({"tile": t} for t in range(5)))
    for index, trial_id in enumerate(ids):
        evaluate(store, trial_id, float(index + 1))
    problem = store.trial(ids[0]).problem_id
    assert [m.objective for m, _ in store.best(problem, TARGET, limit=3)] == [1.0, 2.0, 3.0]
    assert len(store.best(problem, TARGET, limit=10)) == 5


def test_best_ranks_by_the_latest_objective_only(store: Store) -> None:
    campaign = make_campaign(store)
    seconds, gflops = add(store, campaign, {"tile": 1}, {"tile": 2})
    evaluate(store, seconds, 0.001, name="seconds")
    evaluate(store, gflops, 50.0, name="gflops", maximize=True)
    problem = store.trial(seconds).problem_id
    assert [(m.objective_name, m.objective) for m, _ in store.best(problem, TARGET, limit=10)] == [("gflops", 50.0)]


# -- results ----------------------------------------------------------------------------------------------


def test_results_returns_only_terminal_trials_with_their_measurements(store: Store) -> None:
    campaign = make_campaign(store)
    done, failed, invalid, waiting, running = add(store, campaign, *({"tile": t} for t in range(5)))
    evaluate(store, done, 2.0, metrics={"gflops": 7.5})
    assert store.claim(failed, "compile", "b", LEASE, MAX) is not None
    assert store.record(failed, "b", state="errored", reason="build failed: boom")
    evaluate(store, invalid, 0.5, valid=False, state="invalid")
    assert store.claim(running, "compile", "b", LEASE, MAX) is not None

    results = {r.trial_id: r for r in store.results([done, failed, invalid, waiting, running])}

    assert sorted(results) == [done, failed, invalid]
    assert (results[done].state, results[done].objective, results[done].metrics, results[done].valid) == (
        "evaluated", 2.0, {"gflops": 7.5}, True)  # fmt: skip
    assert (results[failed].state, results[failed].reason, results[failed].objective) == (
        "errored", "build failed: boom", None)  # fmt: skip
    assert (results[invalid].state, results[invalid].valid, results[invalid].objective) == ("invalid", False, 0.5)
    assert not any(r.reused for r in results.values())
    assert [r.trial_id for r in store.results(campaign_id=campaign.id)] == sorted([done, failed, invalid])
    assert store.results([]) == []


def test_results_carry_the_seconds_each_trial_held_a_build_slot_and_an_evaluation_slot(store: Store) -> None:
    # What the drivers batch and size their windows from (fleet.driving.pace): the workers' time, not the turnaround.
    campaign = make_campaign(store)
    built, reused, errored, unbuilt = add(store, campaign, *({"tile": t} for t in range(4)))
    start = store.start_compile(built, "b", LEASE, MAX)
    assert start.work is not None  # its build, and its compile, in one statement on PostgreSQL
    assert store.finish_build(start.work.build_key, "b", data=b"bin", trial_id=built, seconds=1.5, took=1.6)
    assert store.claim(reused, "compile", "b", LEASE, MAX) is not None
    assert store.mark_compiled(reused, "b", seconds=0.002)  # its artifact was there
    compile_(store, errored)
    for trial_id in (built, reused, errored):
        assert store.claim(trial_id, "evaluate", "evaluator", LEASE, MAX, DEVICE) is not None
    assert store.record(built, "evaluator", measurement=measurement(1.0), seconds=0.004)
    assert store.record(reused, "evaluator", measurement=measurement(2.0), seconds=0.003)
    assert store.record(errored, "evaluator", state="errored", reason="evaluate failed: boom", seconds=0.25)
    assert store.claim(unbuilt, "compile", "b", LEASE, MAX) is not None
    assert store.record(unbuilt, "b", state="errored", reason="build failed: boom")

    results = {r.trial_id: (r.compile_seconds, r.eval_seconds) for r in store.results(campaign_id=campaign.id)}

    assert results == {
        built: (pytest.approx(1.6), pytest.approx(0.004)),
        reused: (pytest.approx(0.002), pytest.approx(0.003)),
        errored: (None, pytest.approx(0.25)),  # compiled by a worker that did not time it
        unbuilt: (None, None),
    }


@pytest.fixture
def pg_store(postgres_server: Any) -> Iterator[Store]:
    """A store on a database of its own on PostgreSQL, for tests of the plans PostgreSQL picks."""
    store = Store(postgres_server.create_database(f"p{uuid.uuid4().hex[:12]}"))
    store.upgrade()
    try:
        yield store
    finally:
        store.close()


def analyze(store: Store) -> None:
    with store.engine.begin() as connection:
        connection.execute(text("ANALYZE trials"))


def plan_of(store: Store, sql: str) -> str:
    with store.engine.connect() as connection:
        return "\n".join(connection.scalars(text(f"EXPLAIN {sql}")))


def last_plan(store: Store, prefix: str, action: Callable[[], object]) -> str:
    """The plan of the last statement starting with ``prefix`` that ``action`` ran, with its parameters."""
    statements: list[str] = []

    def capture(connection: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().startswith(prefix):
            statements.append(cursor.mogrify(statement, parameters).decode())

    # On every engine: the store runs some statements on its autocommit engine, not on store.engine.
    event.listen(Engine, "before_cursor_execute", capture)
    try:
        action()
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    return plan_of(store, statements[-1])


def test_results_look_trials_up_by_id_even_when_statistics_say_none_finished(pg_store: Store) -> None:
    store = pg_store
    trial_ids = add(store, make_campaign(store), *({"tile": t} for t in range(400)))
    analyze(store)  # every trial is new: what a campaign's start looks like
    for trial_id in trial_ids:
        assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
        assert store.record(trial_id, "b", state="errored", reason="build failed")

    def read() -> None:
        assert [r.trial_id for r in store.results(trial_ids[-50:])] == trial_ids[-50:]

    plan = last_plan(store, "SELECT trials.id", read)
    assert "ix_trials_state_lease" not in plan and "ix_trials_campaign_state" not in plan, plan


@pytest.mark.parametrize("maximize", [False, True])
def test_a_campaigns_best_is_found_down_its_problems_measurements_in_order_not_by_ranking_them_all(
    pg_store: Store, maximize: bool
) -> None:
    store = pg_store
    campaign = make_campaign(store)
    for n, trial_id in enumerate(add(store, campaign, *({"tile": t} for t in range(200)))):
        evaluate(store, trial_id, float(n % 3), maximize=maximize)
    analyze(store)
    with store.engine.begin() as connection:
        connection.execute(text("ANALYZE measurements"))

    def tally() -> None:
        [found] = store.tally(campaign.id, maximize).values()
        assert found.best is not None and found.best.config == {"tile": 2 if maximize else 0}

    plan = last_plan(store, "SELECT (SELECT trials.id", tally)
    assert "ix_measurements_problem_objective" in plan and "WindowAgg" not in plan, plan


def test_add_trials_finds_its_trials_through_the_unique_index_not_the_whole_campaign(pg_store: Store) -> None:
    store = pg_store
    campaign = make_campaign(store)
    add(store, campaign, *({"tile": t} for t in range(3000)))
    analyze(store)

    def resumed() -> None:  # a resumed campaign's window: the lookup after the insert finds these trials
        add(store, campaign, *({"tile": t} for t in range(2990, 3010)))

    plan = last_plan(store, "SELECT trials.problem_id, trials.config_key", resumed)
    # Each of the index's columns bounds the scan: the campaign's other trials are not read.
    bounds = next(line for line in plan.splitlines() if "Index Cond" in line)
    assert "uq_trial_config" in plan and "problem_id = " in bounds and "config_key)::text = ANY" in bounds, plan


def test_a_builds_end_finds_the_compiles_handed_to_it_by_its_key_not_among_every_compile(pg_store: Store) -> None:
    store = pg_store
    add(store, make_campaign(store), *({"tile": t} for t in range(3000)))
    with store.engine.begin() as connection:
        # Every trial compiling at once: what a fleet of build slots, or a table not yet vacuumed, has.
        connection.execute(update(Trial).values(state="compiling", worker="builder"))
        key = connection.scalar(select(Trial.build_key).limit(1))
    analyze(store)
    statement = store._hot.compile_handed.compile(dialect=store.engine.dialect)
    params = dict(statement.params, key=key, owner="builder", trial=0)
    with store.engine.connect() as connection:
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        sql = cursor.mogrify(str(statement), params).decode()
    plan = plan_of(store, sql)
    assert "ix_trials_compiling_build" in plan, plan


def test_results_of_a_reused_trial_report_the_source_measurement(store: Store) -> None:
    problem = make_problem(store)
    first = make_campaign(store, name="first", problem_ids=[problem])
    [source] = add(store, first, {"tile": 2})
    evaluate(store, source, 0.75, metrics={"gflops": 12.0})
    second = make_campaign(store, name="second", problem_ids=[problem])
    [reused] = add(store, second, {"tile": 2})
    assert store.record(reused, "evaluator", state="evaluated", source=reuse_claim(store, reused).reuse)
    [result] = store.results([reused])
    assert (result.trial_id, result.state, result.reused, result.valid) == (reused, "evaluated", True, True)
    assert (result.objective, result.metrics, result.config) == (0.75, {"gflops": 12.0}, {"tile": 2})


# -- summaries --------------------------------------------------------------------------------------------


def summaries_from_results(store: Store, campaign: Campaign) -> list[Summary]:
    """What ``summarize`` gave when it read every result of the campaign (before issue 18): the reference."""
    maximize = load_workload_spec(campaign.workload).maximize
    results = store.results(campaign_id=campaign.id)
    summaries = []
    for problem in store.campaign_problems(campaign.id):
        mine = [r for r in results if r.problem_id == problem.id]
        valid = [r for r in mine if r.valid and r.objective is not None]
        best = (max if maximize else min)(valid, key=lambda r: r.objective) if valid else None  # type: ignore[arg-type]
        run_knobs = Space.from_dict(campaign.space).run_knobs
        same_run = [
            r
            for r in mine
            if r.baseline
            and r.valid
            and best is not None
            and all(r.config.get(n) == best.config.get(n) for n in run_knobs)
        ]
        # A baseline that pins a run-time knob the best differs in is still the baseline asked for (issue 34).
        pinned = [r for r in mine if r.baseline and r.valid and best is not None]
        counts: dict[str, int] = {}
        for r in mine:
            counts[r.state] = counts.get(r.state, 0) + 1
        baseline = (same_run or pinned or [None])[0]
        summaries.append(Summary(problem.id, best, baseline, counts, maximize))
    return summaries


@pytest.mark.parametrize("goal", ["min", "max"])
def test_summarize_finds_in_sql_what_reading_every_result_found(store: Store, goal: str) -> None:
    """Bests (ties to the earliest), like-for-like baselines, counts in first-seen order, reused trials."""
    problems = [make_problem(store, n) for n in range(4)]
    knobs = {"tile": [1, 2, 4], "scale": {"values": [1, 2, 3], "build": False}}
    workload = {"kind": "command", "run": ["./k", "{tile}", "{scale}"], "objective": {"json": "s", "goal": goal}}
    first = make_campaign(store, "first", problem_ids=problems, space={"knobs": knobs}, workload=workload)
    second = make_campaign(store, "second", problem_ids=problems[:1], space={"knobs": knobs}, workload=workload)

    def score(seconds: float) -> float:
        """The objective of a run of ``seconds``: lower is better when minimizing, higher when maximizing."""
        return seconds if goal == "min" else 10 - seconds

    def trial(campaign: Campaign, problem: int, tile: int, scale: int, baseline: bool = False) -> int:
        config = {"tile": tile, "scale": scale}
        [(trial_id, _)] = store.add_trials(campaign.id, TARGET, [new_trial(problem, config, baseline=baseline)])
        return trial_id

    def errored(trial_id: int) -> None:
        assert store.claim(trial_id, "compile", "b", LEASE, MAX) is not None
        assert store.record(trial_id, "b", state="errored", reason="build failed")

    a, b, c, _ = problems
    # Problem a: baselines at tile 1, the best at scale 2 (a tie, the earlier wins), a better invalid one.
    errored(trial(first, a, 2, 3))
    evaluate(store, trial(first, a, 1, 1, baseline=True), score(5.0))
    evaluate(store, trial(first, a, 1, 3, baseline=True), score(0.5), valid=False, state="invalid")
    evaluate(store, trial(first, a, 1, 2, baseline=True), score(8.0))
    evaluate(store, trial(first, a, 2, 1), score(3.0))
    best_a = trial(first, a, 4, 2)
    evaluate(store, best_a, score(2.0), metrics={"gflops": 9.0})
    evaluate(store, trial(first, a, 2, 2), score(2.0))
    evaluate(store, trial(first, a, 4, 3), score(1.0), valid=False, state="invalid")
    trial(first, a, 4, 1)  # never ran: not counted
    # Problem b: the best has no baseline of its scale (the one at scale 1 stands for it); problem c: only errors;
    # the fourth: nothing finished.
    evaluate(store, trial(first, b, 1, 1, baseline=True), score(4.0))
    evaluate(store, trial(first, b, 2, 3), score(1.5))
    evaluate(store, trial(first, b, 4, 1), score(3.5))
    errored(trial(first, c, 1, 1))
    # The second campaign reuses problem a's best, and measures a worse configuration of its own, and one as good
    # (a tie: the reused trial came first); the first campaign's better runs of the problem are not its own.
    reused = trial(second, a, 4, 2)
    assert store.record(reused, "evaluator", state="evaluated", source=reuse_claim(store, reused).reuse)
    evaluate(store, trial(second, a, 1, 1), score(7.0))
    evaluate(store, trial(second, a, 2, 2), score(2.0))

    for campaign in (first, second):
        campaign = store.campaign(campaign.id)
        found, expected = summarize(store, campaign), summaries_from_results(store, campaign)
        assert found == expected
        assert [list(s.counts) for s in found] == [list(s.counts) for s in expected]
    [a_sum, b_sum, c_sum, nothing] = summarize(store, first)
    assert (a_sum.best.trial_id, a_sum.best.metrics, a_sum.baseline.config) == (  # type: ignore[union-attr]
        best_a, {"gflops": 9.0}, {"tile": 1, "scale": 2})  # fmt: skip
    assert a_sum.counts == {"errored": 1, "evaluated": 5, "invalid": 2} and a_sum.speedup == 4.0
    assert (b_sum.best.config, b_sum.baseline.config) == ({"tile": 2, "scale": 3}, {"tile": 1, "scale": 1})  # type: ignore[union-attr]
    assert (c_sum.best, c_sum.counts, nothing.best, nothing.counts) == (None, {"errored": 1}, None, {})
    [reusing] = summarize(store, store.campaign(second.id))
    assert (reusing.best.trial_id, reusing.best.reused, reusing.counts) == (reused, True, {"evaluated": 3})  # type: ignore[union-attr]
    baselines = {p: t.baselines for p, t in store.tally(first.id, goal == "max").items()}
    assert baselines == {a: {"evaluated": 2, "invalid": 1}, b: {"evaluated": 1}, c: {}}


def test_a_worker_store_commits_without_waiting_for_the_disk_and_others_wait(postgres_server: Any) -> None:
    """Workers' writes are covered by leases; everyone else's commits reach the disk before they return."""
    url = postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    for durable, expected in ((False, "off"), (True, "on")):
        store = Store(url, durable=durable)
        try:
            with store.engine.connect() as connection:
                assert connection.exec_driver_sql("SHOW synchronous_commit").scalar() == expected
        finally:
            store.close()
