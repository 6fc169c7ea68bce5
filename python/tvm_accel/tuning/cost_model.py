"""A gradient-boosted cost model over configuration features (xgboost).

The model does not predict times; it scores configurations so that faster ones score higher,
which is all a search needs. Labels are speeds relative to the best point of the same task
(``best_cost / cost``, 0 for a failed measurement), AutoTVM's normalisation: a task's absolute
speed does not matter, so measurements of several tasks can train one model. With the default
``loss_type="rank"`` each task is a query group of a pairwise ranking objective (only the order
within a task is learned); ``"reg"`` regresses the relative speed.

``base`` stacks a model on another one (transfer learning): the base model's scores are the
starting margin and the new trees learn the correction from the task's own data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["XGBCostModel", "relative_speed"]

_OBJECTIVES = {"rank": "rank:pairwise", "reg": "reg:squarederror"}


def relative_speed(costs: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``best / cost`` within each group (1 for the best point, 0 for failures: cost inf)."""
    costs = np.asarray(costs, dtype=float)
    groups = np.asarray(groups)
    out = np.zeros(len(costs))
    for g in np.unique(groups):
        sel = groups == g
        ok = sel & np.isfinite(costs)
        if ok.any():
            out[ok] = costs[ok].min() / costs[ok]
    return out


class XGBCostModel:
    """Boosted trees (depth 3, eta 0.3, single-threaded: the measurement workers own the
    cores) trained on feature rows and measured costs; :meth:`predict` gives scores, higher is
    faster."""

    def __init__(self, loss_type: str = "rank", seed: int = 0, num_boost_round: int = 60,
                 max_depth: int = 3, eta: float = 0.3):
        if loss_type not in _OBJECTIVES:
            raise ValueError(f"loss_type {loss_type!r}: use one of {sorted(_OBJECTIVES)}")
        self.loss_type = loss_type
        self.seed = seed
        self.num_boost_round = num_boost_round
        self.params = {"objective": _OBJECTIVES[loss_type], "max_depth": max_depth, "eta": eta,
                       "min_child_weight": 0, "nthread": 1,
                       "seed": seed, "verbosity": 0}
        if loss_type == "rank":
            self.params["lambdarank_pair_method"] = "mean"
            self.params["lambdarank_num_pair_per_sample"] = 8
        self.base: XGBCostModel | None = None
        self._booster: Any = None  # an xgboost Booster once fitted

    def fit(self, features: np.ndarray, costs: np.ndarray, groups: np.ndarray | None = None,
            base: XGBCostModel | None = None) -> XGBCostModel:
        """Train on ``features`` (rows) and ``costs`` (seconds, ``inf`` for failures);
        ``groups`` says which task each row belongs to (one task when omitted)."""
        import xgboost as xgb

        x = np.asarray(features, dtype=np.float32)
        costs = np.asarray(costs, dtype=float)
        groups = np.zeros(len(costs), dtype=np.int64) if groups is None else np.asarray(groups)
        order = np.argsort(groups, kind="stable")  # query groups must be contiguous
        x, costs, groups = x[order], costs[order], groups[order]
        label = relative_speed(costs, groups)
        _, qid = np.unique(groups, return_inverse=True)
        dtrain = xgb.DMatrix(x, label=label, nthread=1,
                             qid=qid if self.loss_type == "rank" else None)
        self.base = base
        if base is not None:
            dtrain.set_base_margin(base.predict(x))
        self._booster = xgb.train(self.params, dtrain, num_boost_round=self.num_boost_round)
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores of feature rows (higher = predicted faster)."""
        if self._booster is None:
            raise RuntimeError("the cost model has not been trained")
        x = np.asarray(features, dtype=np.float32)
        if self.base is not None:
            return self._booster.inplace_predict(x, base_margin=self.base.predict(x))
        return self._booster.inplace_predict(x)
