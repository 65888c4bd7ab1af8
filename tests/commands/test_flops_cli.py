"""`stepscope flops`, end to end with click's CliRunner: what its headline is computed over, and CPU captures.

GIVEN a GPU trace THEN the headline shows the GPU time achieved TFLOP/s is computed over (the FLOP ops' time, beside
every modelled op's), and HFU equal to MFU where nothing is recomputed. GIVEN a trace without GPU kernels (a CPU
capture) THEN the ops and families carry their FLOPs (equal to torch's FlopCounterMode per family), with no GPU
time, and nothing is held to a GPU's peak: the note says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from builders import cpu_op, kernel, runtime, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli

H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 80 * 2**30, "computeMajor": 9,
         "computeMinor": 0, "numSms": 132}]
MM: dict[str, Any] = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16"] * 2,
                      "Concrete Inputs": ["", ""]}
ADD: dict[str, Any] = {"Input Dims": [[4096, 4096], [4096, 4096], []],
                       "Input type": ["c10::BFloat16"] * 2 + ["Scalar"], "Concrete Inputs": ["", "", "1"]}
MM_FLOPS = 2 * 4096**3


def _gpu_trace(tmp_path: Path) -> Path:
    """One 1 ms step: aten::mm (200 µs kernel) and aten::add (100 µs kernel) on an H100."""
    return write_trace(tmp_path, trace(
        step(1, ts=0, dur=1000),
        cpu_op("aten::mm", ts=10, dur=20, external_id=5, **MM),
        runtime("cudaLaunchKernel", ts=12, dur=3, correlation=1, external_id=5),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", ts=100, dur=200, correlation=1, external_id=5),
        cpu_op("aten::add", ts=40, dur=10, external_id=6, **ADD),
        runtime("cudaLaunchKernel", ts=42, dur=3, correlation=2, external_id=6),
        kernel("elementwise_kernel", ts=300, dur=100, correlation=2, external_id=6),
        deviceProperties=H100,
    ), "gpu.json")


def test_achieved_is_shown_with_the_time_it_is_computed_over_and_hfu_equals_mfu(tmp_path: Path) -> None:
    # GIVEN a step with a matmul (200 µs) and an add (100 µs, no FLOPs) on an H100, nothing recomputed
    path = _gpu_trace(tmp_path)
    # WHEN flops is asked
    data = json.loads(CliRunner().invoke(cli, ["flops", str(path), "--json"]).stdout)
    # THEN achieved TFLOP/s is the FLOPs over the FLOP ops' GPU time, which the headline shows beside the time of
    # every modelled op: dividing the lines shown gives the figure shown
    assert (data["modelled_gpu_ns"], data["flop_ops_gpu_ns"]) == (300_000, 200_000)
    assert data["achieved_tflops"] == pytest.approx(data["model_flops"] / data["flop_ops_gpu_ns"] / 1e3)
    # AND with nothing recomputed HFU is MFU, shown, not '-'
    assert data["recomputed_flops"] == 0
    assert data["hfu_fraction"] == data["mfu_fraction"] == pytest.approx(MM_FLOPS / (1e-3 * 989.5e12))
    table = CliRunner().invoke(cli, ["flops", str(path)]).stdout
    row = {line[:21].strip(): line[21:].strip() for line in table.split("\n\n")[0].splitlines()}
    assert (row["modelled gpu"], row["flop ops gpu"]) == ("300 µs", "200 µs")
    assert row["hfu"] == row["mfu"] == "13.9%"


def test_a_cpu_trace_shows_its_ops_and_families_and_holds_nothing_to_a_gpu_peak(tmp_path: Path) -> None:
    # GIVEN a trace with shapes and a step but no GPU kernel, from a machine whose GPU the trace lists
    path = write_trace(tmp_path, trace(step(1, ts=0, dur=1000), cpu_op("aten::mm", ts=10, dur=500, **MM),
                                       cpu_op("aten::add", ts=600, dur=100, **ADD), deviceProperties=H100), "cpu.json")
    runner = CliRunner()
    # WHEN flops is asked
    data = json.loads(runner.invoke(cli, ["flops", str(path), "--json"]).stdout)
    # THEN every modelled op and family shows its FLOPs and bytes, with no GPU time
    by_op = {r["name"]: r for r in data["ops"]}
    assert by_op["aten::mm"]["flops"] == MM_FLOPS and by_op["aten::add"]["bytes"] == 3 * 2 * 4096**2
    assert {r["family"]: r["flops"] for r in data["families"]} == {"matmul": MM_FLOPS, "elementwise": 0}
    assert all(r["gpu_ns"] is None and r["tflops"] is None and r["roofline_fraction"] is None for r in data["ops"])
    # AND nothing is held to the GPU's peak from CPU time: no achieved TFLOP/s, roofline or MFU, and the note says so
    assert data["achieved_tflops"] is None and data["mfu_fraction"] is None and data["hfu_fraction"] is None
    assert data["steps"][0]["mfu_fraction"] is None and data["ops_above_peak"] == 0
    assert "no GPU kernels" in data["note"] and "not CPU time" in data["note"]
    table = runner.invoke(cli, ["flops", str(path), "--by", "family"]).stdout
    assert "(none)" not in table and "matmul" in table


@pytest.mark.torch
def test_a_cpu_capture_s_families_equal_flop_counter_mode(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    # GIVEN a CPU capture (record_shapes) of an MLP's forward and backward
    torch.manual_seed(0)
    net: Any = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x = torch.randn(32, 64)

    def run() -> None:
        net(x).sum().backward()

    run()
    with FlopCounterMode(display=False) as counter:
        run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    prof.export_chrome_trace(str(tmp_path / "cpu.pt.trace.json"))
    # WHEN flops is asked for its families THEN the matmul family is FlopCounterMode's count, from the CLI
    out = CliRunner().invoke(cli, ["flops", str(tmp_path / "cpu.pt.trace.json"), "--json"])
    assert out.exit_code == 0, out.output
    families = {r["family"]: r["flops"] for r in json.loads(out.stdout)["families"]}
    assert families["matmul"] == counter.get_total_flops() > 0
