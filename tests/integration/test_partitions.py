"""Partitions on the test bed (issue 39): real workers and drivers on nodes apart, links cut with nft inside a node's
own network namespace, then healed; each run ends with every trial recorded exactly once, every measurement named
after the node that made it (all nodes share one host name), and every count printed."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import func, select

from fleet.bench.chaos import campaign_spec, planned_configs
from fleet.bench.partition import Cut, LeaseWatch, check, now, wait_done
from fleet.ops.nodes import DATABASE_ADDRESS, POSTGRES_PORT, REDIS_PORT, Node
from fleet.store import Campaign, Measurement, Trial
from tests.nodes import SETTINGS, SHARED_HOSTNAME, BedFleet, bed, bed_fleet  # noqa: F401  (the fixtures)

LEASE = float(SETTINGS["FLEET_LEASE_SECONDS"])
DRIVER_LEASE = float(SETTINGS["FLEET_DRIVER_LEASE_SECONDS"])
DATABASE = [(DATABASE_ADDRESS, POSTGRES_PORT), (DATABASE_ADDRESS, REDIS_PORT)]


def write_spec(fleet: BedFleet, node: Node, name: str, trials: int) -> tuple[str, list[dict[str, Any]]]:
    """A chaos campaign's spec (each run prints a value known from its configuration) in ``node``'s home."""
    spec = campaign_spec(name, f"cpu-{name}", trials, 0.15)
    path = node.home / f"{name}.json"
    path.write_text(json.dumps(spec))
    return f"/home/fleetbed/{name}.json", planned_configs(path, trials)


def campaign_id(fleet: BedFleet, name: str) -> int | None:
    with fleet.store.session() as session:
        return session.scalar(select(Campaign.id).where(Campaign.name == name))


def measured(fleet: BedFleet, cid: int) -> int:
    with fleet.store.session() as session:
        count = select(func.count()).select_from(Measurement).join(Trial).where(Trial.campaign_id == cid)
        return int(session.scalar(count) or 0)


def start_workers(fleet: BedFleet, name: str, *nodes: Node, eval_procs: int = 1) -> None:
    """``fleet worker`` for the campaign's target on each of ``nodes``, waited for until each registered."""
    for node in nodes:
        fleet.worker(node, f"cpu-{name}", "--build-procs", "1", "--eval-procs", str(eval_procs))
    fleet.wait_for(
        lambda: {n.name for n in nodes} <= {w.name.rpartition("@")[2] for w in fleet.store.workers(within=5)},
        timeout=90,
        what=f"workers on {[n.name for n in nodes]} to register",
    )


def report(title: str, counts: dict[str, Any]) -> None:
    shown = {k: v for k, v in counts.items() if k not in ("examples",)}
    print(f"\n{title}: {json.dumps(shown, default=str)}")


def test_a_worker_node_cut_off_from_postgres_and_redis_loses_nothing_and_measurements_name_their_node(
    bed_fleet: BedFleet,  # noqa: F811
) -> None:
    nodes = bed_fleet.bed
    node1, node2, head = nodes["node1"], nodes["node2"], nodes["node3"]
    name = "cutworker"
    spec, planned = write_spec(bed_fleet, head, name, 40)
    start_workers(bed_fleet, name, node1, node2)
    tune = bed_fleet.spawn_fleet(head, "tune", spec, "--json", log="tune.log")
    bed_fleet.wait_for(lambda: campaign_id(bed_fleet, name) is not None, timeout=60, what="the campaign")
    cid = campaign_id(bed_fleet, name)
    assert cid is not None
    bed_fleet.wait_for(lambda: measured(bed_fleet, cid) >= 6, timeout=90, what="the first measurements")
    # node1 loses its links to PostgreSQL and Redis (the rules are in node1's own namespace) for two leases.
    start = now(bed_fleet.store)
    nodes.cut(node1, DATABASE)
    time.sleep(2 * LEASE + 2)
    nodes.heal(node1)
    healed = now(bed_fleet.store)
    before = measured(bed_fleet, cid)
    status = wait_done(bed_fleet.store, cid, timeout=240)
    assert tune.wait(60) == 0, (bed_fleet.logs / "tune.log").read_text()[-2000:]
    counts = check(
        bed_fleet.store, cid, planned, nodes=["node1", "node2"], cuts=[Cut("node1", start, healed)], lease_seconds=LEASE
    )
    counts.update(status=status, measured_before_heal=before)
    report("node1 cut from PostgreSQL and Redis", counts)
    assert counts["ok"], counts
    assert counts["recorded"] == len(planned) == 40
    assert set(counts["measured_by"]) == {"node1", "node2"}  # each told apart though both are "gpu-image"
    assert SHARED_HOSTNAME not in counts["measured_by"]


