"""bench/run_all.py and its table: RESULT dicts of the benches' real shapes in, markdown out; fake
bench scripts (ok, crashing, hanging with a child, no RESULT, unreadable RESULT) through the runner."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import results_table as rt  # noqa: E402
import run_all  # noqa: E402

CLI: dict[str, Any] = {"figures": {"dry_run_s": 1.2, "mistake_s": 2.4},
       "baseline": {"python_floor_s": 0.02, "training_stack_import_s": 4.1},
       "ratios": {"dry_run_vs_stack_import": 0.29, "mistake_vs_stack_import": 0.58},
       "targets": {"dry_run_s": 2.0, "mistake_s": 2.0}, "met": {"dry_run_s": True, "mistake_s": False}}
SCHEDULER: dict[str, Any] = {
    "figures": {
        "direct": {"baseline_samples_per_s": 1000.0, "baseline_cpu_ms_per_sample": 0.9, "samples_per_s": 3000.0,
                   "driver_cpu_ms_per_sample": 0.3, "first_rollout_s": 0.5},
        "router": {"baseline_samples_per_s": 900.0, "baseline_cpu_ms_per_sample": 1.0, "samples_per_s": 2400.0,
                   "driver_cpu_ms_per_sample": 0.5, "first_rollout_s": 0.6},
        "inflight": {"loop_lag_p99_ms": 20.0, "kb_per_inflight_episode": 80.0, "peak_inflight": 1024.0},
        "tool": {"tool_baseline_turns_per_s": 100.0, "tool_turns_per_s": 330.0, "tool_cpu_ms_per_turn": 1.0}},
    "baseline": {"baseline_samples_per_s": 1000.0, "baseline_cpu_ms_per_sample": 0.9},
    "ratios": {"samples_per_s_vs_baseline": 3.0, "cpu_per_sample_vs_baseline": 0.33, "tool_turns_vs_baseline": 3.3},
    "targets": {"samples_per_s": 2500.0, "driver_cpu_ms_per_sample": 0.4, "first_rollout_s": 1.0,
                "loop_lag_p99_ms": 50.0, "kb_per_inflight_episode": 64.0, "tool_turns_per_s": 310.0},
    "met": {"samples_per_s": True, "driver_cpu_ms_per_sample": True, "first_rollout_s": True, "loop_lag_p99_ms": True,
            "kb_per_inflight_episode": False, "tool_turns_per_s": True}}
TRANSCRIPTS: dict[str, Any] = {"figures": {"n": 200, "qwen3": {"helper_ms": 1.0}, "qwen3_5": {"helper_ms": 1.1}},
               "baseline": {"qwen3": {"agent_loop_ms": 3.0}, "qwen3_5": {"agent_loop_ms": 3.1}},
               "ratios": {"qwen3": 3.0, "qwen3_5": 0.9}, "targets": {"qwen3": 1.0, "qwen3_5": 1.0},
               "met": {"qwen3": True, "qwen3_5": False}}
SANDBOX: dict[str, Any] = {"warm_p50_ms": 3.1, "warm_p95_ms": 4.0, "warm_target_p50_ms": 5, "warm_target_met": True,
           "pool_of_one_p50_ms": 9.0, "fresh_subprocess_p50_ms": 20.0, "fresh_bwrap_p50_ms": 30.0,
           "warm_speedup_vs_fresh_subprocess": 6.4, "concurrency_speedup": 7.5, "concurrency_target_speedup": 10,
           "docker_warm_exec_p50_ms": None, "load_average": [1.0, 0.5, 0.2]}
SEEDS: dict[str, Any] = {"figures": {"engine_start_s": 20.0, "sdk_caused_failures": 0, "constrained": {"regex_ok": True}},
         "baseline": {"sdk_caused_failures_before": 0}, "ratios": {"sdk_failures_vs_before": None},
         "targets": {"sdk_caused_failures": 0}, "met": {"sdk_caused_failures": True}}


def by_figure(rows: list[rt.Row]) -> dict[str, rt.Row]:
    return {r.figure: r for r in rows}


def test_standard_shape_pairs_each_target_with_its_baseline_and_ratio() -> None:
    rows = by_figure(rt.target_rows("bench_cli", CLI))
    assert set(rows) == {"dry_run_s", "mistake_s"}
    dry, mistake = rows["dry_run_s"], rows["mistake_s"]
    assert (dry.value, dry.target, dry.direction, dry.met) == (1.2, 2.0, "<=", True)
    assert dry.baseline == ("training_stack_import_s", 4.1)
    assert dry.ratio == ("dry_run_vs_stack_import", 0.29)
    assert mistake.met is False and mistake.ratio == ("mistake_vs_stack_import", 0.58)


def test_baseline_pairing_follows_the_ratio_name_among_several() -> None:
    inspect = {"figures": {"index_s": 4.2, "viewer_bytes": 1_500_000, "viewer_open_s": 0.8},
               "baseline": {"json_loads_s": 1.1, "raw_json_bytes": 900_000, "plain_json_page_open_s": 0.3},
               "ratios": {"index_vs_json_loads": 3.8, "viewer_vs_raw_json_bytes": 1.67, "viewer_vs_plain_page_open": 2.6},
               "targets": {"index_s": 10.0, "viewer_bytes": 2_000_000, "viewer_open_s": 2.0}}
    rows = by_figure(rt.target_rows("bench_inspect", inspect))
    assert {f: (r.baseline[0] if r.baseline else None, r.ratio[0] if r.ratio else None) for f, r in rows.items()} == {
        "index_s": ("json_loads_s", "index_vs_json_loads"),
        "viewer_bytes": ("raw_json_bytes", "viewer_vs_raw_json_bytes"),
        "viewer_open_s": ("plain_json_page_open_s", "viewer_vs_plain_page_open")}
    # no `met` in this RESULT: judged from the names (seconds and bytes: lower is better)
    assert all(r.direction == "<=" and r.met is True for r in rows.values())


def test_nested_figures_are_found_by_name_and_shown_with_their_path() -> None:
    rows = by_figure(rt.target_rows("bench_scheduler", SCHEDULER))
    assert set(rows) == {"direct.samples_per_s", "direct.driver_cpu_ms_per_sample", "direct.first_rollout_s",
                         "inflight.loop_lag_p99_ms", "inflight.kb_per_inflight_episode", "tool.tool_turns_per_s"}
    samples = rows["direct.samples_per_s"]
    assert (samples.value, samples.direction, samples.met) == (3000.0, ">=", True)
    assert samples.baseline == ("baseline_samples_per_s", 1000.0)
    assert rows["direct.driver_cpu_ms_per_sample"].baseline == ("baseline_cpu_ms_per_sample", 0.9)
    assert rows["direct.driver_cpu_ms_per_sample"].ratio == ("cpu_per_sample_vs_baseline", 0.33)
    assert rows["tool.tool_turns_per_s"].baseline == ("tool.tool_baseline_turns_per_s", 100.0)
    # nothing in the RESULT is the first rollout's baseline: none is invented
    assert rows["direct.first_rollout_s"].baseline is None and rows["direct.first_rollout_s"].ratio is None
    kb = rows["inflight.kb_per_inflight_episode"]
    assert (kb.met, kb.direction) == (False, "<=")


def test_targets_keyed_by_ratio_take_the_ratio_and_the_baseline_under_the_same_name() -> None:
    rows = by_figure(rt.target_rows("bench_transcripts", TRANSCRIPTS))
    assert rows["qwen3"].value == 3.0 and rows["qwen3"].ratio == ("qwen3", 3.0)
    assert rows["qwen3"].baseline == ("qwen3.agent_loop_ms", 3.0)
    assert rows["qwen3_5"].baseline == ("qwen3_5.agent_loop_ms", 3.1)
    assert (rows["qwen3_5"].met, rows["qwen3_5"].direction) == (False, ">=")


def test_per_template_ratio_targets_pair_the_template_s_own_baseline() -> None:
    bridge = {"figures": {"turn": 16, **{t: {"session_ms": 0.5} for t in ("qwen3", "qwen3_5", "qwen3_coder")}},
              "baseline": {"qwen3": {"naive_ms": 5.1}, "qwen3_5": {"naive_ms": 5.2}, "qwen3_coder": {"naive_ms": 5.3}},
              "ratios": {"qwen3_naive_over_session": 10.2, "qwen3_5_naive_over_session": 9.4,
                         "qwen3_coder_naive_over_session": 10.6},
              "targets": {"qwen3_naive_over_session": 10.0, "qwen3_5_naive_over_session": 10.0,
                          "qwen3_coder_naive_over_session": 10.0}}
    rows = rt.target_rows("bench_bridge", bridge)
    assert [(r.figure, r.baseline, r.met) for r in rows] == [
        ("qwen3_naive_over_session", ("qwen3.naive_ms", 5.1), True),
        ("qwen3_5_naive_over_session", ("qwen3_5.naive_ms", 5.2), False),
        ("qwen3_coder_naive_over_session", ("qwen3_coder.naive_ms", 5.3), True)]


def test_a_figure_matching_two_ratios_equally_gets_none() -> None:
    client = {"figures": {"agentrl_direct_req_per_s": 2500.0},
              "baseline": {"bare_direct_req_per_s": 2800.0, "bare_router_req_per_s": 2300.0},
              "ratios": {"agentrl_vs_bare_direct": 0.89, "router_vs_direct_agentrl": 0.8},
              "targets": {"agentrl_direct_req_per_s": 2000.0}}
    row = rt.target_rows("bench_client", client)[0]
    assert row.ratio is None  # both ratios share two words with the figure: no guess
    assert row.baseline == ("bare_direct_req_per_s", 2800.0)


def test_flat_result_is_sorted_into_sections() -> None:
    assert rt.missing_sections(SANDBOX) == list(rt.SECTIONS)
    parts = rt.sections(SANDBOX)
    assert parts["targets"] == {"warm_p50_ms": 5, "concurrency_speedup": 10}
    assert parts["met"] == {"warm_p50_ms": True}
    assert "warm_speedup_vs_fresh_subprocess" in parts["ratios"] and "warm_p50_ms" in parts["figures"]
    rows = by_figure(rt.target_rows("bench_sandbox", SANDBOX))
    warm, conc = rows["warm_p50_ms"], rows["concurrency_speedup"]
    assert (warm.met, warm.direction, warm.baseline) == (True, "<=", ("fresh_subprocess_p50_ms", 20.0))
    assert warm.ratio == ("warm_speedup_vs_fresh_subprocess", 6.4)
    # no verdict printed for the concurrency target: judged here, and 7.5 < 10 is a miss
    assert (conc.value, conc.direction, conc.met) == (7.5, ">=", False)


def test_bench_verdict_decides_and_tells_the_direction() -> None:
    result = {"figures": {"odd_name": 3.0, "other": 1.0}, "baseline": {}, "ratios": {},
              "targets": {"odd_name": 2.0, "other": 2.0}, "met": {"odd_name": False, "other": False}}
    rows = by_figure(rt.target_rows("b", result))
    assert (rows["odd_name"].direction, rows["odd_name"].met) == ("<=", False)  # 3 > 2 and missed: at most 2
    assert (rows["other"].direction, rows["other"].met) == (">=", False)  # 1 < 2 and missed: at least 2


def test_met_as_one_bool() -> None:
    one = {"figures": {"a_s": 3.0}, "baseline": {}, "ratios": {}, "targets": {"a_s": 2.0}, "met": True}
    assert rt.target_rows("b", one)[0].met is True  # the bench's verdict, whatever the name suggests
    two = {"figures": {"a_s": 1.0, "b_per_s": 5.0}, "baseline": {}, "ratios": {},
           "targets": {"a_s": 2.0, "b_per_s": 10.0}, "met": False}
    rows = by_figure(rt.target_rows("b", two))
    assert (rows["a_s"].met, rows["b_per_s"].met) == (True, False)  # one bool over two targets: judged per row


def test_missing_targets_give_no_rows_and_a_note() -> None:
    result = {"figures": {"x_s": 1.0}, "baseline": {"y_s": 2.0}, "ratios": {"x_vs_y": 0.5}}
    assert rt.target_rows("b", result) == []
    assert rt.missing_sections(result) == ["targets"]
    page = rt.render_markdown([rt.BenchRun("bench_notarget", rt.Outcome.OK, "", 1.0, result)], [],
                              command="c", started="now")
    assert "RESULT lacks targets" in page


def test_value_missing_or_null_is_not_judged() -> None:
    rows = by_figure(rt.target_rows("bench_example_seeds", SEEDS))
    assert rows["sdk_caused_failures"].met is True and rows["sdk_caused_failures"].direction == "<="
    assert rows["sdk_caused_failures"].baseline == ("sdk_caused_failures_before", 0)
    gone = {"figures": {"a": None}, "baseline": {}, "ratios": {}, "targets": {"a": 1.0, "absent_s": 2.0},
            "met": {"a": True}}
    rows = by_figure(rt.target_rows("b", gone))
    assert rows["a"].met is None and rows["absent_s"].met is None and rows["absent_s"].value is None


@pytest.mark.parametrize(("name", "direction"), [
    ("samples_per_s", ">="), ("loop_lag_p99_ms", "<="), ("kb_per_inflight_episode", "<="),
    ("engine_speedup", ">="), ("overhead_fraction", "<="), ("viewer_bytes", "<="), ("tool_turns_per_s", ">=")])
def test_direction_from_the_name_when_the_bench_gives_no_verdict(name: str, direction: str) -> None:
    result = {"figures": {name: 5.0}, "baseline": {}, "ratios": {}, "targets": {name: 5.0}}
    row = rt.target_rows("b", result)[0]
    assert row.direction == direction and row.met is True  # equal to the target passes either way


def _tables(page: str) -> list[list[list[str]]]:
    """Every markdown table of the page, as rows of cells (escaped pipes kept inside cells)."""
    tables: list[list[list[str]]] = []
    previous = False
    for line in page.splitlines():
        is_row = line.startswith("|")
        if is_row:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not previous:
                tables.append([])
            tables[-1].append(cells)
        previous = is_row
    return tables


def test_page_has_one_row_per_target_and_every_bench_with_its_outcome() -> None:
    runs = [rt.BenchRun("bench_cli", rt.Outcome.OK, "", 12.3, CLI),
            rt.BenchRun("bench_scheduler", rt.Outcome.OK, "", 80.0, SCHEDULER),
            rt.BenchRun("bench_sandbox", rt.Outcome.OK, "", 40.0, SANDBOX),
            rt.BenchRun("bench_megatron", rt.Outcome.SKIPPED, "needs CUDA"),
            rt.BenchRun("bench_bridge", rt.Outcome.NO_RESULT, "no line starts with 'RESULT '", 30.0),
            rt.BenchRun("bench_broken", rt.Outcome.FAILED, "exit 1: ValueError: a|b", 2.0),
            rt.BenchRun("bench_slow", rt.Outcome.TIMED_OUT, "killed after 5 s", 5.0)]
    machine = [("CPU", "Some CPU @ 2.0GHz"), ("cores", "2")]
    page = rt.render_markdown(runs, machine, command="python bench/run_all.py", started="2026-01-01 00:00 UTC")
    machine_t, targets_t, benches_t = _tables(page)
    for table in (machine_t, targets_t, benches_t):
        assert len({len(row) for row in table}) == 1, table  # every row has the header's cells
    assert machine_t[2:] == [["CPU", "Some CPU @ 2.0GHz"], ["cores", "2"]]
    expected = len(CLI["targets"]) + len(SCHEDULER["targets"]) + 2
    assert len(targets_t) - 2 == expected
    marks = [row[-1] for row in targets_t[2:]]
    assert marks.count("❌ miss") == 3  # mistake_s, kb_per_inflight_episode, concurrency_speedup
    assert f"**{expected - 3} of {expected} targets met**" in page
    outcomes = {row[0]: (row[1], row[-1]) for row in benches_t[2:]}
    assert outcomes["bench_megatron"] == ("skipped", "needs CUDA")
    assert outcomes["bench_broken"] == ("failed", "exit 1: ValueError: a\\|b")
    assert outcomes["bench_slow"][0] == "timed out" and outcomes["bench_bridge"][0] == "no RESULT line"
    assert "flat RESULT" in outcomes["bench_sandbox"][1]
    raw = re.findall(r"```json\n(.*?)\n```", page, re.S)
    assert [json.loads(r) for r in raw] == [CLI, SCHEDULER, SANDBOX]  # every RESULT reproduced whole


def test_progress_summary_names_the_missed_targets() -> None:
    line = rt.progress_summary(rt.BenchRun("bench_scheduler", rt.Outcome.OK, "", 81.25, SCHEDULER))
    assert "81.2 s" in line and "5/6 targets met" in line and "inflight.kb_per_inflight_episode" in line
    assert "needs CUDA" in rt.progress_summary(rt.BenchRun("bench_megatron", rt.Outcome.SKIPPED, "needs CUDA"))


# -- the runner, on fake benches ------------------------------------------------------------------------

FAKES = {
    "bench_ok": """
        import json
        print("warming up")
        print("RESULT " + json.dumps({"figures": {"x_s": 9.0}, "targets": {"x_s": 1.0}}))
        print("RESULT " + json.dumps({"figures": {"x_s": 3.0}, "baseline": {"plain_x_s": 6.0},
                                      "ratios": {"x_vs_plain": 0.5}, "targets": {"x_s": 2.0}, "met": {"x_s": False}}))
        print("done")
    """,
    "bench_crash": """
        print("about to fail")
        raise ValueError("the bench broke")
    """,
    "bench_noresult": """
        print("figures only in prose: 3 s")
    """,
    "bench_badjson": """
        print("RESULT {not json")
    """,
    "bench_hang": """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open(sys.argv[0] + ".child", "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(120)
    """,
    "bench_gpu": """
        open(__file__ + ".ran", "w").write("ran")
    """,
}


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    folder = tmp_path / "bench"
    folder.mkdir()
    for name, code in FAKES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(code))
    return folder


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"  # killed, waiting for its new parent to reap it


def test_run_all_end_to_end_on_fake_benches(fakes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "RESULTS.md"
    started = time.monotonic()
    code = run_all.main(["--bench-dir", str(fakes), "--out", str(out), "--timeout-s", "3", "--logs",
                         str(tmp_path / "logs"), "--skip", "gpu"])
    took = time.monotonic() - started
    assert code == 1  # crash, unreadable RESULT and timeout
    assert took < 60
    page = out.read_text()
    _, targets_t, benches_t = _tables(page)
    assert targets_t[2:] == [["bench_ok", "`x_s`", "3", "`plain_x_s` = 6", "`x_vs_plain` = 0.5", "≤ 2", "❌ miss"]]
    outcomes = {row[0]: (row[1], row[-1]) for row in benches_t[2:]}
    assert set(outcomes) == {"bench_ok", "bench_crash", "bench_noresult", "bench_badjson", "bench_hang"}
    assert outcomes["bench_ok"][0] == "ok"
    assert outcomes["bench_crash"][0] == "failed" and "ValueError: the bench broke" in outcomes["bench_crash"][1]
    assert outcomes["bench_noresult"][0] == "no RESULT line"
    assert outcomes["bench_badjson"][0] == "failed" and "unreadable RESULT" in outcomes["bench_badjson"][1]
    assert outcomes["bench_hang"] == ("timed out", "killed after 3 s")
    child = int((fakes / "bench_hang.py.child").read_text())
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), "the hanging bench's child outlived the timeout"
    assert "about to fail" in (tmp_path / "logs" / "bench_crash.log").read_text()
    console = capsys.readouterr().out
    assert "bench_ok: ok in" in console and "0/1 targets met, missed: x_s" in console


def test_missed_targets_alone_exit_zero(fakes: Path, tmp_path: Path) -> None:
    out = tmp_path / "R.md"
    assert run_all.main(["--bench-dir", str(fakes), "--out", str(out), "--only", "ok", "noresult.py"]) == 0
    assert "❌ miss" in out.read_text()


def test_a_bench_whose_requirement_is_missing_is_skipped_unrun(fakes: Path, tmp_path: Path) -> None:
    runs = run_all.run_all(["bench_gpu", "bench_ok"], fakes, timeout_s=30, log_dir=tmp_path,
                           probe=lambda name: "needs CUDA" if name == "bench_gpu" else None, say=lambda _: None)
    assert [(r.name, r.outcome, r.detail) for r in runs] == [
        ("bench_gpu", rt.Outcome.SKIPPED, "needs CUDA"), ("bench_ok", rt.Outcome.OK, "")]
    assert not (fakes / "bench_gpu.py.ran").exists()


def test_select_only_skip_and_unknown_names() -> None:
    names = ["bench_a", "bench_b", "bench_c"]
    assert run_all.select(names, ["a", "bench_c.py"], None) == ["bench_a", "bench_c"]
    assert run_all.select(names, None, ["bench_b"]) == ["bench_a", "bench_c"]
    with pytest.raises(SystemExit, match=r"unknown bench bench_z; expected one of bench_a, bench_b, bench_c"):
        run_all.select(names, ["z"], None)


def test_list_names_every_bench_and_runs_none() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--list"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert set(listed) == {p.stem for p in BENCH.glob("bench_*.py")}
    assert "cuda" in listed["bench_megatron"] and "torch.distributed.run" in listed["bench_megatron"]
