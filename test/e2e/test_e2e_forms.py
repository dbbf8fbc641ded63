"""The form table's own logic (``e2e/forms.py``), without sglang: which servers a fixture's rows
start, how a stopped server's log becomes its cell, and what fails the table.

The servers themselves run in ``make e2e-forms``; the logs here are written the way sglang's
launcher and scheduler write them (a scheduler traceback, then the launcher's wrapper).
"""

from __future__ import annotations

import pytest
from e2e.client import Generation

from e2e import checks, forms

SCHEDULER_DIED = """\
[2026-12-07 08:40:01] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/sglang/srt/managers/scheduler.py", line 3100, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)
  File "/v/sglang/srt/layers/quantization/modelslim/modelslim.py", line 390, in get_moe_scheme
    raise NotImplementedError(
NotImplementedError: Unsupported FusedMoe modelslim scheme: FLOAT for mtp.layers.0.mlp.experts
  second line of the message

[2026-12-07 08:40:02] Received sigquit from a child process. It usually means the child failed.
Traceback (most recent call last):
  File "/v/sglang/launch_server.py", line 30, in <module>
    launch_server(server_args)
Exception: Rank 0 scheduler is dead. Please check if there are relevant logs.
"""

NPU_OP = """\
[2026-12-07 08:41:00] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/sglang/srt/hardware_backend/npu/quantization/moe_methods.py", line 184, in fused_moe_npu
    torch.ops.npu.npu_moe_init_routing(
  File "/v/torch/_ops.py", line 1300, in __getattr__
    raise AttributeError(
AttributeError: '_OpNamespace' 'npu' object has no attribute 'npu_moe_init_routing'
"""


def test_the_real_exception_is_the_schedulers_not_the_launchers_wrapper():
    assert forms.exception_line(SCHEDULER_DIED) == (
        "NotImplementedError: Unsupported FusedMoe modelslim scheme: FLOAT for "
        "mtp.layers.0.mlp.experts"
    )
    assert forms.npu_piece(SCHEDULER_DIED, forms.exception_line(SCHEDULER_DIED)) is None
    only_wrapper = SCHEDULER_DIED.split("[2026-12-07 08:40:02]")[1]
    assert forms.exception_line(only_wrapper).startswith("Exception: Rank 0 scheduler is dead")
    assert forms.exception_line("no traceback here\n") is None


def test_an_ascend_operator_that_stops_a_server_is_named():
    error = forms.exception_line(NPU_OP)
    assert error.startswith("AttributeError: '_OpNamespace' 'npu'")
    assert forms.npu_piece(NPU_OP, error) == "torch.ops.npu.npu_moe_init_routing"
    assert forms.npu_piece("", "ModuleNotFoundError: No module named 'torch_npu'") == "torch_npu"


def test_each_fixture_runs_the_float_ceiling_its_references_and_every_form_off_and_on(tmp_path):
    fixture = forms.Fixture("w8a8", "/m/w8a8", "/m/float")
    runs = forms.fixture_runs(fixture, ["F1", "F2", "F3", "F4"])
    labels = [label for label, _ in runs]
    assert labels == [
        "float",
        "reference-off",
        "F1-off",
        "F2-off",
        "F3-off",
        "F4-off",
        "reference-on",
        "F1-on",
        "F2-on",
        "F3-on",
        "F4-on",
    ]
    by_label = dict(runs)
    assert all(run.label == label for label, run in runs)  # each server logs to its own file
    assert by_label["float"].target == "/m/float" and not by_label["float"].plugin
    assert by_label["float"].command(1).count("--speculative-draft-model-quantization") == 0
    for label, run in runs[1:]:
        assert run.target == "/m/w8a8" and run.plugin == label.endswith("-on")
        assert run.speculative == (not label.startswith("reference"))
    assert by_label["F2-on"].quantization == "modelslim"
    assert by_label["F4-off"].draft_quantization == "modelslim"
    assert by_label["F1-on"].quantization is None and by_label["F1-on"].draft_quantization is None