def test_a_head_node_cut_off_while_its_driver_holds_a_campaign_is_taken_over_and_stands_down_after_the_heal(
    bed_fleet: BedFleet,  # noqa: F811
) -> None:
    nodes = bed_fleet.bed
    worker, other_head, head = nodes["node1"], nodes["node2"], nodes["node3"]
    name = "cuthead"
    spec, planned = write_spec(bed_fleet, worker, name, 40)
    bed_fleet.driver(head)
    start_workers(bed_fleet, name, worker, eval_procs=2)
    fleet_driver = "driver@node3"
    bed_fleet.wait_for(
        lambda: any(w.name.startswith(fleet_driver) for w in bed_fleet.store.workers(within=5)), timeout=60,
        what="the driver on node3",
    )  # fmt: skip
    submitted = bed_fleet.fleet(worker, "submit", spec)
    assert submitted.returncode == 0, submitted.stderr
    cid = campaign_id(bed_fleet, name)
    assert cid is not None
    watch = LeaseWatch(bed_fleet.store, cid).start()
    try:

        def holder() -> str:
            with bed_fleet.store.session() as session:
                return str(session.get(Campaign, cid).driver or "")

        bed_fleet.wait_for(lambda: holder().startswith(fleet_driver), timeout=60, what="node3's driver to take it")
        bed_fleet.driver(other_head)  # a second driver, waiting for campaigns to take
        bed_fleet.wait_for(lambda: measured(bed_fleet, cid) >= 6, timeout=90, what="the first measurements")
        # node3 is cut from everything: its driver still believes it drives, until its calls give up.
        start = now(bed_fleet.store)
        cut_at = time.monotonic()
        nodes.cut(head)
        bed_fleet.wait_for(lambda: holder().startswith("driver@node2"), timeout=DRIVER_LEASE + 20, what="a takeover")
        takeover = time.monotonic() - cut_at
        time.sleep(DRIVER_LEASE)
        nodes.heal(head)
        healed, healed_at = now(bed_fleet.store), time.monotonic()
        status = wait_done(bed_fleet.store, cid, timeout=240)
        # Healed, node3's driver stands down: its next call finds the campaign another driver's (its renewal is
        # refused), or already done by that one. Never does the lease come back to it (the watch's turns, below).
        log = bed_fleet.logs / "driver-node3.log"

        def stood_down() -> bool:
            text = log.read_text()
            return f"let go of {name!r}" in text or f"campaign {name!r} done" in text

        try:
            bed_fleet.wait_for(stood_down, timeout=60, what="node3's driver to stand down")
        except AssertionError as error:
            sockets = nodes.run(head, ["ss", "-tnpoi"], user=None).stdout  # where it hangs: its connections' queues
            raise AssertionError(f"{error}\n{sockets}") from None
        stand_down = time.monotonic() - healed_at
    finally:
        watch.stop()
    counts = check(
        bed_fleet.store, cid, planned, nodes=["node1"], cuts=[Cut("node3", start, healed)], watch=watch,
        lease_seconds=LEASE, driver_lease_seconds=DRIVER_LEASE,
    )  # fmt: skip
    counts.update(status=status, takeover_seconds=round(takeover, 1), stood_down_seconds=round(stand_down, 1))
    report("head node3 cut from everything, its campaign taken over, then healed", counts)
    assert status == "done" and counts["ok"], counts
    assert counts["recorded"] == len(planned)
    assert [t.split(":")[0] for t in counts["driver_turns"]] == ["driver@node3", "driver@node2"]


