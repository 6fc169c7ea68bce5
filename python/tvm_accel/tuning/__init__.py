"""AutoTVM-style tuning for every target: tasks, measurement in worker processes, tuners
(random, grid search, genetic, XGBoost cost model), tuning records (AutoTVM's 0.2 JSON lines)."""

from tvm_accel.tuning.measure import (
    FAILED_COST,
    MeasureOption,
    Measurer,
    measure_batch,
    measure_option,
)
from tvm_accel.tuning.task import MeasureError, MeasureInput, MeasureResult, Task
from tvm_accel.tuning.tuners import GATuner, GridSearchTuner, RandomTuner, Tuner
from tvm_accel.tuning.xgb import XGBTuner

__all__ = [
    "FAILED_COST",
    "GATuner",
    "GridSearchTuner",
    "MeasureError",
    "MeasureInput",
    "MeasureOption",
    "MeasureResult",
    "Measurer",
    "RandomTuner",
    "Task",
    "Tuner",
    "XGBTuner",
    "measure_batch",
    "measure_option",
]