def test_a_fixtures_float_folder_is_its_named_sibling_or_the_bundled_float(tmp_path):
    for name in ("float", "moe_float", "moe_w8a8", "moe_float_experts", "w8a8"):
        (tmp_path / name).mkdir()
    assert forms.parse_fixture(str(tmp_path / "moe_w8a8")).float_folder == str(
        tmp_path / "moe_float"
    )
    assert forms.parse_fixture(str(tmp_path / "moe_float_experts")).float_folder == str(
        tmp_path / "moe_float"
    )
    assert forms.parse_fixture(str(tmp_path / "w8a8")).float_folder == str(tmp_path / "float")
    given = forms.parse_fixture(f"{tmp_path / 'w8a8'}={tmp_path / 'moe_float'}")
    assert given.name == "w8a8" and given.float_folder == str(tmp_path / "moe_float")


def cell(label: str, tokens, accept: float | None, error: str | None = None, log: str = ""):
    """A fake served (or stopped) cell: accept length from one request's meta_info."""
    run = dict(forms.fixture_runs(forms.Fixture("x", "/m", "/f"), ["F1", "F2"]))[label]
    meta = {"completion_tokens": 16}
    if accept is not None:
        meta["spec_verify_ct"] = round(16 / accept)
    generations = [] if error else [Generation(list(tokens), meta)]
    return forms.Cell(label, run, log_path=log, generations=generations, error=error)


@pytest.fixture
def cells(tmp_path):
    quiet = tmp_path / "stand-ins.log"  # F2's quantized target needs the NPU stand-ins
    quiet.write_text("".join(f"{checks.SHIM_MARK} {x}\n" for x in checks.MODELSLIM_SHIM_LINES))
    log = str(quiet)
    return {
        "float": cell("float", (1, 2), 2.0, log=log),
        "reference-off": cell("reference-off", (1, 2), None, log=log),
        "reference-on": cell("reference-on", (1, 2), None, log=log),
        "F1-off": cell("F1-off", (1, 2), 16 / 14, log=log),
        "F1-on": cell("F1-on", (1, 2), 2.0, log=log),
        "F2-off": cell("F2-off", (), None, error="NotImplementedError: FLOAT", log=log),
        "F2-on": cell("F2-on", (1, 2), 2.0, log=log),
    }


def test_a_table_that_serves_right_passes_and_its_rows_say_so(cells):
    fixture = forms.Fixture("x", "/m", "/f")
    assert forms.failures_of(fixture, cells, ["F1", "F2"]) == []
    rows = forms.fixture_rows(fixture, cells, ["F1", "F2"])
    assert rows[0] == "| x | float (f) | off | **2.000** (16/8) | ceiling | - |"
    f1_off = next(r for r in rows if r.startswith("| x | F1 flagless | off |"))
    assert "**1.143** (16/14)" in f1_off and "| no (0.57) | yes |" in f1_off
    f2_off = next(r for r in rows if r.startswith("| x | F2 "))
    assert "stops: `NotImplementedError: FLOAT`" in f2_off and f2_off.endswith("| - | - |")


def test_wrong_tokens_or_a_plugin_cell_under_the_bound_fail_the_table(cells):
    fixture = forms.Fixture("x", "/m", "/f")
    cells["F1-on"] = cell("F1-on", (1, 3), 16 / 10, log=cells["F1-on"].log_path)
    assert forms.failures_of(fixture, cells, ["F1", "F2"]) == [
        "x F1 plugin on: tokens no (prompt 0 from token 1)",
        "x F1 plugin on: accept length 1.600 < 0.97 x float (2.000)",
    ]
    cells["float"] = cell("float", (), None, error="RuntimeError: boom")
    assert forms.failures_of(fixture, cells, ["F1", "F2"])[0] == (
        "x: the float run stopped: RuntimeError: boom"
    )


