"""The TVM commands, in the group ``fleet tvm``: ``tune-model``, ``run-model``, records, models and spaces."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from fleet.cli._sections import WholeHelpGroup
from fleet.errors import FleetError


def _target(target: str | None) -> str:
    from fleet.targets import check_target
    from fleet.workers.gpus import cpu_target

    return check_target(target or cpu_target())


@click.command("tune-model")
@click.argument("model_name", metavar="MODEL")
@click.option("--target", "-t", help="Target to tune for (default: this machine's CPU).")
@click.option("--batch", "-b", type=click.IntRange(1), default=1, show_default=True, help="Batch size.")
@click.option("--budget", type=click.IntRange(1), default=32, show_default=True, help="Configurations per operator.")
@click.option("--strategy", default="random", show_default=True, help="Search strategy (see fleet tune).")
@click.option("--local/--no-local", default=None, help="Start local workers (default: when running embedded).")
@click.option(
    "--from",
    "drawn_from",
    metavar="CAMPAIGN[,..]",
    help="An operator these campaigns measured, or any campaign with 'all', counts as tuned (default: "
    "the one campaign that measured it; several are refused before anything is tuned).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune_model_command(
    model_name: str,
    target: str | None,
    batch: int,
    budget: int,
    strategy: str,
    local: bool | None,
    drawn_from: str | None,
    as_json: bool,
) -> None:
    """Tune every operator of MODEL not yet tuned for the target, through the fleet (tvm_measure tasks); whether an
    operator is tuned already draws on the campaigns --from names."""
    from contextlib import nullcontext

    from fleet.api import connect
    from fleet.cli._common import ProgressBar, check_broker
    from fleet.driving.drivers import driver
    from fleet.local import LocalFleet
    from fleet.settings import get_settings
    from fleet.tvm.available import check_tvm
    from fleet.tvm.models import model
    from fleet.tvm.tune import tune_layers

    target = _target(target)
    trusted = _trusted(drawn_from)
    layers = model(model_name, batch)
    check_tvm()  # the campaigns record TVM's version: without it, one clear error before anything is written
    store = connect()
    check_broker()
    settings = get_settings()
    local = settings.embedded if local is None else local

    def drive(campaign: Any) -> list[Any]:
        bar = ProgressBar(campaign.name, quiet=as_json)
        summaries = driver(store, campaign, on_progress=bar.update, on_warning=bar.warn).run()
        bar.close()
        return summaries

    log = (lambda _: None) if as_json else (lambda line: click.echo(line, err=True))
    with LocalFleet(settings, target) if local else nullcontext():
        tuned = tune_layers(
            store,
            layers,
            target,
            budget=budget,
            strategy=strategy,
            tags=(f"model:{model_name}", f"batch:{batch}"),
            drive=drive,
            log=log,
            trusted=trusted,
        )
    rows = [
        {
            "layer": t.layer.name,
            "kind": t.layer.kind,
            "params": t.layer.params,
            "problem": t.problem_id,
            "skipped": t.skipped,
            "campaign": t.campaign,
            "gflops": t.gflops,
            "config": t.config,
        }
        for t in tuned
    ]
    if as_json:
        click.echo(json.dumps({"model": model_name, "batch": batch, "target": target, "layers": rows}, indent=2))
        return
    from fleet.tvm.operators import describe

    click.echo(f"{model_name} (batch {batch}) on {target}:")
    for t in tuned:
        state = f"already tuned ({t.campaign})" if t.skipped else f"tuned ({t.campaign})"
        best = "no valid configuration" if t.gflops is None else f"{t.gflops:.2f} GFLOPS"
        click.echo(f"  {t.layer.name:<8} {describe(t.layer.kind, t.layer.params):<44} {best:>16}  {state}")


@click.command("run-model")
@click.argument("model_name", metavar="MODEL")
@click.option("--target", "-t", help="Target whose best configurations to use (default: this machine's CPU).")
@click.option("--batch", "-b", type=click.IntRange(1), default=1, show_default=True, help="Batch size.")
@click.option("--repeats", type=click.IntRange(1), default=5, show_default=True, help="Timed repeats per operator.")
@click.option(
    "--from",
    "drawn_from",
    metavar="CAMPAIGN[,..]",
    help="Fleet's best configurations from these campaigns, or 'all' for every campaign's (default: the one "
    "campaign that measured each operator; several are refused).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def run_model_command(
    model_name: str, target: str | None, batch: int, repeats: int, drawn_from: str | None, as_json: bool
) -> None:
    """Run MODEL's operators with their best schedules: time per operator and in all, against NumPy and the untuned
    default schedule. The best is an operator's fastest MetaSchedule record on the target where there is one
    (tune-ms, import-ms), else its best configuration of Fleet's space among the campaigns --from names; the last
    column says which (and its campaign). Nothing is tuned; an operator with neither runs its default schedule."""
    from fleet.api import connect
    from fleet.cli._common import say_scope
    from fleet.tvm.available import require_tvm
    from fleet.tvm.models import model
    from fleet.tvm.run import run_layers

    target = _target(target)
    trusted = _trusted(drawn_from)
    layers = model(model_name, batch)
    require_tvm()
    store = connect()
    say_scope(store, trusted)
    rows = run_layers(store, layers, target, repeats=repeats, trusted=trusted)
    totals = {key: sum(r[key] for r in rows) for key in ("default_s", "tuned_s", "numpy_s")}
    if as_json:
        out = {"model": model_name, "batch": batch, "target": target, "layers": rows, "total": totals}
        click.echo(json.dumps(out, indent=2))
        return
    header = f"{'layer':<8} {'operator':<44} {'default ms':>11} {'tuned ms':>10} {'numpy ms':>10} {'vs default':>10} "
    click.echo(header + f"{'vs numpy':>9}  config")
    for r in rows:
        tuned = f"{r['tuned_s'] * 1e3:.3f}" + ("" if r["tuned"] else "*")
        numpy_ms = r["numpy_s"] * 1e3
        click.echo(
            f"{r['layer']:<8} {r['operator']:<44} {r['default_s'] * 1e3:>11.3f} {tuned:>10} {numpy_ms:>10.3f} "
            f"{r['default_s'] / r['tuned_s']:>9.2f}x {r['numpy_s'] / r['tuned_s']:>8.2f}x  {r['source']}"
            + (f" (campaign {r['campaign']})" if r["campaign"] else "")
        )
    click.echo(
        f"{'total':<53} {totals['default_s'] * 1e3:>11.3f} {totals['tuned_s'] * 1e3:>10.3f} "
        f"{totals['numpy_s'] * 1e3:>10.3f} {totals['default_s'] / totals['tuned_s']:>9.2f}x "
        f"{totals['numpy_s'] / totals['tuned_s']:>8.2f}x"
    )
    if not all(r["tuned"] for r in rows):
        click.echo("* no best configuration on this target: the default schedule ran (fleet tvm tune-model tunes it)")


@click.group("tvm", cls=WholeHelpGroup)
def tvm_group() -> None:
    """TVM operators and models: tune and run them, their spaces, and the records of measured configurations."""


tvm_group.add_command(tune_model_command)
tvm_group.add_command(run_model_command)


@tvm_group.command("export-records")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The JSON-lines file to write.")
@click.option("--target", "-t", help="Only this target's measurements.")
@click.option(
    "--from",
    "drawn_from",
    metavar="CAMPAIGN[,..]",
    help="Only these campaigns' measurements, or 'all' for every campaign's (default: the one campaign "
    "that measured any; several are refused).",
)
def export_records_command(output: Path, target: str | None, drawn_from: str | None) -> None:
    """Write the measured TVM configurations (problem, target, knobs, time, provenance) of the campaigns --from
    names as JSON lines."""
    from fleet.api import connect
    from fleet.cli._common import say_scope
    from fleet.tvm.records import export_records

    trusted = _trusted(drawn_from)
    store = connect()
    say_scope(store, trusted)
    partial = output.with_name(output.name + ".partial")
    try:
        with partial.open("w") as out:
            count, campaigns = export_records(store, out, target, trusted)
        partial.replace(output)  # all or nothing
    finally:
        partial.unlink(missing_ok=True)
    drew = ", ".join(campaigns) or "none"
    click.echo(
        f"{count} records written to {output} (from {'campaign' if len(campaigns) == 1 else 'campaigns'} {drew})"
    )


@tvm_group.command("import-records")
@click.argument("path", type=click.Path(path_type=Path))
def import_records_command(path: Path) -> None:
    """Add the measured configurations of a JSON-lines records file to this database (every line checked first)."""
    from fleet.api import connect
    from fleet.tvm.records import import_records, read_records

    parsed = read_records(path)
    added, present = import_records(connect(), parsed, source=path.name)
    click.echo(f"{added} records imported from {path}, {present} already there")


@tvm_group.command("models")
@click.option("--batch", "-b", type=click.IntRange(1), default=1, show_default=True, help="Batch size.")
def models_command(batch: int) -> None:
    """The named models and their operators."""
    from fleet.tvm.models import MODELS, model
    from fleet.tvm.operators import describe

    for name in sorted(MODELS):
        click.echo(name)
        for layer in model(name, batch):
            click.echo(f"  {layer.name:<8} {describe(layer.kind, layer.params)}")


@tvm_group.command("space")
@click.argument("kind")
@click.option("--param", "params", multiple=True, metavar="K=V", help="A problem parameter, e.g. m=1024.")
@click.option("--target", "-t", help="Target (default: this machine's CPU).")
def space_command(kind: str, params: tuple[str, ...], target: str | None) -> None:
    """The knob space of a TVM problem (KIND: tvm.dense, tvm.batch_matmul, tvm.conv2d) as JSON."""
    from fleet.tvm.spaces import space_for

    space = space_for(kind, _params(params), _target(target))
    click.echo(json.dumps({"size": space.size, **space.to_dict()}, indent=2))
    sys.stdout.flush()


@tvm_group.command("from-miopen")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--tag", default="miopen", show_default=True, help="Tag of the problems added.")
def from_miopen_command(path: Path, tag: str) -> None:
    """Add the forward NCHW FP32 convolutions of a MIOpenDriver command file as TVM conv2d problems."""
    from fleet.api import connect
    from fleet.errors import SpecError
    from fleet.files import read_text
    from fleet.miopen.driver import parse_lines, problems
    from fleet.tvm.operators import conv2d_from_miopen, describe

    lines = read_text(path).splitlines()
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for _, parsed in parse_lines(lines):
        if isinstance(parsed, Exception) or parsed.kind != "conv":
            continue  # pooling, batch norm, or a line MIOpen's parser refuses: not a TVM conv2d
        for problem in problems(parsed):
            try:
                kind, params = conv2d_from_miopen(problem)
            except SpecError:
                continue  # backward, NHWC or half precision: not a TVM conv2d problem
            found[json.dumps(params, sort_keys=True)] = (kind, params)
    store = connect()
    for kind, params in found.values():
        problem_id = store.add_problem(kind, params, [tag])
        click.echo(f"{problem_id:>5}  {describe(kind, params)}")
    click.echo(f"{len(found)} conv2d problems from {path}")


def _trusted(drawn_from: str | None) -> Any:
    """``--from``'s campaigns (fleet.trust), None when not given."""
    from fleet.trust import parse_from

    return None if drawn_from is None else parse_from(drawn_from)


