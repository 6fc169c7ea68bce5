"""The main job (README's first command) runs every finished target bit-exactly."""

from tvm_accel import demo


def test_demo_runs_every_finished_target_bit_exact(capsys):
    assert set(demo.FINISHED_TARGETS) <= set(demo.BUNDLED_MODELS)
    assert all(p.is_file() for p in demo.BUNDLED_MODELS.values())
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    for t in demo.FINISHED_TARGETS:
        assert f"=== target {t}" in out
    dpu = next(ln for ln in out.splitlines() if ln.startswith("=== target dpu"))
    assert "batch 4 (input [4, " in dpu  # one image per PE: the header says so
    assert "all targets bit-exact" in out
