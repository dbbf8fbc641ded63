"""``benchmarks/bench_startup.py`` reads sglang's own start-up timings from a server's log."""

from __future__ import annotations

from benchmarks import bench_startup

#: the line as sglang 0.5.23 logged it in a start of the bundled hybrid export
LINE = (
    "[2026-12-06 10:04:24] Engine startup timings (s): load_weight=0.21, "
    "kv_cache_allocation=0.55, scheduler_e2e=3.04, cuda_graph={prefill=0.00, decode=0.00, "
    "target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, "
    "tokenizer_e2e=68.32\n"
)


def test_sglangs_startup_timings_are_read_from_the_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2026-12-06 10:04:23] Load weight begin.\n" + LINE)
    assert bench_startup.sglang_timings(str(log)) == {
        "load_weight": 0.21,
        "scheduler_e2e": 3.04,
        "tokenizer_e2e": 68.32,
    }


def test_a_log_without_the_line_gives_no_timings(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2026-12-06 10:04:23] Load weight begin.\n")
    assert bench_startup.sglang_timings(str(log)) == {}
    assert (
        bench_startup.summary([]) == "-" and bench_startup.summary([3.0, 1.0, 2.0]) == "1.00/2.00"
    )