def _params(params: tuple[str, ...]) -> dict[str, Any]:
    """``--param K=V`` options as a dict of integers."""
    values: dict[str, Any] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise FleetError(f"--param {item!r} is not K=<integer>")
        values[key] = int(value)
    return values


def _problem(kind_or_file: str, params: tuple[str, ...], batch: int | None) -> tuple[Any, str, list[Any]]:
    """The IRModule to tune: a TVM operator problem (KIND with --param), a model's operators (MODEL at --batch,
    one function per distinct layer), or an IRModule saved as JSON (``tvm.ir.save_json``); with the operators
    (:class:`~fleet.tvm.models.Layer`, named as the module's functions) where it is made of Fleet's."""
    from fleet.tvm.available import require_tvm
    from fleet.tvm.models import MODELS, Layer, model
    from fleet.tvm.operators import KINDS, check_problem, define, describe

    if batch is not None and kind_or_file not in MODELS:
        raise FleetError(f"--batch is for a model ({', '.join(sorted(MODELS))}), not {kind_or_file}")
    if params and kind_or_file not in KINDS:
        raise FleetError(f"--param is for a TVM operator ({', '.join(sorted(KINDS))}), not {kind_or_file}")
    if kind_or_file in KINDS or kind_or_file in MODELS:
        if kind_or_file in KINDS:
            layers = [Layer("main", kind_or_file, check_problem(kind_or_file, _params(params)))]
        else:
            # A layer repeated in a model is one task: its records serve every layer of the same shape.
            seen: dict[str, Layer] = {}
            for layer in model(kind_or_file, batch or 1):
                seen.setdefault(describe(layer.kind, layer.params), layer)
            layers = list(seen.values())
        tvm = require_tvm()
        return tvm.IRModule({x.name: define(x.kind, x.params) for x in layers}), kind_or_file, layers
    path = Path(kind_or_file)
    if not path.is_file():
        raise FleetError(
            f"{kind_or_file} is neither a TVM operator ({', '.join(sorted(KINDS))}), a model "
            f"({', '.join(sorted(MODELS))}) nor a file"
        )
    from fleet.files import read_text

    text = read_text(path)
    tvm = require_tvm()
    try:
        mod = tvm.ir.load_json(text)
    except Exception as error:  # TVM's parser raises several kinds
        raise FleetError(f"{path}: not an IRModule saved with tvm.ir.save_json ({error})") from None
    return (mod if isinstance(mod, tvm.IRModule) else tvm.IRModule({"main": mod})), str(path), []


