"""What every ``tvmc`` verb shares: the ``--target`` string, the targets' own
``--target-<kind>-*`` options (built from the target registry, as upstream tvmc builds them),
``--input-shapes``, output paths, the version line and the one-line error parser."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import NoReturn

from tvm_accel.errors import AccelError
from tvm_accel.numerics import DEFAULT_MAX_REQUANT_ERROR
from tvm_accel.target import TargetOption, available_targets, get_target

HOSTS = ("llvm", "c")


def parse_target(text: str) -> tuple[str | None, str]:
    """``"vta, llvm"`` -> ``("vta", "llvm")``; the host must come last and may be a full TVM
    target string (``"vta, llvm -mcpu=skylake"``, ``"dpu, c"``)."""
    kinds: list[str] = []
    for piece in (t.strip() for t in text.split(",")):  # "-mattr=+avx2,+fma" keeps its comma
        last = kinds[-1].split()[-1] if kinds else ""
        if last.startswith("-") and "=" in last and piece and " " not in piece:
            kinds[-1] += "," + piece
        elif piece:
            kinds.append(piece)
    if not kinds:
        raise AccelError("--target is empty; use e.g. --target \"vta, llvm\"")
    host = kinds[-1]
    if host.split()[0] not in HOSTS:
        raise AccelError(f"--target: the last target must be the host ({', '.join(HOSTS)}, "
                         f"with options such as 'llvm -mcpu=skylake'), got '{host}'")
    _check_host(host)
    accels = kinds[:-1]
    for k in accels:
        if k not in available_targets():
            raise AccelError(f"--target: unknown accelerator '{k}' (available: "
                             f"{', '.join(available_targets())})")
    if len(accels) > 1:
        raise AccelError("--target: give at most one accelerator before the host")
    return (accels[0] if accels else None), host


def _check_host(host: str) -> None:
    """A host target string TVM accepts (``llvm -mcpu=...`` with a CPU LLVM knows)."""
    from tvm_accel.pipeline import host_target

    _check_llvm_cpu(host)
    try:
        host_target(host)
    except Exception as e:
        why = one_line(str(e))
        m = re.search(r"Attribute '([^']+)' is not available", why)
        why = why.split(". Target creation")[0]
        raise AccelError(f"--target: host '{host}' is not a valid TVM target: "
                         + (f"{host.split()[0]} has no option -{m[1]}" if m else why)) from None


def _check_llvm_cpu(host: str) -> None:
    """Refuse an ``-mcpu`` LLVM does not know for the host's triple: TVM would log an error and
    quietly compile for a generic CPU instead."""
    opts = dict(o.lstrip("-").partition("=")[::2] for o in host.split()[1:] if "=" in o)
    cpu = opts.get("mcpu")
    if host.split()[0] != "llvm" or not cpu:
        return
    import tvm
    from tvm.target import codegen

    triple = opts.get("mtriple") or codegen.llvm_get_system_triple()
    if codegen.llvm_is_valid_cpu(cpu, triple):
        return
    known = [str(c) for c in codegen.llvm_get_cpu_archlist(
        tvm.target.Target({"kind": "llvm", "mtriple": triple}))]
    if cpu == "native":
        hint = f"this machine's CPU is -mcpu={codegen.llvm_get_system_cpu()}"
    else:
        near = difflib.get_close_matches(cpu, known, n=3, cutoff=0.5)
        hint = (f"nearest: {', '.join(near)}" if near else
                f"{len(known)} known, e.g. {', '.join(known[:3])}")
    raise AccelError(f"--target: host '{host}': LLVM {codegen.llvm_version_major()} knows no CPU "
                     f"'{cpu}' for {triple} ({hint})")


#: ``name:[1,3,224,224]`` of ``--input-shapes`` (upstream tvmc's syntax)
_SHAPE_ITEM = re.compile(r"\s*([^\s:][^:]*?)\s*:\s*\[([^\]]*)\]\s*")


def parse_input_shapes(text: str | None) -> dict[str, list[int]] | None:
    """``--input-shapes "input:[1,3,224,224] mask:[1,128]"`` -> ``{name: shape}``; each
    dimension a positive integer."""
    if not text:
        return None
    out, pos = {}, 0
    while pos < len(text):
        m = _SHAPE_ITEM.match(text, pos)
        if m is None:
            raise AccelError(f"--input-shapes: cannot read '{text[pos:].strip()}'; give "
                             "name:[d0,d1,...] per input, space-separated, e.g. "
                             "\"input:[1,3,224,224]\"")
        dims = [d.strip() for d in m[2].split(",") if d.strip()]
        if not dims or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise AccelError(f"--input-shapes: {m[1]}: dimensions must be positive integers, "
                             f"got [{m[2]}]")
        out[m[1]] = [int(d) for d in dims]
        pos = m.end()
    return out


def add_input_shapes_option(p: argparse.ArgumentParser) -> None:
    """``--input-shapes`` (compile, tune): static shapes for a model with dynamic inputs."""
    p.add_argument("--input-shapes", metavar="SHAPES",
                   help='shapes of inputs with dynamic dimensions, e.g. '
                   '"input:[1,3,224,224] mask:[1,128]"')


def version_line() -> str:
    """``tvmc --version``: this package's version and the TVM it runs on."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("tvm-accel")
    except PackageNotFoundError:
        mine = "unknown"
    try:
        tvm_v = version("apache-tvm")
    except PackageNotFoundError:
        tvm_v = "not installed"
    return f"tvmc (tvm-accel) {mine}, Apache TVM {tvm_v}"


