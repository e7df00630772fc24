"""Workers on Kubernetes: the manifests of ``deploy/kubernetes/``, written from one place.

The kustomize tree has a base (the migration Job, the drivers, Flower, KEDA's credentials for Redis), a trial
PostgreSQL and Redis, one folder per target (its evaluation workers with GPU requests, its build workers without,
and a KEDA ScaledObject per queue scaling them from zero on the length of ``eval.<target>`` / ``build.<target>``),
and an overlay putting them together. ``fleet kubernetes render --target T --gpus G`` writes a target's folder;
:func:`tree` is the whole committed tree, which a test keeps equal to what is in the repository.

Every pod runs as the image's unprivileged account with a read-only root filesystem, no capability, no privilege
escalation, the runtime's default seccomp profile and no service-account token (Fleet never calls the API
server). The fleet's URLs are a Secret mounted as files that ``FLEET_*_URL_FILE`` name, never environment
variables. Worker containers are probed with ``fleet worker --check`` (:func:`probes`). A worker pod's SIGTERM
drains it: ``fleet worker`` takes no new trial and waits up to ``--stop-timeout`` for the running one, which
``terminationGracePeriodSeconds`` leaves room for.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet.errors import FleetError

IMAGE = "fleet-tune"  # the name the overlay's `images:` entry points at a registry
UID = 10001  # the Dockerfile's fleet account
SECRET = "fleet-urls"  # keys database-url and broker-url: the fleet's URLs
KEDA_SECRET = "fleet-keda-redis"  # keys address (host:port) and password: what KEDA's Redis scaler reads
SERVICES_SECRET = "fleet-services"  # keys postgres-password and redis-password: the trial services' own
SECRET_FOLDER = "/run/secrets/fleet"
HOME = "/var/lib/fleet"
DEFAULT_STOP_TIMEOUT = 840  # fleet worker's own default: the longest measurement a stop waits for
GRACE_MARGIN = 30  # seconds for Celery to leave the broker after the running trial ended
EXAMPLE_TARGET = "sm_90"
# Secrets the operator creates (docs/operations.md says how); every other one a pod names is a mistake.
OPERATOR_SECRETS = (SECRET, KEDA_SECRET, SERVICES_SECRET)


class KubernetesError(FleetError):
    """A value that has no place in the manifests."""


def resource_name(target: str) -> str:
    """``target`` as part of an object's name (DNS-1123: lowercase letters, digits and '-'): sm_90 -> sm-90."""
    name = re.sub(r"[^a-z0-9]+", "-", target.lower()).strip("-")
    if not name or len(name) > 40:
        raise KubernetesError(f"target {target!r} gives no usable Kubernetes name")
    return name


def gpu_resource(target: str) -> str:
    """The extended resource a GPU of ``target`` is requested as: AMD's device plugin for gfx, NVIDIA's otherwise."""
    return "amd.com/gpu" if target.startswith("gfx") else "nvidia.com/gpu"


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security(uid: int = UID) -> dict[str, Any]:
    # fsGroup makes the Secret's files (mode 0440, owned by root) readable by the account and nobody else.
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def fleet_env() -> list[dict[str, str]]:
    """Every Fleet container's environment: where its URLs' files are, where it keeps its state. No secret."""
    return [
        {"name": "FLEET_DATABASE_URL_FILE", "value": f"{SECRET_FOLDER}/database-url"},
        {"name": "FLEET_BROKER_URL_FILE", "value": f"{SECRET_FOLDER}/broker-url"},
        {"name": "FLEET_HOME", "value": HOME},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


def fleet_volumes() -> list[dict[str, Any]]:
    """The URLs' Secret, and the writable folders a read-only root filesystem leaves Fleet: its home and /tmp."""
    items = [{"key": "database-url", "path": "database-url"}, {"key": "broker-url", "path": "broker-url"}]
    return [
        {"name": "fleet-urls", "secret": {"secretName": SECRET, "defaultMode": 0o440, "items": items}},
        {"name": "home", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]


def fleet_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "fleet-urls", "mountPath": SECRET_FOLDER, "readOnly": True},
        {"name": "home", "mountPath": HOME},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def labels(component: str, target: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "fleet", "app.kubernetes.io/component": component}
    if target:
        out["fleet.example/target"] = resource_name(target)
    return out


def fleet_container(name: str, command: list[str], resources: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "command": command,
        "env": fleet_env(),
        "volumeMounts": fleet_mounts(),
        "resources": dict(resources),
        "securityContext": container_security(),
    }


def pod_spec(containers: list[dict[str, Any]], grace: int | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # Fleet never talks to the API server
        "enableServiceLinks": False,  # no service addresses in the environment either
        "securityContext": pod_security(),
        "containers": containers,
        "volumes": fleet_volumes(),
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return spec | extra


def deployment(name: str, component: str, pod: dict[str, Any], replicas: int, target: str | None = None) -> dict:
    selected = labels(component, target)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": selected},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selected},
            "template": {"metadata": {"labels": selected}, "spec": pod},
        },
    }