RUNNER = """\
[2026-12-07 08:45:10] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/sglang/srt/layers/moe/moe_runner/base.py", line 269, in get_pre_permute
    assert pre_permute_func is not None, (
AssertionError: Pre-permute function for standard to ascend is not registered
"""


def test_sglangs_ascend_moe_runner_is_named_as_the_npu_only_piece():
    error = forms.exception_line(RUNNER)
    piece = forms.npu_piece(RUNNER, error)
    assert piece.startswith("sglang's `ascend` MoE runner") and "here `standard`)" in piece


def test_a_saved_table_is_rendered_again_with_each_stopped_cell_read_from_its_log(cells, tmp_path):
    log = tmp_path / "server-F2-off.log"
    log.write_text(RUNNER)
    cells["F2-off"].log_path = str(log)
    saved = {
        "machine": "machine: test",
        "fixtures": [
            {
                "fixture": "/m",
                "float": "/f",
                "forms": ["F1", "F2"],
                "cells": [cell.to_json() for cell in cells.values()],
            }
        ],
    }
    path = tmp_path / "forms.json"
    path.write_text(__import__("json").dumps(saved))
    machine, [(fixture, loaded, names)] = forms.load_cells(str(path))
    assert machine == "machine: test" and names == ["F1", "F2"] and fixture.name == "m"
    assert loaded["F1-on"].accept_length == cells["F1-on"].accept_length
    assert loaded["F2-off"].error.startswith("AssertionError: Pre-permute")
    assert loaded["F2-off"].npu_piece.startswith("sglang's `ascend` MoE runner")


def test_the_stand_ins_announcements_are_not_taken_for_the_stopping_piece():
    shim = (
        "sglang-mtp-dequant e2e shim: registered CPU stand-ins for torch.ops.npu.npu_dynamic_quant"
    )
    log = shim + "\n" + SCHEDULER_DIED
    assert forms.npu_piece(log, forms.exception_line(log)) is None
    frames_only = NPU_OP.replace(
        "AttributeError: '_OpNamespace' 'npu' object has no attribute 'npu_moe_init_routing'",
        "RuntimeError: an operator failed",
    )
    assert forms.npu_piece(frames_only, forms.exception_line(frames_only)) == (
        "torch.ops.npu.npu_moe_init_routing"
    )


def test_a_rerun_cell_replaces_the_earlier_runs_cell_when_tables_are_merged(cells, tmp_path):
    import json
    from types import SimpleNamespace

    def saved(chosen: dict) -> dict:
        cells_json = [cell.to_json() for cell in chosen.values()]
        entry = {"fixture": "/m", "float": "/f", "forms": ["F1", "F2"], "cells": cells_json}
        return {"machine": "m", "fixtures": [entry]}

    first = dict(cells, **{"F2-on": cell("F2-on", (), None, error="ValueError: memory")})
    rerun = {"F2-on": cells["F2-on"]}
    paths = [tmp_path / "first.json", tmp_path / "rerun.json"]
    for path, chosen in zip(paths, (first, rerun), strict=True):
        path.write_text(json.dumps(saved(chosen)))
    args = SimpleNamespace(markdown=str(tmp_path / "t.md"))
    assert forms.render([str(p) for p in paths], args) == 0
    table = (tmp_path / "t.md").read_text()
    f2_on = next(r for r in table.splitlines() if r.startswith("| m | F2 ") and "| on |" in r)
    assert "**2.000** (16/8)" in f2_on and "memory" not in table


def test_a_table_stopped_part_way_shows_and_fails_each_cell_it_never_started(cells):
    fixture = forms.Fixture("x", "/m", "/f")
    del cells["F2-on"]
    rows = forms.fixture_rows(fixture, cells, ["F1", "F2"])
    assert any(r.startswith("| x | F2 ") and forms.NOT_RUN in r for r in rows)
    assert forms.failures_of(fixture, cells, ["F1", "F2"]) == [f"x F2-on: {forms.NOT_RUN}"]