def check_output_path(path: str, example: str = "module.tar", what: str = "package",
                      flag: str = "-o") -> None:
    """Refuse an output file (``-o``, or ``flag``) the package (or ``what``) cannot be written
    to before spending time compiling or running: a directory, or a missing parent directory
    (never created: every output flag of every verb refuses alike)."""
    if os.path.isdir(path) or path.endswith(os.sep):
        raise AccelError(f"{flag} {path}: is a directory; give the {what} file name, e.g. "
                         f"{os.path.join(path, example)}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise AccelError(f"{flag} {path}: directory {parent} does not exist")


@contextlib.contextmanager
def user_warnings(verb: str, *categories: type[Warning]) -> Iterator[None]:
    """Print each warning of ``categories`` (the project's own: precision, tuning records) once,
    as one ``tvmc <verb>: warning: ...`` line on stderr instead of Python's two-line format with
    a source line; other warnings go on as they came."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            for c in categories:
                warnings.simplefilter("always", c)
            yield
    finally:
        shown = set()
        for w in caught:
            if not issubclass(w.category, categories):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            elif str(w.message) not in shown:
                shown.add(str(w.message))
                print(f"tvmc {verb}: warning: {one_line(str(w.message))}", file=sys.stderr)


def _option_dest(kind: str, option: TargetOption) -> str:
    return f"target_{kind}_{option.name}".replace("-", "_")


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """The ``--target-<kind>-<option>`` flags of every available target (compile, tune), as
    each target declares them (:meth:`~tvm_accel.target.AccelTarget.options`)."""
    for kind in available_targets():
        for opt in get_target(kind).options():
            flag, dest = f"--target-{kind}-{opt.name}", _option_dest(kind, opt)
            if opt.type is bool:
                parser.add_argument(flag, dest=dest, action="store_true", help=opt.help)
            else:
                parser.add_argument(flag, dest=dest, type=opt.type, choices=opt.choices,
                                    metavar=opt.metavar, help=opt.help)


def target_options(accel: str, args: argparse.Namespace) -> dict:
    """The parsed ``--target-<accel>-*`` values, by option name (None: not given)."""
    return {opt.name: getattr(args, _option_dest(accel, opt), None)
            for opt in get_target(accel).options()}


def target_knobs(accel: str, args: argparse.Namespace) -> dict | None:
    """Compile-time knobs of the target's options beyond its config (e.g. a strategy or an
    operating point): :meth:`~tvm_accel.target.AccelTarget.knobs_from_options`."""
    return get_target(accel).knobs_from_options(target_options(accel, args))


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error convention: one line, exit 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def one_line(text: str) -> str:
    return "; ".join(t.strip() for t in text.strip().splitlines() if t.strip())


def _lsb_limit(text: str) -> float:
    """``--max-requant-error``: a number of LSBs >= 0, or ``inf``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of LSBs >= 0 or 'inf', got "
                                         f"{text!r}")
    return value


def add_requant_error_option(p: argparse.ArgumentParser) -> None:
    """``--max-requant-error LSB``: the requantize guard's limit (tvm_accel.canonicalize.guard)."""
    p.add_argument("--max-requant-error", type=_lsb_limit, default=DEFAULT_MAX_REQUANT_ERROR,
                   metavar="LSB",
                   help="requantize guard: a layer whose recipe deviates from its float scales "
                   "by more than LSB output steps stays on the CPU (default "
                   f"{DEFAULT_MAX_REQUANT_ERROR:g}; 'inf' offloads it anyway)")