def worker_command(target: str, role: str, gpus: int, stop_timeout: int) -> list[str]:
    """The container's command: ``fleet worker`` of one role on the pod's GPUs (the device plugin numbers the GPUs
    it gives a container from 0), draining within ``stop_timeout`` seconds of SIGTERM."""
    command = ["fleet", "worker", "--target", target, "--role", role, "--stop-timeout", str(stop_timeout)]
    if role == "eval" and not target.startswith("cpu"):
        command += ["--gpus", ",".join(str(i) for i in range(gpus))]
    return command


def probes(command: list[str]) -> dict[str, Any]:
    """The readiness and liveness probes of a worker container running ``command``: ``fleet worker --check`` with
    the same options, which asks the database, the broker, the sandbox and the pod's GPUs.

    Readiness says within a minute that the pod cannot work. Liveness restarts the container only after five
    minutes of failures: a worker waits out a database or broker outage by itself (FLEET_DB_OUTAGE_SECONDS) and a
    restart would cost its running measurement, while a pod whose GPU or sandbox went away gains from one. A check
    starts a Python process, asks the vendor's tool and the services: seconds, not milliseconds, hence the periods.
    """
    check = {"exec": {"command": [*command, "--check"]}, "timeoutSeconds": 20}
    return {
        "readinessProbe": check | {"initialDelaySeconds": 5, "periodSeconds": 30, "failureThreshold": 2},
        "livenessProbe": check | {"initialDelaySeconds": 60, "periodSeconds": 60, "failureThreshold": 5},
    }


def eval_workers(target: str, gpus: int, stop_timeout: int) -> dict[str, Any]:
    """The evaluation workers of ``target``: one pod per ``gpus`` GPUs, one worker process per GPU; KEDA sets the
    replicas (0 here, so that applying the manifests starts nothing until work is queued)."""
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}
    if not target.startswith("cpu"):
        resources["requests"][gpu_resource(target)] = str(gpus)
        resources["limits"][gpu_resource(target)] = str(gpus)  # extended resources: requests equal limits
    command = worker_command(target, "eval", gpus, stop_timeout)
    container = fleet_container("worker", command, resources) | probes(command)
    pod = pod_spec([container], grace=stop_timeout + GRACE_MARGIN)
    return deployment(f"fleet-eval-{resource_name(target)}", "eval-worker", pod, 0, target)


def build_workers(target: str, stop_timeout: int) -> dict[str, Any]:
    """The build workers of ``target``: no GPU, the pod's cores; builds are short, they drain like the others."""
    resources = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}
    command = worker_command(target, "build", 0, stop_timeout)
    container = fleet_container("worker", command, resources) | probes(command)
    pod = pod_spec([container], grace=stop_timeout + GRACE_MARGIN)
    return deployment(f"fleet-build-{resource_name(target)}", "build-worker", pod, 0, target)


def scaled_object(deployment_name: str, queue: str, per_pod: int, max_replicas: int) -> dict[str, Any]:
    """KEDA's ScaledObject scaling ``deployment_name`` on the length of the Redis list ``queue`` (kombu keeps a
    queue's waiting messages in a list of its name): ``per_pod`` messages per replica, from zero.

    A message a worker took leaves the list, so the length falls while trials run: scaling down waits five
    minutes (the HPA's stabilization window) and a pod it stops drains its running trial first.
    """
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": deployment_name, "labels": {"app.kubernetes.io/name": "fleet"}},
        "spec": {
            "scaleTargetRef": {"name": deployment_name},
            "minReplicaCount": 0,
            "maxReplicaCount": max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
                },
            },
            "triggers": [
                {
                    "type": "redis",
                    "metadata": {"listName": queue, "listLength": str(per_pod), "activationListLength": "0"},
                    "authenticationRef": {"name": "fleet-redis"},
                }
            ],
        },
    }


