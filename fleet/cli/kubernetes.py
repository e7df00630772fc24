"""``fleet kubernetes``: the manifests of a target's workers on Kubernetes (deploy/kubernetes/)."""

from __future__ import annotations

from pathlib import Path

import click

from fleet.cli._sections import WholeHelpGroup


@click.group(cls=WholeHelpGroup)
def kubernetes() -> None:
    """Workers on Kubernetes: GPU Deployments scaled by KEDA on their queues (deploy/kubernetes/)."""


@kubernetes.command("render")
@click.option("--target", required=True, help="The target the workers serve (sm_90, gfx90a, ...).")
@click.option("--gpus", type=click.IntRange(1), default=1, show_default=True, help="GPUs of each evaluation pod.")
@click.option("--max-pods", type=click.IntRange(1), default=4, show_default=True, help="KEDA's most pods per role.")
@click.option(
    "--stop-timeout",
    type=click.IntRange(1),
    default=840,
    show_default=True,
    help="Seconds a stopped pod waits for its running trial; its grace period is 30 s more.",
)
@click.option("--out", type=click.Path(path_type=Path), help="Write the kustomize folder here (default: print it).")
def render(target: str, gpus: int, max_pods: int, stop_timeout: int, out: Path | None) -> None:
    """A target's kustomize folder: eval workers with GPU requests, build workers, their KEDA ScaledObjects."""
    from fleet.ops.kubernetes import target_files, write

    files = target_files(target, gpus, max_pods, stop_timeout)
    if out is None:
        click.echo("---\n".join(files[name] for name in ("workers.yaml", "scaling.yaml")), nl=False)
        return
    for path in write(out, files):
        click.echo(path)


COMMANDS = (kubernetes,)