def add_tuning_records_option(p: argparse.ArgumentParser) -> None:
    """``--tuning-records FILE`` of a verb that compiles (applied by :func:`tuning_records`)."""
    p.add_argument("--tuning-records", metavar="FILE",
                   help="apply the best configuration per workload from 'tvmc tune' records")


def tuning_records(path: str | None) -> AbstractContextManager:
    """The best record per workload of ``tvmc tune`` records applied to a compile (none: a
    no-op context)."""
    if not path:
        return nullcontext()
    from tvm_accel.tuning.records import ApplyHistoryBest

    return ApplyHistoryBest(path)


def add_pass_context_options(p: argparse.ArgumentParser) -> None:
    """``-O/--opt-level`` and ``--pass-config key=value`` (upstream tvmc's): the
    ``tvm.transform.PassContext`` the compile runs in (applied by :func:`pass_context`)."""
    p.add_argument("-O", "--opt-level", type=int, choices=range(4), metavar="{0,1,2,3}",
                   help="PassContext opt_level of the host passes (default: TVM's, 2)")
    p.add_argument("--pass-config", action="append", metavar="KEY=VALUE", default=[],
                   help="a TVM pass config of the compile, e.g. tirx.disable_vectorize=true "
                   "(repeatable; keys as tvm.transform.PassContext.list_configs() names them)")


def _config_value(key: str, text: str, kind: str) -> bool | int:
    """``--pass-config`` value ``text`` of a config of type ``kind`` (TVM's type name)."""
    if kind == "bool":
        value = {"true": True, "1": True, "false": False, "0": False}.get(text.lower())
        if value is None:
            raise AccelError(f"--pass-config {key}={text}: {key} takes true or false")
        return value
    if kind in ("int", "ir.IntImm"):
        try:
            return int(text)
        except ValueError:
            raise AccelError(f"--pass-config {key}={text}: {key} takes an integer") from None
    raise AccelError(f"--pass-config {key}: its value is a {kind}, which cannot be given on the "
                     "command line (only bool and integer configs can)")


def parse_pass_configs(items: list[str]) -> dict[str, bool | int]:
    """``["tirx.disable_vectorize=true"]`` -> ``{key: value}``, each key one TVM registered
    and each value read as that config's type."""
    import tvm

    known = {k: str(v["type"]) for k, v in tvm.transform.PassContext.list_configs().items()}
    out: dict[str, bool | int] = {}
    for item in items:
        key, eq, text = (s.strip() for s in item.partition("="))
        if not eq or not key or not text:
            raise AccelError(f"--pass-config {item}: give KEY=VALUE, e.g. "
                             "tirx.disable_vectorize=true")
        if key not in known:
            near = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            raise AccelError(f"--pass-config {key}: not a pass config TVM registered ("
                             + (f"nearest: {', '.join(near)}" if near else
                                f"{len(known)} known, see tvm.transform.PassContext."
                                "list_configs()") + ")")
        out[key] = _config_value(key, text, known[key])
    return out


def pass_context(args: argparse.Namespace) -> AbstractContextManager:
    """The ``PassContext`` of ``-O`` and ``--pass-config`` (neither given: a no-op context, so
    the compile runs in TVM's default one)."""
    configs = parse_pass_configs(getattr(args, "pass_config", None) or [])
    level = getattr(args, "opt_level", None)
    if level is None and not configs:
        return nullcontext()
    import tvm

    return tvm.transform.PassContext(
        opt_level=tvm.transform.PassContext.current().opt_level if level is None else level,
        config=configs)


def add_rpc_options(p, what: str) -> None:
    """Upstream tvmc's ``--rpc-tracker`` / ``--rpc-key``: work goes to a farm of servers
    (:mod:`tvm_accel.farm`)."""
    from tvm_accel.farm import DEFAULT_KEY

    p.add_argument("--rpc-tracker", metavar="HOST:PORT",
                   help=f"a TVM RPC tracker (python -m tvm.exec.rpc_tracker): {what} "
                   "registered with it (python -m tvm_accel.rpc_server)")
    p.add_argument("--rpc-key", metavar="KEY",
                   help=f"the servers' key at --rpc-tracker (default {DEFAULT_KEY})")


def open_farm(args):
    """The :class:`tvm_accel.farm.Farm` the flags name, or None without ``--rpc-tracker``."""
    from tvm_accel.farm import DEFAULT_KEY, Farm, parse_tracker

    if args.rpc_tracker is None:
        if args.rpc_key is not None:
            raise AccelError("--rpc-key names servers at a tracker; give --rpc-tracker "
                             "HOST:PORT too")
        return None
    return Farm(parse_tracker(args.rpc_tracker), args.rpc_key or DEFAULT_KEY)
