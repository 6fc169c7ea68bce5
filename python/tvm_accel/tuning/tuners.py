"""Tuners: which configurations of a task to measure next, and the loop that measures them.

:class:`Tuner` holds what every tuner shares (after AutoTVM's design): the measured points and
the best one so far, resuming from earlier measurements (:meth:`Tuner.load_history`), the
default configuration measured first so tuning never picks something worse than the untuned
layer, early stopping, and callbacks after each batch. A subclass only proposes points
(``_propose``). :class:`RandomTuner`, :class:`GridSearchTuner` and :class:`GATuner` are here; the
model-based :class:`tvm_accel.tuning.xgb.XGBTuner` builds on the same base.

Points the space's feasibility check rejects (``space.is_valid`` is False) are never proposed:
they are skipped without a measurement and do not count as trials.
"""

from __future__ import annotations

import logging
import math
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from tvm_accel.tuning import measure as _measure
from tvm_accel.tuning.task import MeasureInput, MeasureResult, Task

__all__ = ["GATuner", "GridSearchTuner", "RandomTuner", "Tuner"]

logger = logging.getLogger("tvm_accel.tuning")

Callback = Callable[["Tuner", list[MeasureInput], list[MeasureResult]], None]

_ENUMERATE_LIMIT = 1 << 17  # spaces up to this size may be listed point by point


def same_task(a: Task, b: Task) -> bool:
    """Whether two task objects describe the same workload (records of one apply to the other)."""
    return a.target == b.target and a.key == b.key