def target_objects(target: str, gpus: int = 1, max_pods: int = 4, stop_timeout: int = DEFAULT_STOP_TIMEOUT) -> list:
    """Everything ``target`` needs: its workers and the ScaledObjects scaling them."""
    from fleet.targets import check_target

    check_target(target)
    if gpus < 1 or max_pods < 1 or stop_timeout < 1:
        raise KubernetesError("--gpus, --max-pods and --stop-timeout are at least 1")
    evals, builds = eval_workers(target, gpus, stop_timeout), build_workers(target, stop_timeout)
    return [
        evals,
        builds,
        scaled_object(evals["metadata"]["name"], f"eval.{target}", gpus, max_pods),
        # A build pod takes several builds at once; two queued per pod is enough to add one.
        scaled_object(builds["metadata"]["name"], f"build.{target}", 2, max_pods),
    ]


def base_objects() -> list[dict[str, Any]]:
    """The fleet's own pods: the migration Job, the drivers, Flower; KEDA's credentials for Redis."""
    small = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    migrate = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "fleet-migrate", "labels": labels("migrate")},
        "spec": {
            "backoffLimit": 6,  # PostgreSQL may still be starting
            "template": {
                "metadata": {"labels": labels("migrate")},
                "spec": pod_spec(
                    [fleet_container("migrate", ["fleet", "db", "upgrade"], small)], restartPolicy="Never"
                ),
            },
        },
    }
    # Drivers hold campaigns under leases: two are safe, and one takes over when the other's node goes.
    driver = deployment(
        "fleet-driver", "driver", pod_spec([fleet_container("driver", ["fleet", "driver"], small)], grace=60), 2
    )
    flower_container = fleet_container(
        "flower", ["celery", "-A", "fleet.tasks", "flower", "--address=0.0.0.0", "--port=5555"], small
    )
    flower_container["ports"] = [{"name": "http", "containerPort": 5555}]
    flower = deployment("fleet-flower", "flower", pod_spec([flower_container]), 1)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "fleet-flower", "labels": labels("flower")},
        "spec": {"selector": labels("flower"), "ports": [{"name": "http", "port": 5555, "targetPort": "http"}]},
    }
    auth = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {"name": "fleet-redis", "labels": {"app.kubernetes.io/name": "fleet"}},
        "spec": {
            "secretTargetRef": [
                {"parameter": "address", "name": KEDA_SECRET, "key": "address"},
                {"parameter": "password", "name": KEDA_SECRET, "key": "password"},
            ]
        },
    }
    return [migrate, driver, flower, service, auth]


def _service_pod(name: str, image: str, uid: int, command: list[str], port: int, data: str) -> dict[str, Any]:
    container = {
        "name": name,
        "image": image,
        "command": command,
        "ports": [{"name": name, "containerPort": port}],
        "volumeMounts": [
            {"name": "passwords", "mountPath": "/run/secrets/services", "readOnly": True},
            {"name": "data", "mountPath": data},
            {"name": "run", "mountPath": "/var/run/postgresql" if name == "postgres" else "/run/redis"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": container_security(),
    }
    if name == "postgres":
        container["env"] = [
            {"name": "POSTGRES_USER", "value": "fleet"},
            {"name": "POSTGRES_DB", "value": "fleet"},
            {"name": "POSTGRES_PASSWORD_FILE", "value": "/run/secrets/services/postgres-password"},
            {"name": "PGDATA", "value": f"{data}/pgdata"},
        ]
    volumes = [
        {"name": "passwords", "secret": {"secretName": SERVICES_SECRET, "defaultMode": 0o440}},
        {"name": "run", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(uid),
        "containers": [container],
        "volumes": volumes,
    }
    return spec


def services_objects() -> list[dict[str, Any]]:
    """A PostgreSQL and a Redis for a trial setup (one replica each, a volume each): production brings its own."""
    # Redis reads its password from a config file written at start, never its command line or environment.
    redis_start = (
        "printf 'requirepass %s\\nappendonly yes\\nmaxmemory-policy noeviction\\ndir /data\\n' "
        '"$(cat /run/secrets/services/redis-password)" > /tmp/redis.conf && exec redis-server /tmp/redis.conf'
    )
    out = []
    for name, image, uid, command, port, data in (
        ("postgres", "postgres:16-bookworm", 999, ["docker-entrypoint.sh", "postgres"], 5432, "/var/lib/postgresql"),
        ("redis", "redis:7-bookworm", 999, ["sh", "-c", redis_start], 6379, "/data"),
    ):
        selected = labels(name)
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": f"fleet-{name}", "labels": selected},
                "spec": {
                    "serviceName": f"fleet-{name}",
                    "replicas": 1,
                    "selector": {"matchLabels": selected},
                    "template": {
                        "metadata": {"labels": selected},
                        "spec": _service_pod(name, image, uid, command, port, data),
                    },
                    "volumeClaimTemplates": [
                        {
                            "metadata": {"name": "data"},
                            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
                        }
                    ],
                },
            }
        )
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"fleet-{name}", "labels": selected},
                "spec": {"selector": selected, "ports": [{"name": name, "port": port, "targetPort": name}]},
            }
        )
    return out


