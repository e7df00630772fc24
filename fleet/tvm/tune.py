"""Tune operator problems through the fleet: one campaign per problem not yet tuned for the target.

Each problem's space comes from its shape (:func:`fleet.tvm.spaces.space_for`), so each gets its own campaign;
the trials go to ``eval.<target>`` as ``tvm_measure`` tasks, and the results land in the best-configuration
database like any other measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.canonical import digest
from fleet.driving.campaign import CampaignSpec, ProblemSpec, submit
from fleet.trust import FROM, Trusted
from fleet.tvm.best import best as known_best
from fleet.tvm.models import Layer
from fleet.tvm.operators import OPS
from fleet.tvm.spaces import space_for


@dataclass
class Tuned:
    """What tuning did for one layer: ``skipped`` when it had a best already (``campaign``: the one that measured
    it), else its campaign's best."""

    layer: Layer
    problem_id: int
    skipped: bool
    campaign: str | None = None
    gflops: float | None = None
    config: dict[str, Any] | None = None


def campaign_spec(
    layer: Layer, target: str, *, budget: int, strategy: str = "random", seed: int = 0, tags: tuple[str, ...] = ()
) -> CampaignSpec:
    """The campaign that tunes one layer's problem on ``target``."""
    name = f"tvm-{OPS[layer.kind]}-{digest([layer.kind, layer.params, target, strategy, budget, seed])[:12]}"
    return CampaignSpec(
        name=name,
        problems=[ProblemSpec(layer.kind, dict(layer.params), tags)],
        target=target,
        space=space_for(layer.kind, layer.params, target),
        workload={"kind": "tvm", "op": OPS[layer.kind], "repeats": 3},
        strategy={"name": strategy, "budget": budget, "seed": seed},
    )


def tune_layers(
    store: Any,
    layers: list[Layer],
    target: str,
    *,
    budget: int,
    strategy: str = "random",
    tags: tuple[str, ...] = (),
    drive: Callable[[Any], list[Any]],
    log: Callable[[str], None] = lambda _: None,
    trusted: Trusted | None = None,
) -> list[Tuned]:
    """Tune every layer that has no valid measurement on ``target`` yet among the campaigns ``trusted`` names;
    ``drive`` runs one campaign to its end.

    Layers with the same problem (kind and parameters) are tuned once. Whether a layer is tuned already follows
    fleet.trust's rule, as ``fleet best`` does: another campaign's number skips a layer only when it is named (or
    with ``all``); named none, the one campaign that measured it counts, and where several did the whole model is
    refused in one line before anything is tuned.
    """
    ids = [store.add_problem(layer.kind, layer.params, tags) for layer in layers]
    known = {
        problem_id: known_best(problem_id, target, store, campaigns=trusted, how=FROM)
        for problem_id in dict.fromkeys(ids)  # every layer asked first: a refusal tunes nothing
    }
    done: dict[int, Tuned] = {}
    out = []
    for layer, problem_id in zip(layers, ids, strict=True):
        if problem_id in done:
            out.append(Tuned(layer, problem_id, True, done[problem_id].campaign, done[problem_id].gflops))
            continue
        if known[problem_id]:
            found = known[problem_id][0]
            config, measurement = found
            log(f"{layer.name}: tuned already ({measurement.objective:.2f} GFLOPS, campaign {found.campaign}), skipped")
            tuned = Tuned(layer, problem_id, True, found.campaign, measurement.objective, config)
        else:
            spec = campaign_spec(layer, target, budget=budget, strategy=strategy, tags=tags)
            campaign = submit(store, spec)
            log(f"{layer.name}: campaign {campaign.name}, {budget} configurations")
            summaries = drive(campaign)
            best = summaries[0].best if summaries else None
            tuned = Tuned(
                layer,
                problem_id,
                False,
                campaign.name,
                best.objective if best else None,
                best.config if best else None,
            )
        done[problem_id] = tuned
        out.append(tuned)
    return out
