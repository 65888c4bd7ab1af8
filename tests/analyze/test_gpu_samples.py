"""The bundled GPU captures (sample_traces/*_cuda: an H200, torch 2.11, made by capture_samples.py through our
own shim) against oracles recorded at capture time: the shim's CUDA-event step timings, torch's FlopCounterMode,
the model's structure, and the OutOfMemoryError's own message."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stepscope.cli import cli

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
GPU_RUNS = sorted(p.parent.name for p in SAMPLES.glob("*_cuda/manifest.json"))


def _manifest(run: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SAMPLES / run / "manifest.json").read_text())
    return doc


def _json(*args: str) -> Any:
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_there_are_gpu_samples_of_every_kind() -> None:
    assert {"gemm_bound_cuda", "cuda_graph_replay_cuda", "oom_dump_cuda", "compiled_train_cuda",
            "item_in_forward_cuda", "pageable_vs_pinned_cuda", "dataloader_bound_cuda"} <= set(GPU_RUNS)
    for run in GPU_RUNS:
        assert _manifest(run)["device"]["type"] == "cuda"


@pytest.mark.parametrize("run", GPU_RUNS)
def test_step_times_agree_with_the_cuda_events_the_shim_recorded(run: str) -> None:
    # The shim records a CUDA event at every step boundary; its elapsed times are the steps as the GPU saw them.
    # The first recorded step's events also hold the profiler's own start (about 0.5 ms): the rest are compared.
    # Each boundary's event is recorded just before torch.profiler's step(), whose own work (up to ~0.15 ms
    # here) lies outside the ProfilerStep span: within 3% or 0.2 ms.
    timed = _manifest(run)["profiled"]["durations_ns"]
    walls = [s["wall_ns"] for s in _json("steps", str(SAMPLES / run))["steps"]]
    assert len(walls) == 3 and len(timed) >= 2
    for ours, events in list(zip(walls, timed, strict=False))[1:]:
        assert ours == pytest.approx(events, rel=0.03, abs=200_000), (run, walls, timed)


def test_a_gpu_bound_loop_whose_cpu_runs_ahead_is_timed_and_counted_per_step() -> None:
    # GIVEN bf16 GEMMs at ~78% of an H200's peak: the CPU launches a step in ~2 ms, the GPU runs it in ~17 ms
    m = _manifest("gemm_bound_cuda")
    (note,) = [n for n in m["notes"] if n.startswith("FlopCounterMode")]
    counted = int(re.search(r"FlopCounterMode: (\d+) FLOPs per step", note).group(1))  # type: ignore[union-attr]
    # THEN each step is its own GPU time, as the CUDA events timed it (the CPU spans are ~2 ms)
    walls = [s["wall_ns"] for s in _json("steps", str(SAMPLES / "gemm_bound_cuda"))["steps"]]
    assert walls == pytest.approx(m["profiled"]["durations_ns"], rel=0.01)
    # AND each step holds exactly the FLOPs torch's FlopCounterMode counted, at the MFU they imply
    flops = _json("flops", str(SAMPLES / "gemm_bound_cuda"))
    assert [s["flops"] for s in flops["steps"]] == [counted] * 3
    peak = flops["peak_tflops"] * 1e12
    for s in flops["steps"]:
        assert s["mfu_fraction"] == pytest.approx(counted / (s["wall_ns"] / 1e9) / peak)
        assert 0.6 < s["mfu_fraction"] < 0.9
    assert flops["mfu_fraction"] == pytest.approx(3 * counted / (sum(walls) / 1e9) / peak)
    summary = _json("summary", str(SAMPLES / "gemm_bound_cuda"))
    assert summary["verdict"] == "gpu_bound"
    # AND Nsight Compute is pointed at the GEMM kernel, where 22% of 51 ms is lost below the roofline, not at the
    # 2.6 µs fill furthest below its own
    assert summary["profile_next"].startswith("ncu --kernel-name regex:nvjet_sm90_")


def test_a_gpu_bound_loop_with_free_gemms_is_predicted_at_its_cpu_issue_time() -> None:
    # GIVEN the GEMM loop, whose CPU issues a step in ~2 ms while the GPU takes ~17 ms WHEN what-if makes its GEMMs
    # 1000x faster THEN each step is predicted at the time its CPU took to issue it (its ProfilerStep span, read from
    # the raw trace): the loop becomes CPU-bound (once 0.28 ms, under a fifth of the CPU's time)
    import gzip

    path = next((SAMPLES / "gemm_bound_cuda").glob("*.pt.trace.json.gz"))
    spans = {int(e["name"].split("#")[1]): e["dur"] * 1000 for e in json.loads(gzip.decompress(path.read_bytes()))[
        "traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    result = _json("whatif", str(SAMPLES / "gemm_bound_cuda"), "--speedup", "gemm=1000")
    assert len(result["steps"]) == 3 and result["bound_by_predicted"] == "cpu"
    for s in result["steps"]:
        assert s["predicted_ns"] == pytest.approx(spans[s["step"]], rel=0.02), (s, spans)


def test_a_cuda_graph_replay_maps_every_kernel_to_its_op_through_the_capture_profile() -> None:
    # GIVEN a capture run directory holding the replay's trace and graph_capture.pt.trace.json.gz, whose CUDA
    # launch calls name no kernel (a launch during capture runs nothing)
    run = SAMPLES / "cuda_graph_replay_cuda"
    # THEN the directory is one run (the capture profile is not a second rank) ...
    assert len(_json("steps", str(run))["steps"]) == 3
    # ... and every replayed kernel maps, in launch order, to the op that launched it: per replay the model's
    # 3 Linear (addmm), 2 GELU and 1 LayerNorm, over 3 replays
    g = _json("graphs", str(run))
    assert g["graph_launches"] == 3 and g["mapped_kernels"] == g["replayed_kernels"] == 39
    calls = {row["op_name"]: row["calls"] for row in g["ops"]}
    assert calls == {"aten::addmm": 9, "aten::gelu": 6, "aten::native_layer_norm": 3}


def test_the_oom_snapshot_says_what_torch_said() -> None:
    m = _manifest("oom_dump_cuda")
    assert m["status"] == "failed" and m["error"].startswith("OutOfMemoryError")
    tried = re.search(r"Tried to allocate ([\d.]+) MiB", m["error"])
    held = re.search(r"([\d.]+) MiB is allocated by PyTorch", m["error"])
    assert tried and held
    (snapshot,) = (SAMPLES / "oom_dump_cuda").glob("*.oom.memory_snapshot.pickle")
    (oom,) = _json("snapshot", str(snapshot))["ooms"]
    assert oom["requested_bytes"] == float(tried.group(1)) * 2**20
    # torch's message is the allocator's figure rounded to 0.01 MiB
    assert abs(oom["allocated_bytes"] - float(held.group(1)) * 2**20) <= 0.005 * 2**20 + 1


def test_the_report_of_a_run_that_ran_out_of_memory_says_so_first(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["report", str(SAMPLES / "oom_dump_cuda"), "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "r" / "index.html").read_text()
    problems = page[page.index('<section id="problems">'):]
    assert problems.index("the capture failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB") \
        < problems.index("</section>")
    assert "vm_895.oom.memory_snapshot.pickle, in its section below" in problems
    assert page.index('<section id="problems">') < page.index('<section id="verdict"')


def test_the_item_syncs_idle_the_gpu_but_the_cpu_sets_the_pace() -> None:
    # GIVEN the same 6-layer MLP on an H200, with an .item() after every layer and with torch.where instead
    bug = _json("summary", str(SAMPLES / "item_in_forward_cuda"))
    fix = _json("summary", str(SAMPLES / "item_in_forward_fixed_cuda"))
    # THEN the GPU idles behind the syncs (it runs dry, then waits for the next launch) ...
    assert bug["sync_calls"] == 6 * 3 and fix["sync_calls"] == 0  # one per layer, over the 3 recorded steps
    assert bug["sync_idle_fraction"] > 0.1 > fix["sync_idle_fraction"]
    # ... but the host is barely blocked in them: removing them saves at most that, so both are launch_bound
    assert bug["sync_fraction"] < 0.01 and bug["verdict"] == fix["verdict"] == "launch_bound"
    assert "not sync_bound" in bug["sync_note"] and fix["sync_note"] is None
    # AND the replay without the syncs (an independent computation) predicts no more than the blocked time, as the
    # fix's own unprofiled steps bear out (the manifests' baseline step times: no faster)
    predicted = _json("whatif", str(SAMPLES / "item_in_forward_cuda"), "--no-sync")["saving_fraction"]
    assert 0 <= predicted <= bug["sync_fraction"] + 1e-3
    unprofiled = [_manifest(run)["baseline"]["p50_ns"]
                  for run in ("item_in_forward_cuda", "item_in_forward_fixed_cuda")]
    assert unprofiled[1] >= unprofiled[0]  # 3.18 ms with the syncs, 3.22 ms without


def test_the_report_of_a_graph_replay_run_is_the_run_s_with_the_replays_mapped(tmp_path: Path) -> None:
    # GIVEN a capture run directory: the replay's trace, its memory snapshot, and the graph capture's profile
    res = CliRunner().invoke(cli, ["report", str(SAMPLES / "cuda_graph_replay_cuda"), "-o", str(tmp_path / "r")])
    assert res.exit_code == 0 and "(run, 1 report, 0 failed)" in res.output, res.output
    page = (tmp_path / "r" / "index.html").read_text()
    # THEN it is the run's report (its capture facts and snapshot) and the op table holds the replayed kernels'
    # ops, mapped through the capture profile (without it a replayed kernel has no op)
    assert '<section id="run"' in page and '<section id="snapshot"' in page
    ops = page[page.index('<section id="ops"'):]
    ops = ops[:ops.index("</section>")]
    assert "aten::addmm" in ops and "aten::native_layer_norm" in ops


def test_a_graph_capture_profile_is_no_fleet_row() -> None:
    # the samples directory holds 20 captured traces and one profile of a CUDA graph's capture, which profiles
    # the capture and not the workload
    rows = _json("fleet", str(SAMPLES))["fleet"]
    assert len(rows) == 20 and not [r for r in rows if "graph_capture" in r["trace"]]
    assert {r["run"] for r in rows} >= {"cuda_graph_replay_cuda", "gemm_bound_cuda"}
    # nor a page of `report --batch`; named by itself, it is what was asked for
    from stepscope.analyze.collection import page_names
    from stepscope.analyze.inputs import resolve, workload_traces

    batch = resolve(SAMPLES, batch=True)
    assert len(page_names(batch)) == 20  # type: ignore[arg-type]
    alone = resolve(SAMPLES / "cuda_graph_replay_cuda" / "graph_capture.pt.trace.json.gz")
    assert len(workload_traces(alone)) == 1
