"""Spaces: the knobs, their values, and which configurations are valid.

A knob is *build-time* (changing it needs a new build) or *run-time* (the same artifact runs with another
value). Configurations are plain dicts of knob name -> bool, number or string.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# digest and build_part are re-exported for callers that predate fleet.canonical.
from fleet.canonical import build_part, canonical_json, digest  # noqa: F401
from fleet.errors import SpecError, did_you_mean, shown
from fleet.expr import Expression, TooCostly, Undefined

Value = bool | int | float | str
Config = dict[str, Value]


MAX_CONSTRAINTS = 100
"""Constraints of one space: each is evaluated for every configuration a search looks at."""
MAX_INTEGER_BITS = 64
"""Integers among values fit in 64 bits: a 5000-digit one cannot even be written as text (Python's limit is 4300)."""
VALUE_BYTES = 4096
"""Bytes of a string value (a knob's, a problem parameter's): it fills command arguments, keys and every row."""


def check_value(where: str, value: Any) -> Value:
    """Return ``value`` if it is a bool, a finite number or a string, else raise :class:`SpecError`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INTEGER_BITS:
            raise SpecError(f"{where}: {shown(value)} is larger than an integer of {MAX_INTEGER_BITS} bits")
        return value
    if isinstance(value, str):
        size = len(value.encode(errors="surrogatepass"))
        if size > VALUE_BYTES:
            raise SpecError(f"{where}: a string of {size} bytes; at most {VALUE_BYTES} are allowed")
        return check_text(where, value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise SpecError(f"{where}: {shown(value)} is not a bool, number or string")


def check_text(where: str, text: str) -> str:
    """``text`` if it can be stored: no NUL (PostgreSQL refuses it) and no lone surrogate (not UTF-8)."""
    if "\0" in text:
        raise SpecError(f"{where}: {shown(text)} holds a NUL character")
    try:
        text.encode()
    except UnicodeEncodeError:
        # JSON's "\ud800" reads as a lone surrogate, which neither UTF-8 nor the database can hold.
        raise SpecError(f"{where}: {shown(text)} is not valid Unicode (a lone surrogate)") from None
    return text


@dataclass(frozen=True)
class Knob:
    """One tunable parameter.

    Parameters
    ----------
    name:
        An identifier; it fills ``{name}`` in build and run templates.
    values:
        The values to try, in order.
    build:
        True for a build-time knob, False for a run-time one.
    """

    name: str
    values: tuple[Value, ...]
    build: bool = True

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise SpecError(f"knob name {self.name!r} is not an identifier")
        if not self.values:
            raise SpecError(f"knob {self.name!r} has no values")
        for value in self.values:
            check_value(f"knob {self.name!r}", value)
        if len({canonical_json(v) for v in self.values}) != len(self.values):
            raise SpecError(f"knob {self.name!r} lists a value twice")


@dataclass(frozen=True)
class Space:
    """Knobs, constraints over them, and an optional validity predicate.

    Parameters
    ----------
    knobs:
        The knobs, build-time ones first in iteration order.
    constraints:
        Expressions that a valid configuration makes true.
    predicate:
        A Python callable (from a trusted spec file) that gets the base overlaid with the configuration.
    base:
        Values the configuration overlays before the predicate sees it.
    """

    knobs: tuple[Knob, ...]
    constraints: tuple[Expression, ...] = ()
    predicate: Callable[[Config], bool] | None = field(default=None, compare=False)
    base: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.knobs:
            raise SpecError("the space has no knobs")
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise SpecError("the space names a knob twice")
        if len(self.constraints) > MAX_CONSTRAINTS:
            raise SpecError(f"the space has {len(self.constraints)} constraints; at most {MAX_CONSTRAINTS} are allowed")
        for constraint in self.constraints:
            unknown = constraint.names - set(names) - set(self.base)
            if unknown:
                first = sorted(unknown)[0]
                hint = did_you_mean(first, [*names, *self.base])
                raise SpecError(f"constraint {constraint.text!r} names {first!r}, which is not a knob{hint}")
        # Build-time knobs vary slowest, so iterating the space builds each build key once, in one run.
        ordered = tuple(sorted(self.knobs, key=lambda k: not k.build))
        object.__setattr__(self, "knobs", ordered)

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.knobs]

    @property
    def build_knobs(self) -> list[str]:
        return [k.name for k in self.knobs if k.build]

    @property
    def run_knobs(self) -> list[str]:
        return [k.name for k in self.knobs if not k.build]

    def knob(self, name: str) -> Knob:
        for knob in self.knobs:
            if knob.name == name:
                return knob
        raise SpecError(f"{name!r} is not a knob of this space{did_you_mean(name, self.names)}")

    @property
    def size(self) -> int:
        """The number of configurations before constraints."""
        return math.prod(len(k.values) for k in self.knobs)

    def decode(self, index: int) -> Config:
        """The configuration at ``index`` of the unconstrained product, in iteration order."""
        config: Config = {}
        for knob in reversed(self.knobs):
            index, digit = divmod(index, len(knob.values))
            config[knob.name] = knob.values[digit]
        return {name: config[name] for name in self.names}

    def is_valid(self, config: Mapping[str, Value]) -> bool:
        values = {**self.base, **config}
        try:
            if not all(constraint(values) for constraint in self.constraints):
                return False
        except Undefined:
            return False
        return self.predicate is None or bool(self.predicate(dict(values)))

    SAMPLE = 256
    """Configurations :meth:`check_constraints` evaluates the constraints on, at most."""
    CHECK_STEPS = 500_000
    """Steps after which :meth:`check_constraints` stops sampling: well under a second, whatever the constraints."""

    def sample(self, count: int) -> list[Config]:
        """Up to ``count`` configurations of the unconstrained product, the same ones every time: all of them
        when there are no more, else the first and the last, each value of each knob (as far as ``count``
        allows) and random ones, drawn with a seed of the space's size.
        """
        size = self.size
        if size <= count:
            return [self.decode(index) for index in range(size)]
        chance = random.Random(size)
        indices = dict.fromkeys([0, size - 1])
        stride = 1
        for knob in reversed(self.knobs):
            # Value ``position`` of this knob, the others' values drawn: knobs after it vary within ``stride``.
            above = size // (stride * len(knob.values))
            for position in range(min(len(knob.values), count)):
                high, low = chance.randrange(above), chance.randrange(stride)
                indices.setdefault((high * len(knob.values) + position) * stride + low)
            stride *= len(knob.values)
        while len(indices) < count:
            indices.setdefault(chance.randrange(size))
        return [self.decode(index) for index in list(indices)[:count]]

    def check_constraints(self) -> None:
        """Refuse constraints that pass the cost bound (:mod:`fleet.expr`) on a sampled configuration.

        Each is evaluated as :meth:`is_valid` does, in order until one is false, on :meth:`sample`; on fewer
        configurations when they are costly, so that the check itself takes well under a second.
        """
        if not self.constraints:
            return
        spent = 0
        for config in self.sample(self.SAMPLE):
            values = {**self.base, **config}
            for constraint in self.constraints:
                try:
                    value, steps = constraint.measure(values)
                except TooCostly as error:
                    at = " ".join(f"{name}={shown(knob_value, 24)}" for name, knob_value in config.items())
                    at = at if len(at) <= 160 else at[:157] + "..."
                    raise SpecError(
                        f"constraint {shown(constraint.text)} cannot be evaluated at {at}: {error}"
                    ) from None
                except Undefined:
                    break
                spent += steps
                if not value:
                    break
            if spent > self.CHECK_STEPS:
                return

    EMPTY_SECONDS = 1.0
    """How long :meth:`check_not_empty` looks for a valid configuration before it leaves the question open."""

    def check_not_empty(self) -> None:
        """Refuse a space whose constraints (or predicate) leave no configuration, in one line naming the ones to
        blame: the campaign would otherwise run no trial and end with "no valid measurement".

        It looks through the product in order until a configuration is valid, for at most
        :data:`EMPTY_SECONDS`; a larger space whose valid configurations are that rare passes unchecked.
        """
        if not self.constraints and self.predicate is None:
            return
        deadline = time.monotonic() + self.EMPTY_SECONDS
        ever_true = [False] * len(self.constraints)
        predicate_true = False
        for index, values in enumerate(itertools.product(*(k.values for k in self.knobs))):
            if index % 64 == 63 and time.monotonic() > deadline:
                return
            config = {**self.base, **dict(zip(self.names, values, strict=True))}
            passed = True
            for position, constraint in enumerate(self.constraints):
                try:
                    truth = bool(constraint(config))
                except Undefined:
                    truth = False
                ever_true[position] = ever_true[position] or truth
                passed = passed and truth
            if self.predicate is not None and (passed or not predicate_true):
                verdict = bool(self.predicate(dict(config)))
                predicate_true = predicate_true or verdict
                passed = passed and verdict
            if passed:
                return
        never = [shown(c.text) for c, true in zip(self.constraints, ever_true, strict=True) if not true]
        if self.predicate is not None and not predicate_true:
            never.append("META_is_config_valid")
        count = f"all {self.size} configurations" if self.size > 1 else "its one configuration"
        if len(never) == 1:
            why = f"{never[0]} is false for {count}"
        elif never:
            why = f"{', '.join(never)} are false for {count}"
        else:
            texts = [shown(c.text) for c in self.constraints] + (["META_is_config_valid"] if self.predicate else [])
            why = f"{' and '.join(texts)} are never true together in {count}"
        raise SpecError(f"the space's constraints leave no configuration to try: {why}")

    def __iter__(self) -> Iterator[Config]:
        """Every valid configuration, build-time knobs varying slowest."""
        for values in itertools.product(*(k.values for k in self.knobs)):
            config = dict(zip(self.names, values, strict=True))
            if self.is_valid(config):
                yield config

    def check(self, config: Mapping[str, Any]) -> Config:
        """Return ``config`` with knobs in space order if it names every knob with a value of the space."""
        missing = [name for name in self.names if name not in config]
        if missing:
            raise SpecError(f"configuration {dict(config)} lacks knob {missing[0]!r}")
        extra = [name for name in config if name not in self.names]
        if extra:
            hint = did_you_mean(extra[0], self.names)
            raise SpecError(f"configuration names {extra[0]!r}, which is not a knob{hint}")
        return {name: check_value(f"knob {name!r}", config[name]) for name in self.names}

    def build_part(self, config: Mapping[str, Value]) -> Config:
        """The build-time knobs of ``config``: what decides the artifact."""
        return {name: config[name] for name in self.build_knobs if name in config}

    def to_dict(self) -> dict[str, Any]:
        return {
            "knobs": {k.name: {"values": list(k.values), "build": k.build} for k in self.knobs},
            "constraints": [c.text for c in self.constraints],
            "base": dict(self.base),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], predicate: Callable[[Config], bool] | None = None) -> Space:
        """Read a space from its JSON form.

        ``knobs`` maps each name to a list of values (a build-time knob) or to ``{"values": [...],
        "build": false}``; ``run_time`` may also list the run-time knobs by name.
        """
        if not isinstance(data, Mapping):
            raise SpecError("the space must be an object with 'knobs'")
        unknown = set(data) - {"knobs", "constraints", "run_time", "base"}
        if unknown:
            raise SpecError(f"the space has an unknown field {sorted(unknown)[0]!r}")
        raw = data.get("knobs")
        if not isinstance(raw, Mapping) or not raw:
            raise SpecError("the space must map knob names to lists of values under 'knobs'")
        run_time = data.get("run_time", [])
        if not isinstance(run_time, list) or not all(isinstance(n, str) for n in run_time):
            raise SpecError("'run_time' must be a list of knob names")
        for name in run_time:
            if name not in raw:
                raise SpecError(f"run_time names {name!r}, which is not a knob{did_you_mean(name, raw)}")
        knobs = []
        for name, entry in raw.items():
            build = name not in run_time
            if isinstance(entry, Mapping):
                extra = set(entry) - {"values", "build"}
                if extra:
                    raise SpecError(f"knob {name!r} has an unknown field {sorted(extra)[0]!r}")
                values, build = entry.get("values"), entry.get("build", build)
                if not isinstance(build, bool):
                    raise SpecError(f"knob {name!r}: 'build' must be true or false, not {build!r}")
            else:
                values = entry
            if not isinstance(values, list):
                raise SpecError(f"knob {name!r}: values must be a list, not {values!r}")
            knobs.append(Knob(name, tuple(values), build))
        constraints = data.get("constraints", [])
        if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
            raise SpecError("'constraints' must be a list of expressions")
        base = data.get("base", {})
        if not isinstance(base, Mapping):
            raise SpecError("'base' must be an object")
        for key, value in base.items():
            check_value(f"base {key!r}", value)
        return cls(tuple(knobs), tuple(Expression(c) for c in constraints), predicate, dict(base))