@tvm_group.command("tune-ms")
@click.argument("module", metavar="KIND_MODEL_OR_FILE")
@click.option("--param", "params", multiple=True, metavar="K=V", help="A problem parameter, e.g. m=1024.")
@click.option("--batch", "-b", type=click.IntRange(1), help="A model's batch size (default 1).")
@click.option("--target", "-t", help="Fleet target whose workers measure (default: this machine's CPU).")
@click.option("--trials", type=click.IntRange(1), default=64, show_default=True, help="Candidates to measure.")
@click.option("--per-iter", type=click.IntRange(1), default=64, show_default=True, help="Candidates per batch.")
@click.option("--cost-model", type=click.Choice(["xgb", "mlp", "random"]), help="Default: xgb if installed.")
@click.option("--number", type=click.IntRange(1), default=3, show_default=True, help="Runs per repeat.")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True, help="Repeats per candidate.")
@click.option("--min-repeat-ms", type=click.IntRange(0), default=100, show_default=True, help="Shortest repeat.")
@click.option("--work-dir", type=click.Path(path_type=Path), help="MetaSchedule's logs (default: a temporary one).")
@click.option("--local/--no-local", default=None, help="Start local workers (default: when running embedded).")
@click.option(
    "--team",
    envvar="FLEET_TEAM",
    help="The team whose records these are, on PostgreSQL ($FLEET_TEAM; default: your login's one team, none for an "
    "operator's or the service's login: the operators').",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune_ms_command(
    module: str,
    params: tuple[str, ...],
    batch: int | None,
    target: str | None,
    trials: int,
    per_iter: int,
    cost_model: str | None,
    number: int,
    repeat: int,
    min_repeat_ms: int,
    work_dir: Path | None,
    local: bool | None,
    team: str | None,
    as_json: bool,
) -> None:
    """Tune KIND_MODEL_OR_FILE with MetaSchedule (ms.tune_tir), its candidates measured by the fleet's workers on
    the target (FleetRunner), its records kept in Fleet's database.

    A model (tiny-cnn, lenet, alexnet) is tuned as one task per distinct layer, MetaSchedule's task scheduler
    sharing the trials among them; `fleet tvm run-model` then runs each layer with its best record."""
    from contextlib import nullcontext

    from fleet.api import connect
    from fleet.cli._common import check_broker
    from fleet.local import LocalFleet
    from fleet.settings import get_settings
    from fleet.tvm.available import require_tvm
    from fleet.tvm.metaschedule import FleetRunner, tune, tvm_target
    from fleet.tvm.msdb import database

    target = _target(target)
    tvm = require_tvm()
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    mod, name, layers = _problem(module, params, batch)
    store = connect()
    team = store.owning_team(team)
    check_broker()
    settings = get_settings()
    local = settings.embedded if local is None else local
    config = EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    runner = FleetRunner(target, store=store, evaluator_config=config, team=team)
    with LocalFleet(settings, target) if local else nullcontext():
        tuned = tune(
            mod,
            tvm_target(target),
            trials=trials,
            per_iter=per_iter,
            runner=runner,
            database=database(store, target, team=team),
            work_dir=work_dir,
            cost_model=cost_model,
        )
    runner.close()
    rows = _layer_rows(layers, tuned.bests)
    out = _tuned_summary(name, target, tvm.__version__, runner, tuned, rows)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    _echo_tuned(out, rows, batch)


def _layer_rows(layers: Sequence[Any], bests: Mapping[str, float | None]) -> list[dict[str, Any]]:
    """Each layer's operator and best measurement (seconds and GFLOPS; None where none ran correctly)."""
    from fleet.tvm.operators import describe, flops

    rows = []
    for layer in layers:
        seconds = bests.get(layer.name)
        gflops = flops(layer.kind, layer.params) / seconds / 1e9 if seconds else None
        operator = describe(layer.kind, layer.params)
        rows.append({"layer": layer.name, "operator": operator, "best_seconds": seconds, "best_gflops": gflops})
    return rows


def _tuned_summary(
    name: str, target: str, tvm_version: str, runner: Any, tuned: Any, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """tune-ms's result: the module's best (a model's layers each with theirs) and what the fleet measured."""
    one = rows[0] if len(rows) == 1 else None
    out = {
        "module": name,
        "target": target,
        "tvm": tvm_version,
        "campaign": runner.campaign.name if runner.campaign else None,
        "measured": runner.session.measured,
        "seconds": tuned.seconds,
        "best_seconds": tuned.best_seconds,
        "best_gflops": one["best_gflops"] if one else None,
    }
    if len(rows) > 1:
        out["layers"] = rows
    return out


def _echo_tuned(out: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], batch: int | None) -> None:
    """tune-ms's result as text: a model's table of layers, or one problem's best."""
    name, target = out["module"], out["target"]
    click.echo(f"{name} on {target}: {out['measured']} candidates measured by the fleet in {out['seconds']:.1f} s")
    if len(rows) > 1:
        click.echo(f"{'layer':<8} {'operator':<44} {'best ms':>10} {'GFLOPS':>8}")
        for row in rows:
            ms_text = f"{row['best_seconds'] * 1e3:.3f}" if row["best_seconds"] else "-"
            gflops_text = f"{row['best_gflops']:.1f}" if row["best_gflops"] else "-"
            click.echo(f"{row['layer']:<8} {row['operator']:<44} {ms_text:>10} {gflops_text:>8}")
        click.echo(f"campaign {out['campaign']}; next: fleet tvm run-model {name} --batch {batch or 1}")
    elif out["best_seconds"] is None:
        click.echo("no candidate ran correctly")
    else:
        extra = f", {out['best_gflops']:.1f} GFLOPS" if out["best_gflops"] is not None else ""
        click.echo(f"best: {out['best_seconds'] * 1e3:.3f} ms{extra} (campaign {out['campaign']})")


@tvm_group.command("import-ms")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--team",
    envvar="FLEET_TEAM",
    help="The team whose records these are, on PostgreSQL ($FLEET_TEAM; default: your login's one team, none for an "
    "operator's or the service's login: the operators').",
)
def import_ms_command(directory: Path, team: str | None) -> None:
    """Add a MetaSchedule JSON database (DIRECTORY's database_workload.json and database_tuning_record.json) to
    Fleet's MetaSchedule records; every line is checked first, and importing twice adds nothing."""
    from fleet.api import connect
    from fleet.tvm.msdb import import_dir

    store = connect()
    workloads, added, present = import_dir(store, directory, source=directory.name, team=store.owning_team(team))
    click.echo(f"{added} records and {workloads} workloads imported from {directory}, {present} records already there")


@tvm_group.command("export-ms")
@click.argument("directory", type=click.Path(path_type=Path))
def export_ms_command(directory: Path) -> None:
    """Write Fleet's MetaSchedule records as a MetaSchedule JSON database in DIRECTORY (created if needed)."""
    from fleet.api import connect
    from fleet.tvm.msdb import export_dir

    workloads, records = export_dir(connect(), directory)
    click.echo(f"{records} records and {workloads} workloads written to {directory}")
