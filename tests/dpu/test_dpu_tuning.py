"""DPU tuning tasks: fusion candidates are tasks of their own, measured as the fused group."""

from helpers import models
from tvm_accel.frontend import load_onnx
from tvm_accel.target import get_target
from tvm_accel.tuning.extract import extract_tasks
from tvm_dpu.fusion import FUSION_KNOB
from tvm_dpu.strategy import plan
from tvm_dpu.tuning import measure_group


def test_fusion_candidates_are_tasks_measured_as_the_fused_group():
    model = models.quantized("conv_residual", power_of_two=True, c=16, hw=8, batch=2)
    tasks = extract_tasks(load_onnx(model)[0], get_target("dpu"), None)
    fused = [t for t in tasks if t.name.startswith("dpu.fused.")]
    assert [t.name for t in fused] == ["dpu.fused.conv+add"]
    (task,) = fused
    (name,) = task.layers
    graph, cfg, group = task.context
    assert group == name and "+" in name and len(graph.layers) == 2
    default = task.space.default()
    cycles, seconds, energy = measure_group(task.context, default)
    assert cycles > 0 and seconds > 0 and energy is None
    # the group's knobs reach the fused stream: a plan with them builds that one group
    prog = plan(graph, cfg, {name: default, FUSION_KNOB: {name: True}})
    assert prog.fusion.chosen == [name] and len(prog.layers) == 1
