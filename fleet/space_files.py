"""Space files as MLPerf's autotuner reads them: a flat JSON grid, or a Python module.

A campaign spec names one with ``"space": "grid.json"`` (or ``{"file": "grid.py", "base": {...}}``).

- JSON: a flat object, knob name -> list of bools, numbers or strings. Fleet's additions live in the same
  object under keys that start with ``fleet:``: ``fleet:run_time`` (knob names), ``fleet:constraints``
  (expressions), ``fleet:base`` (the base configuration).
- Python: module globals without a leading underscore whose values are lists are knobs, and three
  functions may be defined: ``META_get_no_rebuild_params()`` (the run-time knobs, so runs are ordered to
  minimise rebuilds), ``META_is_config_valid(config)`` (called with the base overlaid with the knob values)
  and ``META_search_callback()`` (returns a searcher; it may take the space as its one argument).

A Python space file is the user's code. It runs only in the submitting user's own process (``fleet tune``,
``fleet submit``, ``fleet resume``), never in a driver, worker or an operator's command: at submit its knobs are
stored as data and its ``META_is_config_valid`` as verdicts (the configurations it rejects, :func:`verdicts`),
which is all a ``fleet driver`` reads. A file whose own searcher (``META_search_callback``) must drive the
campaign can be driven only from the submitter's process.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.errors import SpecError
from fleet.expr import Expression
from fleet.search import Searcher
from fleet.space import Knob, Space, check_value

META_FUNCTIONS = ("META_get_no_rebuild_params", "META_is_config_valid", "META_search_callback")
JSON_ADDITIONS = ("fleet:run_time", "fleet:constraints", "fleet:base")


@dataclass(frozen=True)
class SpaceFile:
    """What a space file defines.

    Parameters
    ----------
    space:
        The knobs, constraints, base and validity predicate.
    searcher:
        Builds the file's own searcher (``META_search_callback``), or None to use the spec's strategy.
    digest:
        SHA-256 of the file, so a resumed campaign can tell that the file changed under it.
    """

    space: Space
    searcher: Callable[[Space], Searcher] | None
    digest: str


# A predicate is stored as the configurations it rejects; past this many configurations it is not evaluated.
VERDICT_LIMIT = 200_000


def load_space_file(path: Path, base: Mapping[str, Any] | None = None, digest: str | None = None) -> SpaceFile:
    """Read a ``.json`` or ``.py`` space file; ``base`` overlays the file's own base configuration.

    Parameters
    ----------
    digest:
        The file's digest when the campaign started: a file that changed since is refused before any of its
        code runs.
    """
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SpecError(f"space file {path}: {error.strerror}") from None
    found = hashlib.sha256(data).hexdigest()
    if digest is not None and found != digest:
        raise SpecError(f"space file {path} changed since its campaign started")
    digest = found
    if path.suffix == ".py":
        space, searcher = _python(path, data, dict(base or {}))
        return SpaceFile(space, searcher, digest)
    if path.suffix == ".json":
        return SpaceFile(_json(path, data, dict(base or {})), None, digest)
    raise SpecError(f"space file {path}: expected a .json or .py file")


def _knob(where: str, name: str, values: Any, build: bool) -> Knob:
    if not isinstance(values, list):
        raise SpecError(f"{where}: knob {name!r} must be a list of values, not {values!r}")
    for value in values:
        try:
            check_value(f"knob {name!r}", value)
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
    return Knob(name, tuple(values), build)


def _run_time(where: str, names: Any, knobs: Mapping[str, Any]) -> set[str]:
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise SpecError(f"{where}: the no-rebuild parameters must be a list of knob names, not {names!r}")
    for name in names:
        if name not in knobs:
            raise SpecError(f"{where}: no-rebuild parameter {name!r} is not a knob")
    return set(names)


def _json(path: Path, data: bytes, base: dict[str, Any]) -> Space:
    try:
        grid = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SpecError(f"space file {path}: not valid JSON: {error}") from None
    if not isinstance(grid, dict):
        raise SpecError(f"space file {path}: a grid is a flat object of knob name -> list of values")
    unknown = [k for k in grid if k.startswith("fleet:") and k not in JSON_ADDITIONS]
    if unknown:
        raise SpecError(f"space file {path}: unknown field {unknown[0]!r} (known: {', '.join(JSON_ADDITIONS)})")
    knobs = {k: v for k, v in grid.items() if not k.startswith("fleet:")}
    run_time = _run_time(str(path), grid.get("fleet:run_time", []), knobs)
    constraints = grid.get("fleet:constraints", [])
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise SpecError(f"space file {path}: 'fleet:constraints' must be a list of expressions")
    file_base = grid.get("fleet:base", {})
    if not isinstance(file_base, dict):
        raise SpecError(f"space file {path}: 'fleet:base' must be an object")
    try:
        return Space(
            tuple(_knob(str(path), name, values, name not in run_time) for name, values in knobs.items()),
            tuple(Expression(c) for c in constraints),
            base={**file_base, **base},
        )
    except SpecError as error:
        raise SpecError(f"space file {path}: {error}") from None


def _python(path: Path, data: bytes, base: dict[str, Any]) -> tuple[Space, Callable[[Space], Searcher] | None]:
    # The bytes whose digest was taken are the ones run: the file may change between two reads.
    module: dict[str, Any] = {"__name__": "fleet_space", "__file__": str(path)}
    try:
        exec(compile(data, str(path), "exec"), module)  # the submitting user's own code, in their own process
    except Exception as error:  # the user's code: any error it raises is the user's to see, in one line
        raise SpecError(f"space file {path}: {type(error).__name__}: {error}") from None
    module = {name: value for name, value in module.items() if name not in ("__name__", "__file__", "__builtins__")}
    meta = {name: value for name, value in module.items() if name.startswith("META_")}
    for name, value in meta.items():
        if name not in META_FUNCTIONS:
            raise SpecError(f"space file {path}: unknown META_ function {name!r} (known: {', '.join(META_FUNCTIONS)})")
        if not callable(value):
            raise SpecError(f"space file {path}: {name} must be a function")
    knobs = {
        name: value
        for name, value in module.items()
        if not name.startswith("_") and not name.startswith("META_") and isinstance(value, list)
    }
    if not knobs:
        raise SpecError(f"space file {path}: defines no knobs (module-level lists)")
    run_time: set[str] = set()
    if "META_get_no_rebuild_params" in meta:
        run_time = _run_time(str(path), _call(path, meta["META_get_no_rebuild_params"]), knobs)
    predicate = meta.get("META_is_config_valid")
    try:
        space = Space(
            tuple(_knob(str(path), name, values, name not in run_time) for name, values in knobs.items()),
            predicate=_guarded(path, predicate) if predicate else None,
            base=base,
        )
    except SpecError as error:
        raise SpecError(f"space file {path}: {error}") from None
    callback = meta.get("META_search_callback")
    return space, (_searcher_factory(path, callback) if callback else None)


def _call(path: Path, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except Exception as error:  # the user's code
        raise SpecError(f"space file {path}: {function.__name__} raised {type(error).__name__}: {error}") from None


def _guarded(path: Path, predicate: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], bool]:
    return lambda config: bool(_call(path, predicate, config))


def _searcher_factory(path: Path, callback: Callable[..., Any]) -> Callable[[Space], Searcher]:
    def make(space: Space) -> Searcher:
        takes_space = len(inspect.signature(callback).parameters) >= 1
        searcher = _call(path, callback, space) if takes_space else _call(path, callback)
        if not isinstance(searcher, Searcher):
            raise SpecError(f"space file {path}: META_search_callback must return a fleet.search.Searcher")
        return searcher.bind(space)  # MLPerf's searchers are built without the space

    return make


def verdicts(space: Space) -> dict[str, Any]:
    """The space's predicate as data: the configurations it rejects among those its constraints allow.

    Returns ``{"rejected": [[value, ...], ...]}`` (values in knob order), ``{}`` with no predicate, or
    ``{"rejected": None}`` when the space is too large to evaluate (over :data:`VERDICT_LIMIT` configurations).
    """
    if space.predicate is None:
        return {}
    if space.size > VERDICT_LIMIT:
        return {"rejected": None}
    plain = Space(space.knobs, space.constraints, base=space.base)
    return {"rejected": [[config[n] for n in space.names] for config in plain if not space.is_valid(config)]}


def predicate_from_verdicts(names: list[str], rejected: list[list[Any]]) -> Callable[[dict[str, Any]], bool]:
    """The predicate that :func:`verdicts` stored: true for every configuration it did not reject."""
    refused = {tuple(values) for values in rejected}
    return lambda config: tuple(config.get(name) for name in names) not in refused
