"""The end-to-end harness's own logic, without sglang: which servers a run starts and against
which reference, what its bounds and log checks accept, and how requests are sent.

The servers themselves run in ``make e2e`` / ``make e2e-short`` / ``make e2e-hybrid``; a fake
``/generate`` endpoint (a thread on a loopback port) stands in for one here, so the load and
alternation code is tested for what it sends and how it orders and counts the answers.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from e2e.client import Generation
from e2e.server import ServerRun

from e2e import checks, load, plan


def test_the_one_folder_plan_defaults_to_the_flagless_launch():
    p = plan.one_folder_plan("/m/w8a8", "/m/float")
    assert p.launch is plan.FORMS["F1"]
    assert p.labels() == [
        "plugin",
        "float",
        "stock",
        "quantized_draft",
        "reference",
        "float_reference",
        "stock_reference",
    ]
    runs = {r.label: r for r in p.runs}
    for label in ("plugin", "stock", "reference", "stock_reference"):
        run = runs[label]
        assert run.target == "/m/w8a8" and run.draft is None
        assert run.quantization is None and run.draft_quantization is None
    assert runs["quantized_draft"].draft_quantization == "modelslim"
    assert runs["quantized_draft"].quantization is None
    assert runs["plugin"].plugin and not runs["stock"].plugin
    assert not runs["reference"].speculative
    assert not runs["stock_reference"].plugin and not runs["stock_reference"].speculative
    assert runs["float"].target == "/m/float" and runs["float"].quantization is None
    assert p.reference_of == {
        "plugin": "reference",
        "stock": "stock_reference",
        "quantized_draft": "reference",
        "float": "float_reference",
    }
    assert p.paired == ("plugin", "float") and p.draft_folder == "/m/w8a8"
    for label in ("plugin", "stock", "float"):  # flagless: no quantization flag at all
        cmd = runs[label].command(1234)
        assert "--quantization" not in cmd
        assert "--speculative-draft-model-quantization" not in cmd
        assert "--speculative-draft-model-path" not in cmd
        assert cmd[cmd.index("--speculative-algorithm") + 1] == "EAGLE"
    assert "--speculative-algorithm" not in runs["reference"].command(1234)


#: each form's flags exactly, and how stock sglang 0.5.23 builds the draft for them
FORM_FLAGS = {
    "F1": ([], None),
    "F2": (["--quantization", "modelslim"], "modelslim"),
    "F3": (["--speculative-draft-model-quantization", "unquant"], None),
    "F4": (["--speculative-draft-model-quantization", "modelslim"], "modelslim"),
}
QUANT_FLAGS = ("--quantization", "--speculative-draft-model-quantization")


def quantization_flags(cmd: list[str]) -> list[str]:
    out = []
    for i, word in enumerate(cmd):
        if word in QUANT_FLAGS:
            out += [word, cmd[i + 1]]
    return out


@pytest.mark.parametrize("form", sorted(FORM_FLAGS))
def test_each_form_launches_exactly_its_quantization_flags(form, tmp_path):
    """F1-F4 differ in their quantization flags only; the draft is built as sglang builds it
    (an unset draft flag takes the target's CLI --quantization, never the auto-detected one)."""
    (tmp_path / "quant_model_description.json").write_text("{}")
    model = str(tmp_path)
    p = plan.one_folder_plan(model, None, form=form)
    runs = {r.label: r for r in p.runs}
    flags, built = FORM_FLAGS[form]
    for label in ("plugin", "stock"):
        cmd = runs[label].command(1)
        assert quantization_flags(cmd) == flags
        assert runs[label].draft_built == built
        assert runs[label].target_modelslim  # auto-detected (F1/F3/F4) or asked for (F2)
        rest = [w for w in cmd if w not in flags]
        assert rest == [w for w in plan.one_folder_plan(model, None).runs[0].command(1)]
    # without speculation only the target's flag is given
    target_flags = flags if form == "F2" else []
    assert quantization_flags(runs["reference"].command(1)) == target_flags
    assert plan.FORMS[form].draft_built == built
    # the draft built quantized has its own run only where the form's draft is not
    assert ("quantized_draft" in runs) == (built is None)


def test_a_folder_without_a_description_is_not_auto_detected(tmp_path):
    run = plan.one_folder_plan(str(tmp_path), None).runs[0]
    assert not run.target_modelslim and run.draft_built is None


def test_the_upstream_plan_launches_step_01s_form_on_the_tree():
    p = plan.upstream_plan("/m/w8a8", "/m/float", "/tree")
    assert p.labels() == ["reference", "float", "float_reference", "stock", "branch"]
    assert p.launch is plan.FORMS["F1"] and not any(r.plugin for r in p.runs)
    runs = {r.label: r for r in p.runs}
    assert runs["stock"].sglang_path is None
    assert all(runs[x].sglang_path == "/tree/python" for x in ("reference", "float", "branch"))
    for label in ("stock", "branch"):
        cmd = runs[label].command(1)
        assert runs[label].target == "/m/w8a8" and quantization_flags(cmd) == []
        assert "--speculative-draft-model-path" not in cmd
    assert p.reference_of == {
        "float": "float_reference",
        "stock": "reference",
        "branch": "reference",
    }
    f3 = plan.upstream_plan("/m/w8a8", "/m/float", "/tree", form="F3")
    branch = {r.label: r for r in f3.runs}["branch"]
    assert quantization_flags(branch.command(1)) == FORM_FLAGS["F3"][0]
    with pytest.raises(ValueError, match="step 01 launches F1 or F3"):
        plan.upstream_plan("/m/w8a8", "/m/float", "/tree", form="F2")


def test_the_upstream_plans_draft_servers_see_the_npu_answer_and_must_announce_it(tmp_path):
    """PR 1 decodes on an NPU only: the upstream run's stock and branch servers get the draft
    module's ``is_npu`` answered True (``site/e2e_shim_npu_check.py``), and a server whose log
    lacks the stand-in's line fails the run; no other plan sets it."""
    import sys

    sys.path.insert(0, str(checks.__file__).rsplit("/", 1)[0] + "/site")
    try:
        import e2e_shim_npu_check
    finally:
        sys.path.pop(0)
    assert e2e_shim_npu_check.E2E_DRAFT_NPU_CHECK_LINE == checks.DRAFT_NPU_CHECK_LINE
    runs = {r.label: r for r in plan.upstream_plan("/m/w8a8", "/m/float", "/tree").runs}
    checked = {label for label, run in runs.items() if run.draft_npu_check}
    assert checked == {"stock", "branch"}
    assert runs["branch"].environment()["E2E_DRAFT_NPU_CHECK"] == "1"
    assert "E2E_DRAFT_NPU_CHECK" not in runs["reference"].environment()
    assert not any(r.draft_npu_check for r in plan.one_folder_plan("/m/w8a8", None).runs)
    log = tmp_path / "branch.log"
    log.write_text("no stand-in line\n")
    result = SimpleNamespace(run=runs["branch"], log_path=str(log))
    assert any("did not announce" in f for f in checks.check_shims({"branch": result}))
    log.write_text(f"{checks.SHIM_MARK} {checks.DRAFT_NPU_CHECK_LINE} (pid 1)\n")
    assert checks.check_shims({"branch": result}) == []


def test_without_a_float_folder_or_in_short_there_is_no_float_run():
    for p in (
        plan.one_folder_plan("/m/w8a8", None),
        plan.one_folder_plan("/m/w8a8", "/f", short=True),
    ):
        assert p.labels() == ["plugin", "stock", "quantized_draft", "reference"]
        assert p.paired == () and "float" not in p.reference_of


def test_tp_size_reaches_every_command_and_binds_one_core_per_rank():
    p = plan.one_folder_plan("/m/w8a8", "/m/float", tp_size=2)
    for run in p.runs:
        cmd = run.command(1)
        assert cmd[cmd.index("--tp-size") + 1] == "2"
        bind = run.environment()["SGLANG_CPU_OMP_THREADS_BIND"]
        assert len(bind.split("|")) == 2
    assert (
        "SGLANG_CPU_OMP_THREADS_BIND" not in plan.one_folder_plan("/m", None).runs[0].environment()
    )


def test_the_two_folder_plan_keeps_the_feature_branch_form():
    p = plan.two_folder_plan("/m/float", "/m/w8a8", upstream_tree="/tree")
    assert p.labels() == ["reference", "float", "stock", "branch"]
    runs = {r.label: r for r in p.runs}
    assert runs["stock"].sglang_path is None and runs["branch"].sglang_path == "/tree/python"
    assert not any(r.plugin for r in p.runs)
    assert runs["branch"].command(1)[-2:] == ["--speculative-draft-model-path", "/m/w8a8"]
    assert runs["float"].draft == "/m/float"


def result(
    label: str, length: float | None, tokens=(1, 2, 3), log: str = "", **run
) -> SimpleNamespace:
    """A fake ``RunResult``: its run, one generation, its accept length, its log file."""
    speculative = run.pop("speculative", length is not None)
    server_run = ServerRun(label, "/m", speculative=speculative, plugin=True, **run)
    return SimpleNamespace(
        run=server_run,
        accept_length=length,
        generations=[Generation(list(tokens), {k: 0 for k in ("spec_verify_ct",)})],
        log_path=log,
    )


def test_bars_take_the_float_run_as_ceiling_or_else_the_quantized_draft():
    full = {
        "float": result("float", 2.4),
        "stock": result("stock", 1.1),
        "plugin": result("plugin", 2.4),
        "quantized_draft": result("quantized_draft", 2.2),
    }
    bars = checks.Bars.of(full)
    assert bars.ceiling_label == "float"
    assert bars.failures() == ["quantized_draft accept length 2.200 < 0.97 x float (2.328)"]
    short = {k: v for k, v in full.items() if k != "float"}
    bars = checks.Bars.of(short)
    assert bars.ceiling_label == "quantized_draft" and bars.ceiling == 2.2
    assert bars.failures() == []
    short["stock"] = result("stock", 1.5)
    assert checks.Bars.of(short).failures() == ["stock accept length 1.500 > 1.3"]
    assert (
        checks.Bars.of(short, float_min=2.5)
        .failures()[0]
        .startswith("quantized_draft accept length 2.200 < 2.5")
    )


def test_the_stock_bound_holds_only_where_stock_serves_the_plugins_target():
    """A stock target of different tokens (a target layer loaded as raw codes) makes stock's
    accept length say nothing about its draft: the bound is not applied, and said so."""
    results = {
        "float": result("float", 2.4),
        "stock": result("stock", 1.8),
        "plugin": result("plugin", 2.4),
        "reference": result("reference", None, (1, 2, 3)),
        "stock_reference": result("stock_reference", None, (1, 2, 3)),
    }
    assert checks.Bars.of(results).failures() == ["stock accept length 1.800 > 1.3"]
    results["stock_reference"] = result("stock_reference", None, (1, 9, 9))
    bars = checks.Bars.of(results)
    assert not bars.stock_target_same and bars.failures() == []


def test_target_agree_counts_each_targets_tokens_equal_to_the_float_targets():
    from e2e import run as e2e_run

    results = {
        "float_reference": result("float_reference", None, (1, 2, 3, 4)),
        "reference": result("reference", None, (1, 2, 3, 5)),
        "stock_reference": result("stock_reference", None, (1, 7, 3, 4)),
    }
    plugin = e2e_run.target_agreement(results)
    stock = e2e_run.target_agreement(results, "stock_reference")
    assert (plugin["equal"], plugin["total"], plugin["first_difference"]) == (3, 4, [3])
    assert (stock["equal"], stock["total"], stock["first_difference"]) == (3, 4, [1])
    del results["stock_reference"]
    assert e2e_run.target_agreement(results, "stock_reference") is None


def test_outputs_are_checked_against_each_runs_own_reference():
    results = {
        "reference": result("reference", None, (1, 2, 3)),
        "float_reference": result("float_reference", None, (1, 2, 4)),
        "plugin": result("plugin", 2.0, (1, 2, 3)),
        "float": result("float", 2.0, (1, 2, 4)),
    }
    reference_of = {"plugin": "reference", "float": "float_reference"}
    assert checks.check_outputs(results, reference_of, ("spec_verify_ct",)) == []
    results["float"] = result("float", 2.0, (1, 2, 3))
    (failure,) = checks.check_outputs(results, reference_of, ("spec_verify_ct",))
    assert failure.startswith("float: prompt 0 differs from the float_reference run from token 2")


def write_log(tmp_path, name: str, *lines: str) -> str:
    path = tmp_path / f"{name}.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


PLUGIN_INFO = "sglang-mtp-dequant: Qwen3_5ForCausalLMMTP draft from /m: dequantized 7 tensors (x)"
TREE = [
    f"{checks.SHIM_MARK} sglang.kernels.ops.speculative.spec_tree.{k}" for k in checks.TREE_KERNELS
]


def test_the_plugin_line_is_required_once_per_rank(tmp_path):
    one = write_log(tmp_path, "one", PLUGIN_INFO, *TREE)
    two = write_log(tmp_path, "two", PLUGIN_INFO, PLUGIN_INFO, *TREE)
    quiet = write_log(tmp_path, "quiet", *TREE)
    for log, tp, failing in ((one, 1, False), (one, 2, True), (two, 2, False)):
        results = {
            "plugin": result("plugin", 2.0, log=log, tp_size=tp),
            "quantized_draft": result("quantized_draft", 2.0, log=quiet),
        }
        failures = checks.check_logs(results, "/m")
        assert bool(failures) == failing, failures
    results = {
        "plugin": result("plugin", 2.0, log=one),
        "quantized_draft": result("quantized_draft", 2.0, log=one),
    }
    assert checks.check_logs(results, "/m") == [
        f"quantized_draft: the fix dequantized something: {[('Qwen3_5ForCausalLMMTP', '/m', '7')]}"
    ]


def test_every_stand_in_a_server_needs_must_announce_itself(tmp_path):
    lines = [f"{checks.SHIM_MARK} {line} (pid 1)" for line in checks.MODELSLIM_SHIM_LINES]
    complete = write_log(tmp_path, "complete", *lines)
    partial = write_log(tmp_path, "partial", *lines[:-1])
    float_run = write_log(tmp_path, "float")
    results = {
        "plugin": result("plugin", 2.0, log=complete, quantization="modelslim"),
        "quantized_draft": result(
            "quantized_draft", 2.0, log=partial, draft_quantization="modelslim"
        ),
        "float": result("float", 2.0, log=float_run),
    }
    (failure,) = checks.check_shims(results)
    assert failure.startswith("quantized_draft: CPU stand-ins that did not announce themselves")
    assert "npu_quant_matmul" in failure
    gdn = [f"{checks.SHIM_MARK} gdn fix {fix}: ..." for fix in checks.GDN_FIXES]
    hybrid_ref = write_log(tmp_path, "hybrid_ref", *gdn)
    hybrid_spec = write_log(tmp_path, "hybrid_spec", *gdn)
    results = {
        "float_reference": result("float_reference", None, log=hybrid_ref),
        "float": result("float", 2.0, log=hybrid_spec),
    }
    (failure,) = checks.check_shims(results, hybrid=True)
    assert failure.startswith("float:") and "scatter-device-check" in failure


def test_in_a_form_whose_draft_sglang_builds_quantized_stock_must_serve_too():
    """F2/F4: stock builds the draft quantized, so it is held to the plugin's bound (not to
    stock_max), and without a float run it is the ceiling itself."""
    results = {
        "float": result("float", 2.4),
        "stock": result("stock", 2.0),
        "plugin": result("plugin", 2.4),
    }
    assert checks.Bars.of(results, stock_broken=False).failures() == [
        "stock accept length 2.000 < 0.97 x float (2.328)"
    ]
    results["stock"] = result("stock", 2.4)
    assert checks.Bars.of(results, stock_broken=False).failures() == []
    short = {"stock": result("stock", 2.4), "plugin": result("plugin", 2.2)}
    bars = checks.Bars.of(short, stock_broken=False)
    assert bars.ceiling_label == "stock" and bars.ceiling == 2.4
    assert bars.failures() == ["plugin accept length 2.200 < 0.97 x stock (2.328)"]


def test_in_a_form_whose_draft_sglang_builds_quantized_the_fix_must_not_act(tmp_path):
    acted = write_log(tmp_path, "acted", PLUGIN_INFO, *TREE)
    quiet = write_log(tmp_path, "quiet", *TREE)
    results = {"plugin": result("plugin", 2.0, log=quiet), "stock": result("stock", 2.0, log=quiet)}
    assert checks.check_logs(results, "/m", expect_fix=False) == []
    results["plugin"] = result("plugin", 2.0, log=acted)
    (failure,) = checks.check_logs(results, "/m", expect_fix=False)
    assert failure.startswith("plugin: the draft is built quantized in this form, yet the fix")


def test_an_auto_detected_modelslim_target_needs_the_stand_ins(tmp_path):
    """F1 gives no --quantization: the description in the folder makes sglang build the
    target quantized, so its server must show the NPU stand-ins ran."""
    folder = tmp_path / "w8a8"
    folder.mkdir()
    (folder / "quant_model_description.json").write_text("{}")
    quiet = write_log(tmp_path, "quiet", *TREE)
    run = ServerRun("plugin", str(folder), speculative=True, plugin=True, draft_quantization=None)
    flagless = SimpleNamespace(run=run, log_path=quiet)
    (failure,) = checks.check_shims({"plugin": flagless})
    assert "npu_dynamic_quant" in failure


def test_e2e_serves_f1_by_default_and_step_01s_form_on_the_tree():
    from e2e import run as e2e_run

    args = e2e_run.parse_args([])
    assert args.layout == "one-folder" and e2e_run.make_plan(args).launch.key == "F1"
    args = e2e_run.parse_args(["--short", "--form", "F2"])
    p = e2e_run.make_plan(args)
    assert p.launch.key == "F2" and "quantized_draft" not in p.labels()
    args = e2e_run.parse_args(["--short", "--upstream-tree", "/tree"])
    p = e2e_run.make_plan(args)
    assert p.form == "upstream" and p.launch.key == "F1"
    assert {r.label: r for r in p.runs}["float"].target.endswith("test/fixtures/e2e/float")
    with pytest.raises(SystemExit):
        e2e_run.parse_args(["--upstream-tree", "/tree", "--form", "F4"])
    with pytest.raises(SystemExit):
        e2e_run.parse_args(["--target", "/f", "--form", "F1"])
    assert e2e_run.parse_args(["--family", "moe"]).layout == "two-folder"


class FakeSglang(BaseHTTPRequestHandler):
    """``/generate`` answering ``prompt[0]`` repeated, after ``prompt[1]`` milliseconds."""

    received: list[tuple[int, list[int]]] = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["input_ids"]
        with self.lock:
            FakeSglang.received.append((self.server.server_port, prompt))
        time.sleep(prompt[1] / 1000)
        tokens = body["sampling_params"]["max_new_tokens"]
        answer = {"output_ids": [prompt[0]] * tokens, "meta_info": {"completion_tokens": tokens}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_servers():
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), FakeSglang) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    FakeSglang.received = []
    yield [f"http://127.0.0.1:{s.server_port}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_concurrent_requests_are_sent_together_and_returned_in_prompt_order(fake_servers):
    prompts = [[token, 300 - 30 * token] for token in range(8)]  # the first answers last
    started = time.perf_counter()
    generations = load.concurrent(fake_servers[0], prompts, 4)
    seconds = time.perf_counter() - started
    assert [g.output_ids for g in generations] == [[t] * 4 for t in range(8)]
    assert seconds < 0.3 * 8 / 2  # together: about the slowest one, not the sum (2.2 s)


def test_alternated_rounds_send_each_prompt_to_both_servers_in_rotating_order(fake_servers):
    urls = {"plugin": fake_servers[0], "float": fake_servers[1]}
    prompts = [[1, 5], [2, 5], [3, 5]]
    pairing = load.alternated(urls, prompts, 6, rounds=2)
    ports = [int(u.rsplit(":", 1)[1]) for u in fake_servers]
    order = [(ports.index(port), prompt[0]) for port, prompt in FakeSglang.received]
    assert order == [(0, 1), (1, 1), (1, 2), (0, 2), (0, 3), (1, 3)] * 2
    assert [r["plugin"]["tokens"] for r in pairing.rounds] == [18, 18]
    assert len(pairing.generations("float")) == 2
    ratio = pairing.ratio("plugin", "float")
    assert len(ratio["rounds"]) == 2 and ratio["min"] <= ratio["median"] <= ratio["max"]


def test_targets_only_runs_the_three_targets_without_speculation():
    from e2e import run as e2e_run

    args = e2e_run.parse_args(
        ["--family", "hybrid", "--model", "/m/w8a8", "--float", "/m/float", "--targets-only"]
    )
    p = e2e_run.make_plan(args)
    assert p.labels() == ["reference", "float_reference", "stock_reference"]
    assert p.reference_of == {} and p.paired == ()
    assert not any(run.speculative for run in p.runs)


def test_a_targets_only_run_writes_every_targets_tokens_to_its_json(tmp_path):
    """``--targets-only --json``: each server's tokens and both agreements, as a full run
    writes them (``e2e/quantized_reference.py --server-json`` reads them back)."""
    from e2e import run as e2e_run

    path = tmp_path / "targets.json"
    args = e2e_run.parse_args(
        ["--family", "hybrid", "--model", "/m/w8a8", "--float", "/m/float", "--targets-only"]
    )
    args.json = str(path)
    results = []
    for label, tokens in (("reference", (1, 2, 3, 5)), ("float_reference", (1, 2, 3, 4))):
        server = ServerRun(label, "/m", speculative=False, plugin=True)
        generation = Generation(list(tokens), {"completion_tokens": 4}, seconds=1.0)
        results.append(e2e_run.RunResult(server, generations=[generation]))
    e2e_run.write_json(args, e2e_run.make_plan(args), [[9, 9]], results, ["a failure"])
    written = json.loads(path.read_text())
    assert [r["label"] for r in written["runs"]] == ["reference", "float_reference"]
    assert written["runs"][0]["requests"][0]["output_ids"] == [1, 2, 3, 5]
    assert written["target_agreement"]["equal"] == 3 and written["stock_target_agreement"] is None
    assert written["prompts"] == [[9, 9]] and written["failures"] == ["a failure"]
