"""Loader of the C simulator library (``tvm_accel/lib/libaccelsim.so``) and shared call helpers.

The library is plain C99 loaded once with :mod:`ctypes`. Every simulator entry point returns a
status code (0 = ok) and writes a one-line message into a caller-provided buffer;
:func:`check` turns a non-zero code into :class:`tvm_accel.errors.SimulatorError` carrying that
message (and the code as ``.code`` / its name as ``.kind``).

Ctrl-C: a ctypes call blocks the thread that makes it, and Python runs its SIGINT handler only on
the main thread between bytecodes, so a simulation called directly from the main thread could not
be interrupted by Python's handler. :func:`call` (which every binding's ``simulate`` uses) runs a
main-thread call on that thread with the library's own SIGINT handler installed for the call
(``accelsim_sigint_begin`` / ``_end``): Ctrl-C then asks the C library to stop (every simulator
polls that flag between instructions and inside the loops of a long one), the call returns
within milliseconds, Python's handler is put back, and :func:`call` clears the flag and raises
``KeyboardInterrupt``. Where SIGINT has another Python handler than the default one (or no
``sigaction``), the call runs on a helper thread instead while the main thread waits in short
timeouts, so that handler (or any other exception in the waiting thread) runs as usual; that
path costs a thread hand-off per call, which on a 2-core VM was ~0.6 ms of a 3 ms inference.

Cycle budget: :func:`cycle_budget` sets the budget of every simulator run started inside it
that does not pass its own ``max_cycles`` (``tvmc run --max-cycles``); exceeding it raises
:class:`CycleBudgetError`.

``ACCELSIM_LIB`` (environment) overrides the library path, e.g. to test a sanitizer build.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import numbers
import os
import queue
import signal
import threading
from _ctypes import CFuncPtr
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tvm_accel.errors import AccelError, SimulatorError

#: must equal ACCELSIM_ABI_VERSION in sim/common/status.h
ABI_VERSION = 4
LIB_NAME = "libaccelsim.so"
ERR_LEN = 1024

#: status codes of sim/common/status.h
STATUS_NAMES = {
    0: "ok", 1: "argument", 2: "config", 3: "decode", 4: "bounds", 5: "protocol", 6: "budget",
    7: "io", 8: "nomem", 9: "interrupted",
}
CONFIG = 2
BUDGET = 6
INTERRUPTED = 9

#: the simulators' budget when none is given (ACCEL_DEFAULT_MAX_CYCLES, sim/common/stats.h)
DEFAULT_MAX_CYCLES = 2**34
#: larger budgets are clamped to this by the simulators (ACCEL_MAX_MAX_CYCLES)
MAX_MAX_CYCLES = 2**62


class CycleBudgetError(SimulatorError):
    """A simulator run exceeded its cycle budget (``max_cycles`` / :func:`cycle_budget`)."""


_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def lib_path() -> Path:
    override = os.environ.get("ACCELSIM_LIB")
    if override:
        return Path(override)
    return Path(__file__).parent / "lib" / LIB_NAME


def get_lib() -> ctypes.CDLL:
    """The loaded simulator library (loaded and version-checked on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = lib_path()
        hint = "run `pip install -e .` or `python setup.py build_sim` in the source tree"
        if not path.exists():
            raise AccelError(f"simulator library {path} is missing; {hint}")
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise AccelError(f"cannot load simulator library {path}: {e}; {hint}") from None
        try:
            version = lib.accelsim_abi_version
        except AttributeError:
            raise AccelError(f"{path} is not a simulator library (no accelsim_abi_version); "
                             f"{hint}") from None
        version.restype = ctypes.c_int
        version.argtypes = []
        got = version()
        if got != ABI_VERSION:
            raise AccelError(f"simulator library {path} has ABI version {got}, this package "
                             f"expects {ABI_VERSION}; {hint}")
        _lib = lib
        return lib


def function(name: str, restype, argtypes: list) -> CFuncPtr:
    """A typed entry point of the library; a missing symbol is reported as a stale build."""
    lib = get_lib()
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise AccelError(f"simulator library {lib_path()} has no function {name}; rebuild it with "
                         "`python setup.py build_sim`") from None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def err_buffer() -> ctypes.Array:
    return ctypes.create_string_buffer(ERR_LEN)


def config_error(what: str, msg: str) -> SimulatorError:
    """The error of a config the simulator cannot take, as the C library reports one (status
    ``config``), for what is checked before the call (values ctypes cannot carry, memories
    allocated on the Python side)."""
    exc = SimulatorError(f"{what}: config: {msg}")
    exc.code, exc.kind = CONFIG, STATUS_NAMES[CONFIG]
    return exc


def fill_struct(struct: ctypes.Structure, values: dict[str, object], what: str) -> None:
    """Set the fields of a C config struct, refusing what ctypes would silently wrap or reject.

    A config reaches the library unvalidated (``dataclasses.replace`` skips the checks; the C
    side validates every field), so a value must arrive as given: an integer outside its C
    type's range or a non-number is a :func:`config_error` naming the C field, not a wrapped
    value (ctypes stores ``2**32 + 4`` in an ``int32_t`` as ``4``) or a ``TypeError``."""
    types: dict[str, Any] = {f[0]: f[1] for f in struct._fields_}
    for name, value in values.items():
        ctype = types[name]
        if issubclass(ctype, ctypes.c_double):
            try:
                if not isinstance(value, numbers.Real):
                    raise TypeError(name)
                setattr(struct, name, float(value))
            except (TypeError, OverflowError):
                raise config_error(what, f"{name} = {value!r} is not a number a double can "
                                   "hold") from None
            continue
        bits = 8 * ctypes.sizeof(ctype)
        signed = ctype._type_ in "bhilq"  # the struct module's codes of the signed types
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        if not isinstance(value, numbers.Integral) or not lo <= int(value) <= hi:
            raise config_error(what, f"{name} = {value!r} is not an integer in {lo}..{hi} "
                               f"({'' if signed else 'u'}int{bits}_t)")
        setattr(struct, name, int(value))


class ConfigStructs:
    """The C config struct of each (config object, cycle budget), built once by ``build``.

    Building a struct checks every field (:func:`fill_struct`), tens of microseconds that a
    runtime calling the simulator once per layer would pay on every call. Hardware configs
    are frozen dataclasses, so a struct built from one config object stays right for it; the
    key is the object's identity (not equality: an ``int`` field given ``1.0`` compares equal
    to ``1`` yet must be refused), and each entry holds the config so its ``id`` is not reused
    while cached. The C side takes the struct as ``const``, so one struct serves every thread.
    """

    def __init__(self, build: Callable[[Any, int | None], ctypes.Structure], capacity: int = 16):
        self._build = build
        self._capacity = capacity
        self._hits: dict[tuple[int, int | None], tuple[Any, ctypes.Structure]] = {}

    def get(self, cfg: Any, max_cycles: int | None) -> ctypes.Structure:
        """The struct of ``cfg`` with budget ``max_cycles`` (errors as ``build`` raises them)."""
        key = (id(cfg), max_cycles)
        hit = self._hits.get(key)
        if hit is not None and hit[0] is cfg:
            return hit[1]
        struct = self._build(cfg, max_cycles)
        if len(self._hits) >= self._capacity:
            self._hits.clear()
        self._hits[key] = (cfg, struct)
        return struct


def check(code: int, err: ctypes.Array, what: str = "simulator") -> None:
    """Raise :class:`SimulatorError` for a non-zero status code with the C message
    (:class:`CycleBudgetError` for an exceeded cycle budget)."""
    if code == 0:
        return
    msg = err.value.decode("utf-8", "replace") or f"failed with status {code}"
    kind = STATUS_NAMES.get(code, f"status {code}")
    exc = (CycleBudgetError if code == BUDGET else SimulatorError)(f"{what}: {msg}")
    exc.code = code
    exc.kind = kind
    raise exc


# --- cycle budget ------------------------------------------------------------------------------
_budget: int | None = None


def check_max_cycles(value, what: str = "max_cycles") -> int:
    """``value`` as a cycle budget: an integer in 1..2^62, else :class:`AccelError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            not 0 < int(value) <= MAX_MAX_CYCLES:
        raise AccelError(f"{what} must be a positive integer of at most 2^62 cycles, got "
                         f"{value!r}")
    return int(value)


@contextlib.contextmanager
def cycle_budget(max_cycles: int | None) -> Iterator[None]:
    """Within the block, every simulator run that passes no ``max_cycles`` of its own gets this
    budget (``None``: the simulators' default of 2^34 cycles). Process-wide (the VM calls the
    runtimes on the caller's thread, a tuner may simulate on others); nests."""
    global _budget
    value = None if max_cycles is None else check_max_cycles(max_cycles)
    old, _budget = _budget, value
    try:
        yield
    finally:
        _budget = old


def current_cycle_budget() -> int | None:
    """The budget set by the innermost :func:`cycle_budget`, or None."""
    return _budget


def max_cycles_of(given: int | None) -> int | None:
    """The budget of one run: ``given`` if not None, else :func:`current_cycle_budget`."""
    return given if given is not None else _budget


# --- interruptible calls -----------------------------------------------------------------------
_stop_fns: dict = {}


def _stop_fn(name: str, restype=None):
    fn = _stop_fns.get(name)
    if fn is None:
        fn = _stop_fns[name] = function(name, restype, [])
    return fn


def request_stop() -> None:
    """Ask every running simulation to stop (each returns status ``interrupted`` within
    milliseconds); the request stays, and stops every run started meanwhile, until
    :func:`clear_stop`."""
    _stop_fn("accelsim_request_stop")()


def clear_stop() -> None:
    _stop_fn("accelsim_clear_stop")()


def stop_requested() -> bool:
    return bool(_stop_fn("accelsim_stop_requested", ctypes.c_int)())


class _Job:
    """One call handed to the worker. ``claim`` is taken by whichever side gets there first: the
    worker before it runs the call, or a main thread that gives up on a call not yet started."""

    __slots__ = ("fn", "args", "result", "error", "finished", "done", "claim")

    def __init__(self, fn, args):
        self.fn, self.args = fn, args
        self.result = self.error = None
        self.finished = False
        self.done = _thread.allocate_lock()  # held until the call returned (or was dropped)
        self.done.acquire()
        self.claim = _thread.allocate_lock()

    def run(self) -> None:
        try:
            if self.claim.acquire(False):
                self.result = self.fn(*self.args)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
        finally:
            self.finished = True
            self.done.release()


class _Worker:
    """One daemon thread that runs the main thread's simulator calls (a thread per call costs
    ~5x more than handing a call to a waiting thread)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="accelsim-call", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self.jobs.get().run()


_worker: _Worker | None = None
#: seconds between checks of a waiting main thread (a signal interrupts the wait anyway)
_POLL_S = 0.1


def _reset_after_fork() -> None:
    global _worker
    _worker = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _wait(job: _Job) -> None:
    # `finished`, not the lock, says when to stop: an exception may land after the lock was taken
    while not job.finished:
        job.done.acquire(timeout=_POLL_S)


def _abandon(job: _Job) -> None:
    """After an exception in the waiting main thread: make sure the call is not running (it
    writes into the caller's arrays) when the exception propagates. A further Ctrl-C meanwhile
    is absorbed: the simulator stops within milliseconds."""
    if job.claim.acquire(False):  # not started: the worker will drop it
        return
    while True:
        try:
            request_stop()
            _wait(job)
            break
        except KeyboardInterrupt:
            continue
    while True:
        try:
            clear_stop()
            break
        except KeyboardInterrupt:
            continue


def _guarded(fn, args):
    """``fn(*args)`` on this (the main) thread under the library's SIGINT handler, or
    ``_UNGUARDED`` when it cannot be installed."""
    if _stop_fn("accelsim_sigint_begin", ctypes.c_int)() != 0:
        return _UNGUARDED
    try:
        result = fn(*args)
    finally:
        seen = _stop_fn("accelsim_sigint_end", ctypes.c_int)()
    if seen:
        clear_stop()
        raise KeyboardInterrupt
    return result


_UNGUARDED = object()


def call(fn, *args):
    """``fn(*args)`` (a simulator entry point) so that Ctrl-C stops it: see the module docstring.
    Off the main thread the call is made directly (signals are delivered to the main thread)."""
    global _worker
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        result = _guarded(fn, args)
        if result is not _UNGUARDED:
            return result
    job = _Job(fn, args)
    try:
        if _worker is None:
            _worker = _Worker()
        _worker.jobs.put(job)
        _wait(job)
    except BaseException:  # KeyboardInterrupt, or another signal handler's exception
        _abandon(job)
        raise
    if job.error is not None:
        raise job.error
    return job.result