def since(fleet: BedFleet, cid: int, node: str, instant: Any) -> Any:
    """The first measurement ``node`` recorded for the campaign after ``instant`` (database clock), or None."""
    with fleet.store.session() as session:
        first = (
            select(func.min(Measurement.created_at))
            .join(Trial)
            .where(Trial.campaign_id == cid, Measurement.node == node, Measurement.created_at > instant)
        )
        return session.scalar(first)


def keepalive_links(fleet: BedFleet, node: Node, port: int) -> list[str]:
    """The node's established connections to the database node's ``port`` that carry a keepalive timer."""
    lines = fleet.bed.run(node, ["ss", "-Htno", "state", "established", f"dport = :{port}"], user=None).stdout
    return [line for line in lines.splitlines() if "keepalive" in line]


def cut_one_link(fleet: BedFleet, name: str, port: int, seconds: float, trials: int) -> dict[str, Any]:
    """``trials`` of a campaign measured on node1 alone, whose link to the database node's ``port`` (PostgreSQL or
    Redis, nothing else) is cut for ``seconds``, longer than the links' dead-link timeouts (15 s); the checker's
    counts, and how long after the heal node1 measured again."""
    nodes = fleet.bed
    node1, head = nodes["node1"], nodes["node3"]
    spec, planned = write_spec(fleet, head, name, trials)
    start_workers(fleet, name, node1)
    tune = fleet.spawn_fleet(head, "tune", spec, "--json", log="tune.log")
    fleet.wait_for(lambda: campaign_id(fleet, name) is not None, timeout=60, what="the campaign")
    cid = campaign_id(fleet, name)
    assert cid is not None
    fleet.wait_for(lambda: measured(fleet, cid) >= 4, timeout=90, what="the first measurements")
    # Before the cut: the worker's links to that port carry keepalives (a link without one would hang on the cut).
    links = keepalive_links(fleet, node1, port)
    start = now(fleet.store)
    nodes.cut(node1, [(DATABASE_ADDRESS, port)])
    time.sleep(seconds)
    before = measured(fleet, cid)
    nodes.heal(node1)
    healed, healed_at = now(fleet.store), time.monotonic()
    # Not hung: node1, the campaign's only worker, measures again and finishes the campaign.
    fleet.wait_for(lambda: since(fleet, cid, "node1", healed) is not None, timeout=LEASE + 60, what="node1 again")
    resumed = time.monotonic() - healed_at
    status = wait_done(fleet.store, cid, timeout=180)
    assert tune.wait(60) == 0, (fleet.logs / "tune.log").read_text()[-2000:]
    cuts = [Cut("node1", start, healed)] if port == POSTGRES_PORT else []
    counts = check(fleet.store, cid, planned, nodes=["node1"], cuts=cuts, lease_seconds=LEASE)
    counts.update(status=status, measured_before_heal=before, resumed_seconds=round(resumed, 1))
    counts.update(keepalive_links=len(links))
    return counts


def test_a_worker_node_cut_from_redis_alone_neither_hangs_nor_loses_a_trial(bed_fleet: BedFleet) -> None:  # noqa: F811
    counts = cut_one_link(bed_fleet, "cutredis", REDIS_PORT, seconds=20, trials=30)
    report("node1 cut from Redis alone for 20 s", counts)
    assert counts["keepalive_links"] >= 1, counts  # the broker links' keepalives (fleet.celery_app.BROKER_LINK)
    assert counts["status"] == "done" and counts["ok"], counts
    assert counts["recorded"] == 30 and counts["measured_by"] == {"node1": 30}
    assert counts["resumed_seconds"] < LEASE + 30, counts  # reconnects: its consumer did not hang on the dead link


def test_a_worker_node_cut_from_postgres_alone_records_nothing_while_cut_and_resumes(
    bed_fleet: BedFleet,  # noqa: F811
) -> None:
    counts = cut_one_link(bed_fleet, "cutpostgres", POSTGRES_PORT, seconds=20, trials=30)
    report("node1 cut from PostgreSQL alone for 20 s", counts)
    assert counts["keepalive_links"] >= 1, counts  # the store's keepalives and tcp_user_timeout (fleet.store._base)
    assert counts["status"] == "done" and counts["ok"], counts  # ok: none recorded after its lease ran out
    assert counts["recorded"] == 30 and counts["measured_by"] == {"node1": 30}
    assert counts["resumed_seconds"] < LEASE + 30, counts