class Tuner(ABC):
    """Base of all tuners: bookkeeping, history and the measure loop.

    ``trials`` counts the measurements this tuner made (loaded history is not counted);
    ``best_config`` / ``best_cost`` (seconds) / ``best_cycles`` / ``best_result`` describe the
    fastest successful measurement, loaded ones included. Reproducible for a given ``seed``.
    """

    def __init__(self, task: Task, seed: int | None = 0):
        self.task = task
        self.space = task.space
        self.seed = seed
        self.rng = random.Random(seed)
        self.trials = 0
        self.best_config: dict | None = None
        self.best_cost = math.inf
        self.best_cycles: int | None = None
        self.best_result: MeasureResult | None = None
        self.history: list[tuple[MeasureInput, MeasureResult]] = []  # this task's, loaded first
        self._visited: set[int] = set()    # measured (or loaded) flat indices
        self._proposed: set[int] = set()   # handed out by next_batch, not yet updated
        self._valid: dict[int, bool] = {}
        self._radix = [len(k.options) for k in self.space.knobs]

    # --- points ------------------------------------------------------------------------------
    def is_valid_index(self, index: int) -> bool:
        """``space.is_valid`` of a flat index, cached (the check may be costly)."""
        ok = self._valid.get(index)
        if ok is None:
            ok = self._valid[index] = self.space.is_valid(self.space.point(index))
        return ok

    def available(self, index: int) -> bool:
        """A valid point not measured yet and not handed out already."""
        return (index not in self._visited and index not in self._proposed
                and self.is_valid_index(index))

    @property
    def visited(self) -> frozenset[int]:
        """Flat indices measured by this tuner or loaded from history."""
        return frozenset(self._visited)

    def to_vector(self, index: int) -> list[int]:
        """Per-knob option indices of a flat index (last knob fastest, as ``space.point``)."""
        out = []
        for r in reversed(self._radix):
            index, d = divmod(index, r)
            out.append(d)
        return out[::-1]

    def to_index(self, vector: Sequence[int]) -> int:
        idx = 0
        for r, d in zip(self._radix, vector, strict=True):
            idx = idx * r + int(d)
        return idx

    def random_available(self, n: int, exclude: Iterable[int] = ()) -> list[int]:
        """Up to ``n`` distinct available points drawn uniformly (fewer when the space runs
        out)."""
        taken = set(exclude)
        out: list[int] = []
        size = self.space.size
        tries = 0
        while len(out) < n and tries < 64 * n + 1000:
            tries += 1
            idx = self.rng.randrange(size)
            if idx not in taken and self.available(idx):
                taken.add(idx)
                out.append(idx)
        if len(out) < n and size <= _ENUMERATE_LIMIT:
            rest = [i for i in range(size) if i not in taken and self.available(i)]
            out += self.rng.sample(rest, min(n - len(out), len(rest)))
        return out

    # --- the tuner interface -----------------------------------------------------------------
    def next_batch(self, n: int) -> list[dict]:
        """The next ``n`` (or fewer, when the space is exhausted) configurations to measure.

        The default configuration (when feasible) comes first until it has been measured."""
        out: list[int] = []
        default = self.space.index_of(self.space.default())
        if n > 0 and self.available(default):
            out.append(default)
            self._proposed.add(default)
        if len(out) < n:
            for idx in self._propose(n - len(out)):
                if self.available(idx):
                    out.append(idx)
                    self._proposed.add(idx)
        return [self.space.point(i) for i in out]

    @abstractmethod
    def _propose(self, n: int) -> list[int]:
        """Up to ``n`` flat indices, preferably :meth:`available` ones (each tuner's search)."""

    def _from_queue(self, queue: deque, n: int, refill: Callable[[], bool]) -> list[int]:
        """Up to ``n`` available indices popped from ``queue``; ``refill`` queues more when it
        runs dry and returns False when it cannot (a generation, a model's plan)."""
        out: list[int] = []
        while len(out) < n:
            if not queue and not refill():
                break
            idx = queue.popleft()
            if self.available(idx):
                out.append(idx)
        return out

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Take in measured results (of this task) and count them as trials."""
        if len(inputs) != len(results):
            raise ValueError(f"{len(inputs)} inputs but {len(results)} results")
        for inp in inputs:
            if not same_task(inp.task, self.task):
                raise ValueError(f"update with a result of task {inp.task.name} "
                                 f"({inp.task.key}), this tuner tunes {self.task.key}")
        pairs = list(zip(inputs, results, strict=True))
        for inp, res in pairs:
            self.trials += 1
            self._record(inp, res)
        self._on_update(pairs)

    def _record(self, inp: MeasureInput, res: MeasureResult) -> None:
        index = self.space.index_of(inp.config)
        self._visited.add(index)
        self._proposed.discard(index)
        self.history.append((inp, res))
        if res.ok and res.costs and res.costs[0] < self.best_cost:
            self.best_cost = res.costs[0]
            self.best_config = self.space.complete(inp.config)
            self.best_cycles = res.cycles
            self.best_result = res

    def _on_update(self, pairs: list[tuple[MeasureInput, MeasureResult]]) -> None:  # noqa: B027
        """Optional subclass hook after new measurements of this task (default: nothing)."""

    def load_history(self, pairs: Iterable[tuple[MeasureInput, MeasureResult]]) -> int:
        """Resume from earlier measurements: points of this task are marked measured (never
        measured again) and count for the best; pairs of other tasks are offered to
        :meth:`_on_history` (a cost model may learn from them). Returns how many pairs of this
        task were taken; those whose config no longer fits the space are ignored."""
        own: list[tuple[MeasureInput, MeasureResult]] = []
        other: list[tuple[MeasureInput, MeasureResult]] = []
        for inp, res in pairs:
            if not same_task(inp.task, self.task):
                other.append((inp, res))
                continue
            try:
                self.space.index_of(inp.config)
            except ValueError:
                continue
            self._record(inp, res)
            own.append((inp, res))
        self._on_history(own, other)
        return len(own)

    def _on_history(self, own: list[tuple[MeasureInput, MeasureResult]],  # noqa: B027
                    other: list[tuple[MeasureInput, MeasureResult]]) -> None:
        """Optional subclass hook after :meth:`load_history` (default: nothing)."""

    # --- the loop ----------------------------------------------------------------------------
    def tune(self, n_trial: int, early_stopping: int | None = None,
             measure_option: _measure.MeasureOption | None = None,
             callbacks: Sequence[Callback] = (),
             measurer: _measure.Measurer | None = None) -> None:
        """Measure up to ``n_trial`` new configurations in batches of ``n_parallel``.

        Stops early when the space is exhausted or when ``early_stopping`` trials in a row
        brought no improvement. ``measurer`` (an object with ``run(inputs)`` and
        ``n_parallel``, normally a :class:`~tvm_accel.tuning.measure.Measurer`) is reused when
        given; otherwise one is started from ``measure_option`` and closed at the end.
        Each callback is called as ``cb(tuner, inputs, results)`` after every batch.
        """
        own = measurer is None
        if measurer is None:
            measurer = _measure.Measurer(measure_option or _measure.measure_option())
        try:
            start = self.trials
            last_gain = self.trials
            while self.trials - start < n_trial:
                if early_stopping is not None and self.trials - last_gain >= early_stopping:
                    logger.debug("%s: no improvement in %d trials, stopping", self.task.name,
                                 early_stopping)
                    break
                n = min(measurer.n_parallel, n_trial - (self.trials - start))
                configs = self.next_batch(n)
                if not configs:
                    logger.debug("%s: search space exhausted", self.task.name)
                    break
                inputs = [MeasureInput(self.task, c) for c in configs]
                results = measurer.run(inputs)
                before = self.best_cost
                for i, res in enumerate(results):
                    if res.ok and res.costs[0] < before:
                        before = res.costs[0]
                        last_gain = self.trials + i + 1
                self.update(inputs, results)
                logger.debug("%s: %d trials, best %.4g s", self.task.name,
                             self.trials - start, self.best_cost)
                for cb in callbacks:
                    cb(self, inputs, results)
        finally:
            if own:
                measurer.close()


class RandomTuner(Tuner):
    """Uniform sampling without replacement over the feasible points."""

    def _propose(self, n: int) -> list[int]:
        return self.random_available(n)


class GridSearchTuner(Tuner):
    """All points in flat index order (``space.point(0)``, ``space.point(1)``, ...)."""

    def __init__(self, task: Task, seed: int | None = 0):
        super().__init__(task, seed)
        self._cursor = 0

    def _propose(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n and self._cursor < self.space.size:
            if self.available(self._cursor):
                out.append(self._cursor)
            self._cursor += 1
        return out


class GATuner(Tuner):
    """Genetic search: a population of ``pop_size`` points per generation; the next one keeps
    the ``elite_num`` best points seen as parents, picks parents by fitness (speed relative to
    the best), takes each knob from one of two parents (uniform crossover) and re-draws each
    knob with probability ``mutation_prob``. Children already measured are replaced."""

    def __init__(self, task: Task, seed: int | None = 0, pop_size: int = 32, elite_num: int = 4,
                 mutation_prob: float = 0.1):
        super().__init__(task, seed)
        if pop_size < 2 or not 0 <= elite_num <= pop_size:
            raise ValueError(f"GA needs pop_size >= 2 and 0 <= elite_num <= pop_size, got "
                             f"{pop_size} and {elite_num}")
        self.pop_size = pop_size
        self.elite_num = elite_num
        self.mutation_prob = mutation_prob
        self._pending: deque[int] = deque()
        self._generation: list[int] = []
        self._cost: dict[int, float] = {}   # flat index -> cost (inf when failed)

    def _on_update(self, pairs: list[tuple[MeasureInput, MeasureResult]]) -> None:
        for inp, res in pairs:
            self._cost[self.space.index_of(inp.config)] = res.costs[0] if res.ok else math.inf

    def _on_history(self, own: list[tuple[MeasureInput, MeasureResult]],
                    other: list[tuple[MeasureInput, MeasureResult]]) -> None:
        self._on_update(own)

    def _propose(self, n: int) -> list[int]:
        return self._from_queue(self._pending, n, self._breed)

    def _breed(self) -> bool:
        """Queue the next generation (the first one is random unless history gave enough
        measured points to breed from)."""
        parents = [i for i in self._generation if i in self._cost]
        elite = sorted(self._cost, key=lambda i: self._cost[i])[: self.elite_num]
        pool = list(dict.fromkeys(elite + parents))
        best = min(self._cost.values(), default=math.inf)
        weights = [best / self._cost[i] if math.isfinite(self._cost[i]) else 0.0 for i in pool]
        children: list[int] = []
        breed = self._generation or len(self._cost) >= self.pop_size // 2
        if breed and sum(weights) > 0:
            vectors = [self.to_vector(i) for i in pool]
            taken: set[int] = set()
            tries = 0
            while len(children) < self.pop_size and tries < 20 * self.pop_size:
                tries += 1
                a, b = self.rng.choices(vectors, weights=weights, k=2)
                child = [x if self.rng.random() < 0.5 else y for x, y in zip(a, b, strict=True)]
                for k, radix in enumerate(self._radix):
                    if self.rng.random() < self.mutation_prob:
                        child[k] = self.rng.randrange(radix)
                idx = self.to_index(child)
                if idx not in taken and self.available(idx):
                    taken.add(idx)
                    children.append(idx)
        children += self.random_available(self.pop_size - len(children), exclude=children)
        self._generation = children
        self._pending.extend(children)
        return bool(children)