def to_yaml(value: Any, indent: int = 0) -> str:
    """``value`` (dicts, lists, strings, numbers, bools) as block YAML; every string double-quoted the JSON way,
    which YAML reads back as the same string (no ``yes`` read as true, no ``0440`` as octal)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}\n")
        return "".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            text = to_yaml(item, indent + 2) if isinstance(item, (dict, list)) and item else f"{_scalar(item)}\n"
            lines.append(f"{pad}- {text.lstrip()}")
        return "".join(lines)
    return pad + _scalar(value) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value)  # true/false, numbers, "strings"


def documents(objects: list[dict[str, Any]]) -> str:
    return "---\n".join(to_yaml(o) for o in objects)


HEADER = "# Written by fleet.ops.kubernetes ({how}); edit with an overlay or regenerate.\n"


def kustomization(resources: list[str], **extra: Any) -> str:
    body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **extra, "resources": resources}
    return to_yaml(body)


def target_files(target: str, gpus: int = 1, max_pods: int = 4, stop_timeout: int = DEFAULT_STOP_TIMEOUT) -> dict:
    """A target's kustomize folder: file name -> text."""
    how = f"fleet kubernetes render --target {target} --gpus {gpus} --max-pods {max_pods}"
    if stop_timeout != DEFAULT_STOP_TIMEOUT:
        how += f" --stop-timeout {stop_timeout}"
    header = HEADER.format(how=how)
    evals, builds, scale_evals, scale_builds = target_objects(target, gpus, max_pods, stop_timeout)
    return {
        "kustomization.yaml": header + kustomization(["workers.yaml", "scaling.yaml"]),
        "workers.yaml": header + documents([evals, builds]),
        "scaling.yaml": header + documents([scale_evals, scale_builds]),
    }


def tree() -> dict[str, str]:
    """The committed ``deploy/kubernetes/`` tree: relative path -> text."""
    header = HEADER.format(how="python -m fleet.ops.kubernetes deploy/kubernetes")
    files = {
        "base/kustomization.yaml": header + kustomization(["fleet.yaml"]),
        "base/fleet.yaml": header + documents(base_objects()),
        "services/kustomization.yaml": header + kustomization(["services.yaml"]),
        "services/services.yaml": header + documents(services_objects()),
        "overlays/trial/kustomization.yaml": header
        + kustomization(
            ["../../base", "../../services", f"../../targets/{EXAMPLE_TARGET}"],
            namespace="fleet",
            images=[{"name": IMAGE, "newName": "registry.example.com/fleet-tune", "newTag": "0.1.0"}],
        ),
    }
    files |= {f"targets/{EXAMPLE_TARGET}/{name}": text for name, text in target_files(EXAMPLE_TARGET).items()}
    return files


def write(folder: Path, files: Mapping[str, str]) -> list[Path]:
    written = []
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":  # python -m fleet.ops.kubernetes deploy/kubernetes: regenerate the committed tree
    for each in write(Path(sys.argv[1]), tree()):
        print(each)
