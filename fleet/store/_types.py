"""What the store's methods take and return, besides the models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NewTrial:
    """A configuration the driver wants measured."""

    problem_id: int
    config: dict[str, Any]
    build_key: str
    measure_key: str
    seq: int = 0
    baseline: bool = False
    history: dict[str, Any] | None = None  # what history said of it, when the searcher proposed it from there


@dataclass(frozen=True)
class TrialWork:
    """Everything a task needs to build or evaluate one claimed trial."""

    trial_id: int
    campaign_id: int
    problem_id: int
    problem_kind: str
    problem_params: dict[str, Any]
    target: str
    config: dict[str, Any]
    build_key: str
    measure_key: str
    workload: dict[str, Any]
    space: dict[str, Any]
    toolchain: str  # the toolchain its artifact was built with; "" until it is compiled
    attempts: int
    artifact_digest: str | None = None
    artifact_data: bytes | None = None  # with an evaluation claim, when the artifact is small (INLINE_BYTES)
    # With an evaluation claim: the trial holding a measurement of the same measure key, toolchain and device
    # kind, which this one reuses instead of measuring (None when there is none, or the campaign remeasures).
    reuse: int | None = None
    reuse_valid: bool = False


@dataclass(frozen=True)
class CompileStart:
    """How a compile task starts: ``compiled`` (already built), ``skipped`` (not ours), or ``claimed``.

    A claimed trial comes with its work and its artifact's row, as :meth:`Store.claim_build` returns it.
    """

    outcome: str
    work: TrialWork | None = None
    artifact: Any = None


@dataclass(frozen=True)
class TrialResult:
    """A trial in a terminal state, with its measurement when it has one."""

    trial_id: int
    problem_id: int
    config: dict[str, Any]
    state: str
    reason: str | None
    objective: float | None = None
    valid: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    baseline: bool = False
    reused: bool = False
    # Its compile's and its evaluation's time on workers' slots; None for what it did not do itself.
    compile_seconds: float | None = None
    eval_seconds: float | None = None
    # With several objectives, each one's value by name (the first is ``objective`` too); empty with one.
    objectives: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Requeue:
    """Work to send: ``task`` for ``trial_id`` to ``target``'s queue (new work, or what the reaper gave back).

    ``label`` says whose it is (campaign, problem, configuration) to a person watching the queues in Flower;
    the message itself carries ids only.
    """

    trial_id: int
    target: str
    task: str
    label: str = field(default="", compare=False)
