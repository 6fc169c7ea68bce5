"""Hardware-config JSON handling shared by every target.

A target declares its integer, numeric and optional string fields; these helpers read the JSON
(a file path or a bundled config name), check each field's presence and type, and reject
unknown fields, naming the file and the field. Consistency rules stay in each target's
``validate``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, is_dataclass
from pathlib import Path

from tvm_accel.errors import ConfigError


def parse_fields(d: dict, int_fields: tuple[str, ...], float_fields: tuple[str, ...],
                 optional: dict[str, str], where: str, kind: str) -> dict:
    """Typed keyword arguments for a config dataclass from parsed JSON ``d``."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a JSON object of {kind} parameters")
    kw: dict = {}
    for f in int_fields:
        if f not in d:
            raise ConfigError(f"{where}: missing field {f}")
        v = d[f]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}: field {f}: expected an integer, got {v!r}")
        kw[f] = v
    for f in float_fields:
        if f not in d:
            raise ConfigError(f"{where}: missing field {f}")
        kw[f] = finite_float(d[f], f, where)
    for f, default in optional.items():
        kw[f] = str(d.get(f, default))
    known = set(int_fields) | set(float_fields) | set(optional)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]} "
                          f"(known: {', '.join(sorted(known))})")
    return kw


def finite_float(v: object, field: str, where: str) -> float:
    """``v`` as a finite float; NaN, Infinity (JSON accepts both) and integers too large for a
    double are refused naming the field, since every float of a config reaches a ``double``
    of the simulator or a cycle/time formula."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{where}: field {field}: expected a number, got {v!r}")
    try:
        x = float(v)
    except OverflowError:
        raise ConfigError(f"{where}: field {field}: an integer of {len(str(v))} digits is too "
                          "large for a double") from None
    if not math.isfinite(x):
        raise ConfigError(f"{where}: field {field}: {v!r} is not a finite number")
    return x


def read_config_json(path_or_name: str | Path, config_dir: Path) -> tuple[dict, Path]:
    """Parsed JSON of a config file, or of ``config_dir/<name>.json`` for a bundled name."""
    p = Path(path_or_name)
    if not p.exists():
        bundled = config_dir / f"{path_or_name}.json"
        if not bundled.exists():
            names = ", ".join(sorted(q.stem for q in config_dir.glob("*.json")))
            raise ConfigError(f"{path_or_name}: no such config file or bundled config ({names})")
        p = bundled
    try:
        return json.loads(p.read_text()), p
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read config: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON: {e.msg} at line {e.lineno}") from None


class HardwareConfig:
    """Identity shared by the targets' config dataclasses (which have a ``name`` field)."""

    def to_json(self) -> dict:
        """Every parameter (not the name), as written in a config file."""
        if not is_dataclass(self):
            raise TypeError("asdict() should be called on dataclass instances")
        d = asdict(self)
        d.pop("name")
        return d

    @property
    def on_chip_bytes(self) -> int | None:
        """Bytes of the accelerator's on-chip buffers (an area proxy for design-space sweeps,
        :mod:`tvm_accel.explore`); None: the target does not say."""
        return None

    @property
    def fingerprint(self) -> bytes:
        """16-byte digest of every parameter; a blob built for another config is rejected by it."""
        text = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(text).digest()[:16]
