"""The ``command`` workload: build and run argument lists filled from knob values.

Definition (JSON)::

    {"kind": "command",
     "bundle": "<digest of the source files>",
     "build": ["gcc", "-O2", "-DTILE={tile}", {"if": "fast_math", "then": ["-ffast-math"]}, "k.c", "-o", "k"],
     "artifacts": ["k"],
     "run": ["./k", "{n}"],
     "objective": {"name": "gflops", "goal": "max", "json": "gflops"},   # or "regex": "GFLOPS: (\\S+)"
     # or several: "objectives": [{"name": "time", "json": "ms"}, {"name": "energy", "observer": "energy"}]
     "repeats": 3, "warmup": 1, "build_timeout": 120, "run_timeout": 60,
     "network": false,                                                  # true: the commands keep the network
     "resident": false,                                                 # true: the run command is kept running
     "clocks": {"sm": "sm_clock", "memory": "mem_clock"}}               # knobs: each run's GPU clocks (MHz)

``{name}`` in an argument is replaced by the knob or problem parameter ``name`` (``{{`` for a brace);
booleans become ``1``/``0``. An ``{"if": KNOB, "then": [...], "else": [...]}`` item adds arguments when the
knob is true. The result is always a list of arguments; no shell ever sees it. Both commands, and the
toolchain probe, run in the worker's sandbox (:mod:`fleet.workers.sandbox`).

A ``resident`` run command is started once by an evaluation process and kept between runs, in the sandbox
(:class:`fleet.workers.runner.Resident`): each run is a line on its stdin, ``{"dir": FOLDER}``, the folder holding
the run's artifact, and it answers with one JSON line on stdout (the objective must be ``json``). For commands
whose start costs more than their run (importing TVM to time a module).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.errors import SpecError, did_you_mean
from fleet.limits import TIMEOUT_SECONDS
from fleet.objective import Objective
from fleet.spec.workloads.base import WorkloadSpec
from fleet.spec.workloads.objectives import check_objectives, objective_of

_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_KEYS = {
    "kind",
    "bundle",
    "build",
    "artifacts",
    "run",
    "objective",
    "objectives",
    "repeats",
    "warmup",
    "build_timeout",
    "run_timeout",
    "toolchain",
    "env",
    "network",
    "resident",
    "clocks",
}
_OBJECTIVE_KEYS = {"name", "json", "regex", "goal", "observer"}
# Shells whose script names the compiler: the default toolchain probe looks for it there.
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}
# Programs whose ``--version`` names a toolchain, looked for in a shell build's script.
_COMPILERS = {
    "cc", "gcc", "g++", "c++", "clang", "clang++", "nvcc", "hipcc", "icx", "icpx", "gfortran", "rustc",
    "go", "javac", "make", "cmake", "ninja", "python", "python3", "amdclang", "amdclang++", "nvc", "nvc++",
}  # fmt: skip
ARTIFACT_NAME_LIMIT = 255
# What a GPU worker's observer reads while a trial runs (fleet.workers.observers): an objective may be one of them.
OBSERVED = (
    "energy",
    "power_w",
    "power_max_w",
    "sm_clock_mhz",
    "sm_clock_min_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "observed_seconds",
)


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def fill(template: Sequence[Any], values: Mapping[str, Any]) -> list[str]:
    """The argument list of ``template`` with ``values`` filled in."""
    argv: list[str] = []
    for item in template:
        if isinstance(item, Mapping):
            chosen = item.get("then", []) if values[item["if"]] else item.get("else", [])
            argv.extend(fill(chosen, values))
            continue

        def field(match: re.Match[str]) -> str:
            token = match.group(0)
            if token in ("{{", "}}"):
                return token[0]
            return _render(values[match.group(1)])

        argv.append(_FIELD.sub(field, item))
    return argv


def names_in(template: Sequence[Any]) -> set[str]:
    """The knob and parameter names a template uses."""
    names: set[str] = set()
    for item in template:
        if isinstance(item, Mapping):
            names.add(item["if"])
            names |= names_in(item.get("then", [])) | names_in(item.get("else", []))
        else:
            names |= {m.group(1) for m in _FIELD.finditer(item) if m.group(1)}
    return names


def _check_template(where: str, template: Any) -> None:
    if not isinstance(template, list) or not template:
        raise SpecError(f"workload {where!r} must be a non-empty list of arguments (a shell string is not allowed)")
    for item in template:
        if isinstance(item, Mapping):
            if set(item) - {"if", "then", "else"} or not isinstance(item.get("if"), str):
                raise SpecError(
                    f"workload {where!r}: a conditional item is {{'if': KNOB, 'then': [...], 'else': [...]}}"
                )
            for branch in ("then", "else"):
                if item.get(branch):
                    _check_template(where, item[branch])
        elif not isinstance(item, str):
            raise SpecError(f"workload {where!r}: argument {item!r} is not a string")


class CommandSpec(WorkloadSpec):
    """Build with one command and measure with another; see the module docstring."""

    kind = "command"

    def __init__(self, definition: Mapping[str, Any]) -> None:
        super().__init__(definition)
        d = self.definition
        unknown = set(d) - _KEYS
        if unknown:
            first = sorted(unknown)[0]
            raise SpecError(f"workload has an unknown field {first!r}{did_you_mean(first, sorted(_KEYS))}")
        if d.get("build") is not None:
            _check_template("build", d["build"])
        _check_template("run", d.get("run"))
        if "objectives" in d:
            if "objective" in d:
                raise SpecError("the workload names 'objective' and 'objectives': one objective, or several, not both")
            check_objectives(d["objectives"], OBSERVED)
        objective = d.get("objective") if "objectives" not in d else self._json_objective
        # A mistyped field first: 'jsn' would otherwise read as no 'json' given.
        unknown_keys = sorted(set(objective) - _OBJECTIVE_KEYS) if isinstance(objective, Mapping) else []
        if unknown_keys:
            hint = did_you_mean(unknown_keys[0], sorted(_OBJECTIVE_KEYS))
            raise SpecError(f"workload objective has an unknown field {unknown_keys[0]!r}{hint}")
        if not isinstance(objective, Mapping) or ("json" in objective) == ("regex" in objective):
            raise SpecError("workload 'objective' must name a 'json' field or a 'regex' with one group")
        if objective.get("goal", "min") not in ("min", "max"):
            raise SpecError("workload objective 'goal' must be 'min' or 'max'")
        if "observer" in objective and objective["observer"] not in OBSERVED:
            hint = did_you_mean(objective["observer"], OBSERVED)
            raise SpecError(
                f"workload objective 'observer' {objective['observer']!r} is no reading of a GPU observer{hint}: "
                f"one of {', '.join(OBSERVED)}"
            )
        if "regex" in objective:
            try:
                pattern = re.compile(objective["regex"])
            except re.error as error:
                raise SpecError(f"workload objective regex: {error}") from None
            if pattern.groups != 1:
                raise SpecError("workload objective regex must have exactly one group")
        for name, low in (("repeats", 1), ("warmup", 0)):
            value = d.get(name, low)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise SpecError(f"workload {name!r} must be an integer >= {low}")
        for name in ("build_timeout", "run_timeout"):
            value = d.get(name, 1)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= TIMEOUT_SECONDS:
                raise SpecError(
                    f"workload {name!r} must be a number of seconds, more than 0 and at most {TIMEOUT_SECONDS:g}"
                )
        toolchain = d.get("toolchain")
        if toolchain is not None and (
            not isinstance(toolchain, list) or not toolchain or not all(isinstance(a, str) for a in toolchain)
        ):
            raise SpecError("workload 'toolchain' must be a non-empty list of arguments, such as ['gcc', '--version']")
        artifacts = d.get("artifacts", [])
        if not isinstance(artifacts, list) or not all(isinstance(a, str) for a in artifacts):
            raise SpecError("workload 'artifacts' must be a list of file names the build produces")
        for name in artifacts:
            _check_artifact_name(name)
        if not isinstance(d.get("network", False), bool):
            raise SpecError("workload 'network' must be true or false")
        if not isinstance(d.get("resident", False), bool):
            raise SpecError("workload 'resident' must be true or false")
        _check_clocks(d.get("clocks"))
        if d.get("resident") and "json" not in objective:
            raise SpecError(
                "a resident workload answers each run with a JSON line: its objective must name a 'json' field"
            )

    @property
    def objective_name(self) -> str:
        return self.objectives[0].name

    @property
    def maximize(self) -> bool:
        return self.objectives[0].maximize

    @property
    def objectives(self) -> list[Objective]:
        return [objective_of(o) for o in self.definition.get("objectives") or [self.definition["objective"]]]

    @property
    def _json_objective(self) -> dict[str, Any]:
        """The objective whose field a run's JSON line must have: the only one, or the first of several read from
        the line (its samples are the measurement's)."""
        if "objectives" not in self.definition:
            return self.definition["objective"]
        return next(o for o in self.definition["objectives"] if "json" in o)

    def check(self, knobs: list[str], problem: Mapping[str, Any]) -> None:
        known = set(knobs) | set(problem)
        for part, name in (self.definition.get("clocks") or {}).items():
            if name not in known:
                raise SpecError(
                    f"workload 'clocks' {part!r} names {name!r}, which is neither a knob nor a problem parameter"
                )
        for where in ("build", "run"):
            for name in sorted(names_in(self.definition.get(where) or [])):
                if name not in known:
                    raise SpecError(
                        f"workload {where!r} uses {{{name}}}, which is neither a knob nor a problem parameter"
                        f"{did_you_mean(name, sorted(known))}"
                    )

    def toolchain_argv(self) -> list[str] | None:
        """The command whose first line of output names the toolchain.

        ``toolchain`` when the spec gives one; else the build's program with ``--version``; for a build that is a
        shell script (``["sh", "-c", "gcc ..."]``), the first compiler the script names, or none (a shell's
        ``--version`` names the shell, and ``sh`` has none).
        """
        if self.definition.get("toolchain"):
            return list(self.definition["toolchain"])
        build = self.definition.get("build")
        if not build or not isinstance(build[0], str):
            return None
        if os.path.basename(build[0]) not in _SHELLS:
            return [build[0], "--version"]
        words = re.split(r"[\s;&|()`]+", " ".join(a for a in build[1:] if isinstance(a, str)))
        named = next((w for w in words if os.path.basename(w) in _COMPILERS), None)
        return [named, "--version"] if named else None

    def toolchain_key(self) -> str:
        return json.dumps([self.kind, self.toolchain_argv()])


def _check_clocks(clocks: Any) -> None:
    """``clocks``: the knobs that hold each run's SM clock (and memory clock), in MHz."""
    if clocks is None:
        return
    if not isinstance(clocks, Mapping) or "sm" not in clocks or set(clocks) - {"sm", "memory"}:
        raise SpecError("workload 'clocks' must be {'sm': KNOB} or {'sm': KNOB, 'memory': KNOB}: the knobs holding MHz")
    for part, name in clocks.items():
        if not isinstance(name, str) or not name:
            raise SpecError(f"workload 'clocks' {part!r} must name a knob, such as 'sm_clock'")


def _check_artifact_name(name: str) -> None:
    """Refuse an artifact name that could name a file outside the build's scratch directory."""
    parts = name.split("/")
    if not name or name.startswith("/") or ".." in parts or "\0" in name or len(name) > ARTIFACT_NAME_LIMIT:
        raise SpecError(
            f"workload artifact {name[:80]!r} must be a relative name inside the build's directory "
            f"(no leading '/', no '..', at most {ARTIFACT_NAME_LIMIT} characters)"
        )
