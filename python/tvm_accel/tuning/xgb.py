"""The model-based tuner: an xgboost cost model proposes what to measure (after AutoTVM's
XGBTuner, "Learning to Optimize Tensor Programs", NeurIPS 2018).

Tuning proceeds in plans of ``plan_size`` points. The first plan is the default configuration
and random points (or, after :meth:`XGBTuner.load_history` of other tasks of the target, the
pick of a transferred model). After each plan the cost model is retrained on every measurement
of the task, and simulated annealing over the model's scores picks the next plan: the
``plan_size`` best-scored unmeasured feasible points the annealing chains met, less an
``epsilon`` share of random points so that a wrong model cannot lock the search in.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np

from tvm_accel.tuning.cost_model import XGBCostModel
from tvm_accel.tuning.task import MeasureInput, MeasureResult, Task
from tvm_accel.tuning.tuners import Tuner

__all__ = ["XGBTuner"]

Pairs = list[tuple[MeasureInput, MeasureResult]]


class XGBTuner(Tuner):
    """Cost-model guided tuner.

    ``plan_size``: measurements between retrains; ``loss_type``: ``"rank"`` (pairwise ranking
    within each task) or ``"reg"``; ``epsilon``: share of each plan drawn at random;
    ``sa_chains`` / ``sa_iters`` / ``sa_early_stop``: the annealing (parallel chains, steps,
    steps without a change of the best set before stopping); ``sa_jump_prob``: how often a step
    re-draws a knob instead of moving it to a neighbouring option; ``min_transfer``: how many
    measurements of other tasks it takes to train a transferred base model.
    """

    def __init__(self, task: Task, seed: int | None = 0, plan_size: int = 64,
                 loss_type: str = "rank", epsilon: float = 0.05, sa_chains: int = 128,
                 sa_iters: int = 500, sa_early_stop: int = 50, sa_jump_prob: float = 0.25,
                 min_transfer: int = 32, num_boost_round: int = 60):
        super().__init__(task, seed)
        if plan_size < 1:
            raise ValueError(f"plan_size must be at least 1, got {plan_size}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.plan_size = plan_size
        self.loss_type = loss_type
        self.epsilon = epsilon
        self.sa_chains = sa_chains
        self.sa_iters = sa_iters
        self.sa_early_stop = sa_early_stop
        self.sa_jump_prob = sa_jump_prob
        self.min_transfer = min_transfer
        self.num_boost_round = num_boost_round
        self.model: XGBCostModel | None = None       # trained on this task's measurements
        self.base_model: XGBCostModel | None = None  # trained on other tasks of the target
        self._plan: deque[int] = deque()
        self._since_fit = 0
        self._transfer: Pairs = []  # usable measurements of other tasks
        self._radix_np = np.array(self._radix, dtype=np.int64)
        self._strides = np.array([math.prod(self._radix[k + 1:]) for k in range(len(self._radix))],
                                 dtype=np.int64)
        self._tables, self._tail = self._feature_tables()
        self._model_seed = self.rng.getrandbits(31)

    # --- features ----------------------------------------------------------------------------
    def _feature_tables(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Per-knob feature of each option plus the constant tail (the loop features), so the
        annealing can featurise option-index vectors in bulk; built from ``task.features``."""
        base = self.space.default()
        tables = []
        for k, knob in enumerate(self.space.knobs):
            tables.append(np.array([self.task.features({**base, knob.name: o})[k]
                                    for o in knob.options], dtype=np.float32))
        tail = np.array(self.task.features(base)[len(tables):], dtype=np.float32)
        return tables, tail

    def _featurise(self, vectors: np.ndarray) -> np.ndarray:
        cols = [t[vectors[:, k]] for k, t in enumerate(self._tables)]
        cols += [np.full(len(vectors), v, dtype=np.float32) for v in self._tail]
        return np.stack(cols, axis=1)

    def _compatible(self, task: Task) -> bool:
        return (task.target == self.task.target and task.space.names == self.space.names
                and len(task.loop_features) == len(self._tail))

    @staticmethod
    def _cost(res: MeasureResult) -> float:
        return res.costs[0] if res.ok and res.costs else math.inf

    # --- learning ----------------------------------------------------------------------------
    def _on_update(self, pairs: Pairs) -> None:
        self._since_fit += len(pairs)
        if self._since_fit >= self.plan_size:
            self._plan.clear()  # the next batch replans with a retrained model

    def _on_history(self, own: Pairs, other: Pairs) -> None:
        """Own pairs join the training data; usable pairs of other tasks (same target, same
        knobs) train the base model, which also becomes the starting point of the own one."""
        self._transfer += [(inp, res) for inp, res in other if self._compatible(inp.task)]
        new_base = False
        if other and len(self._transfer) >= self.min_transfer:
            keys: dict[str, int] = {}
            for inp, _ in self._transfer:
                keys.setdefault(inp.task.key, len(keys))
            x = np.array([inp.task.features(inp.config) for inp, _ in self._transfer],
                         dtype=np.float32)
            costs = np.array([self._cost(res) for _, res in self._transfer])
            groups = np.array([keys[inp.task.key] for inp, _ in self._transfer])
            if np.isfinite(costs).any():
                self.base_model = XGBCostModel(self.loss_type, self._model_seed,
                                               self.num_boost_round).fit(x, costs, groups)
                new_base = True
        self._since_fit += len(own)
        if new_base and self.history:
            self._since_fit = max(self._since_fit, 1)  # restack the own model on the new base
        if own or new_base:
            self._plan.clear()

    def _fit(self) -> None:
        """Retrain on this task's measurements once there are a few successful ones."""
        costs = np.array([self._cost(res) for _, res in self.history])
        finite = costs[np.isfinite(costs)]
        if len(finite) < 4 or np.ptp(finite) == 0:
            return
        x = self._featurise(np.array([self.to_vector(self.space.index_of(inp.config))
                                      for inp, _ in self.history], dtype=np.int64))
        self.model = XGBCostModel(self.loss_type, self._model_seed,
                                  self.num_boost_round).fit(x, costs, base=self.base_model)

    # --- proposing ---------------------------------------------------------------------------
    def _propose(self, n: int) -> list[int]:
        replanned = False

        def replan() -> bool:  # at most once per batch: retrain on what is new, then plan
            nonlocal replanned
            if replanned:
                return False
            replanned = True
            if self._since_fit > 0:
                self._fit()
                self._since_fit = 0
            self._make_plan()
            return bool(self._plan)

        return self._from_queue(self._plan, n, replan)

    def _make_plan(self) -> None:
        model = self.model or self.base_model
        top: list[int] = []
        if model is not None:
            n_random = int(round(self.epsilon * self.plan_size))
            top = self._anneal(model.predict, self.plan_size - n_random)
        self._plan.extend(top + self.random_available(self.plan_size - len(top), exclude=top))

    def _anneal(self, score: Callable[[np.ndarray], np.ndarray], k: int) -> list[int]:
        """Simulated annealing over option-index vectors: ``sa_chains`` chains start at the
        best measured points and random feasible ones; each step moves one knob of each chain
        (to a neighbouring option, or a random one with ``sa_jump_prob``) and accepts worse
        scores with probability ``exp(delta / T)``, T falling linearly from the score spread to
        0. Returns the ``k`` best-scored available points met, best first."""
        if k <= 0:
            return []
        rng = np.random.default_rng(self.rng.getrandbits(64))
        n = self.sa_chains
        measured = sorted(((self._cost(res), self.space.index_of(inp.config))
                           for inp, res in self.history), key=lambda p: p[0])
        starts = [i for c, i in measured if math.isfinite(c)][: n // 4]
        starts += self.random_available(n - len(starts), exclude=starts)
        if not starts:
            return []
        cur = np.array([self.to_vector(i) for i in starts], dtype=np.int64)
        cur_s = score(self._featurise(cur))
        heap: list[tuple[float, int]] = []
        in_heap: set[int] = set()

        def consider(flat: np.ndarray, scores: np.ndarray) -> bool:
            changed = False
            for idx, s in zip(flat.tolist(), scores.tolist(), strict=True):
                if idx in in_heap or (heap and len(heap) >= k and s <= heap[0][0]):
                    continue
                if not self.available(idx):
                    continue
                if len(heap) < k:
                    heapq.heappush(heap, (s, idx))
                else:
                    in_heap.discard(heapq.heappushpop(heap, (s, idx))[1])
                in_heap.add(idx)
                changed = True
            return changed

        consider(cur @ self._strides, cur_s)
        spread = float(np.std(cur_s)) or 1.0
        rows = np.arange(len(cur))
        last_change = 0
        for it in range(self.sa_iters):
            temp = spread * (1.0 - it / self.sa_iters)
            knob = rng.integers(len(self._radix), size=len(cur))
            radix = self._radix_np[knob]
            step = rng.choice(np.array([-1, 1]), size=len(cur))
            moved = cur[rows, knob] + step
            moved = np.where((moved < 0) | (moved >= radix), cur[rows, knob] - step, moved)
            jump = rng.random(len(cur)) < self.sa_jump_prob
            moved = np.where(jump, rng.integers(0, radix), moved)
            new = cur.copy()
            new[rows, knob] = np.clip(moved, 0, radix - 1)
            flat = new @ self._strides
            valid = np.fromiter((self.is_valid_index(i) for i in flat.tolist()), dtype=bool,
                                count=len(flat))
            if valid.any():
                new_s = np.full(len(cur), -np.inf)
                new_s[valid] = score(self._featurise(new[valid]))
                with np.errstate(over="ignore", invalid="ignore"):
                    keep = np.exp((new_s - cur_s) / max(temp, 1e-12))
                accept = valid & ((new_s >= cur_s) | (rng.random(len(cur)) < keep))
                cur[accept] = new[accept]
                cur_s[accept] = new_s[accept]
                if consider(flat[valid], new_s[valid]):
                    last_change = it
            if it - last_change >= self.sa_early_stop:
                break
        return [idx for _, idx in sorted(heap, reverse=True)]
