"""Declared knob spaces: the free choices of a target's strategy, shared by every target.

A strategy describes its tunable choices (tile sizes, loop order, virtual threads, fusion or
embedding candidate) as a :class:`KnobSpace` of named :class:`Knob` s, each with a finite option
list and a heuristic default. The space knows nothing about any accelerator: targets add their
own feasibility rule (does the tile fit the buffers?) as an optional ``check`` callable that
raises ``ValueError`` naming the offending knob. The tuner enumerates or samples configurations,
turns them into numeric features, and hands the chosen ones back to the strategy.

A configuration is a plain ``dict`` mapping knob names to option values (JSON-serialisable, so it
can be written into tuning records as is).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tvm_accel.errors import KnobError, MappingError


@dataclass(frozen=True)
class Knob:
    """One named choice: a finite tuple of options and the default among them."""

    name: str
    options: tuple
    default: Any

    def __post_init__(self):
        opts = tuple(self.options)
        object.__setattr__(self, "options", opts)
        if not self.name:
            raise ValueError("knob without a name")
        if not opts:
            raise ValueError(f"knob {self.name}: empty option list")
        if self.default not in opts:
            raise ValueError(f"knob {self.name}: default {self.default!r} is not one of its "
                             f"options {list(opts)}")

    def index(self, value: Any) -> int:
        try:
            return self.options.index(value)
        except ValueError:
            raise ValueError(f"knob {self.name}: {value!r} is not a valid option "
                             f"(options: {_short(self.options)})") from None


def _short(opts: tuple, limit: int = 12) -> str:
    if len(opts) <= limit:
        return ", ".join(repr(o) for o in opts)
    head = ", ".join(repr(o) for o in opts[: limit // 2])
    tail = ", ".join(repr(o) for o in opts[-limit // 2:])
    return f"{head}, ... {tail} ({len(opts)} options)"


class KnobSpace:
    """An ordered set of knobs; its points are all combinations of their options.

    ``check(config)`` (optional) is the target's feasibility rule: it raises ``ValueError`` (naming
    the knob) for a combination that is well-formed but cannot be compiled, e.g. a tile that does
    not fit a buffer. :meth:`validate` applies both the option check and ``check``.
    """

    def __init__(self, knobs: Iterable[Knob], check: Callable[[dict], None] | None = None,
                 name: str = ""):
        self.name = name
        self._knobs: dict[str, Knob] = {}
        for k in knobs:
            if k.name in self._knobs:
                raise ValueError(f"knob space {name}: duplicate knob {k.name}")
            self._knobs[k.name] = k
        self._check = check

    # --- structure ---------------------------------------------------------------------------
    @property
    def knobs(self) -> list[Knob]:
        return list(self._knobs.values())

    @property
    def names(self) -> list[str]:
        return list(self._knobs)

    def __getitem__(self, name: str) -> Knob:
        return self._knobs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._knobs

    @property
    def size(self) -> int:
        """Number of points (all option combinations, feasible or not)."""
        return math.prod(len(k.options) for k in self._knobs.values())

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[dict]:
        """All points in lexicographic option order (lazy; the space can be large)."""
        names = self.names
        for combo in itertools.product(*(k.options for k in self._knobs.values())):
            yield dict(zip(names, combo, strict=True))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k.name}[{len(k.options)}]" for k in self._knobs.values())
        return f"KnobSpace({self.name or '?'}: {inner}; {self.size} points)"

    # --- points ------------------------------------------------------------------------------
    def default(self) -> dict:
        return {k.name: k.default for k in self._knobs.values()}

    def complete(self, config: Mapping[str, Any] | None) -> dict:
        """``config`` with missing knobs taken from the defaults (unknown names rejected)."""
        out = self.default()
        for name, value in (config or {}).items():
            if name not in self._knobs:
                raise ValueError(f"unknown knob {name!r} for {self.name or 'this space'} "
                                 f"(knobs: {', '.join(self.names)})")
            out[name] = value
        return out

    def validate(self, config: Mapping[str, Any]) -> dict:
        """Check a (possibly partial) config; return it completed with defaults.

        Raises ``ValueError`` naming the knob for an unknown name, a value outside the options,
        or a combination the space's ``check`` rejects.
        """
        full = self.complete(config)
        for name, value in full.items():
            self._knobs[name].index(value)
        if self._check is not None:
            self._check(full)
        return full

    def is_valid(self, config: Mapping[str, Any]) -> bool:
        try:
            self.validate(config)
        except ValueError:
            return False
        return True

    def index_of(self, config: Mapping[str, Any]) -> int:
        """Flat index of a point (mixed radix over the option lists, last knob fastest)."""
        full = self.complete(config)
        idx = 0
        for k in self._knobs.values():
            idx = idx * len(k.options) + k.index(full[k.name])
        return idx

    def point(self, index: int) -> dict:
        """Inverse of :meth:`index_of`."""
        if not 0 <= index < self.size:
            raise ValueError(f"point index {index} outside 0..{self.size - 1}")
        out = {}
        for k in reversed(self.knobs):
            index, r = divmod(index, len(k.options))
            out[k.name] = k.options[r]
        return {n: out[n] for n in self.names}

    def sample(self, rng: random.Random | None = None, feasible_only: bool = True,
               max_tries: int = 1000) -> dict:
        """A uniformly random point (rejection-sampled against ``check`` when asked)."""
        rng = rng or random.Random()
        for _ in range(max_tries):
            cfg = {k.name: rng.choice(k.options) for k in self._knobs.values()}
            if not feasible_only or self.is_valid(cfg):
                return cfg
        raise ValueError(f"no feasible point found in {max_tries} samples of {self!r}")

    def neighbours(self, config: Mapping[str, Any]) -> list[dict]:
        """Points that differ from ``config`` by one step of one knob's option list."""
        full = self.complete(config)
        out = []
        for k in self._knobs.values():
            i = k.index(full[k.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(k.options):
                    out.append({**full, k.name: k.options[j]})
        return out

    def features(self, config: Mapping[str, Any]) -> list[float]:
        """Numeric feature vector for a cost model: the option value when it is a number (bools
        as 0/1), otherwise the option index; one entry per knob, in knob order."""
        full = self.complete(config)
        feats = []
        for k in self._knobs.values():
            v = full[k.name]
            if isinstance(v, bool):
                feats.append(float(v))
            elif isinstance(v, (int, float)):
                feats.append(float(v))
            else:
                feats.append(float(k.index(v)))
        return feats

    def to_json(self) -> dict:
        return {"name": self.name,
                "knobs": [{"name": k.name, "options": list(k.options), "default": k.default}
                          for k in self._knobs.values()]}


def validate_knobs(space: KnobSpace, user: Mapping[str, Any] | None, layer: str,
                   user_set: bool = True) -> dict:
    """A layer's knobs: ``user`` (partial) completed with ``space``'s defaults and checked.

    The one rule of every target: a value the user set (``knobs=``, tuning records) that is an
    unknown knob, outside its options, or in a combination the space's feasibility check
    rejects raises :class:`~tvm_accel.errors.KnobError`, one line naming the layer, the knob
    and its allowed values, and the compile stops there. When the knobs are the compiler's own
    (no user knobs, or ``user_set=False`` for values a strategy derives itself) a failure means
    the layer does not fit the hardware: :class:`~tvm_accel.errors.MappingError`, and the
    layer falls back to the CPU."""
    try:
        return space.validate(user or {})
    except ValueError as e:
        if user and user_set:
            raise KnobError(f"layer {layer}: {e}") from None
        raise MappingError(f"layer {layer}: {e}") from None
