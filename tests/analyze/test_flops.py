"""FLOPs and bytes per op (stepscope.analyze.flops).

GIVEN synthetic ops with recorded shapes, dtypes and Concrete Inputs, THEN each family's formula gives the
hand-computed FLOPs and bytes and nested ops count once. GIVEN real CPU captures (MLP, conv net, transformer
block; forward + backward + optimizer step) THEN our totals agree with torch's FlopCounterMode on the same
step within 1%, in total and per family. GIVEN the corpus THEN traces with shapes have FLOPs and traces
without say so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, runtime, step, trace

from stepscope.analyze import load
from stepscope.analyze.flops import ARGUMENTS, FLOP_FAMILIES, MODELS, FlopsResult, op_flops, resolve

F32 = "float"


def op(name: str, ts: float, dur: float, dims: list[Any], types: list[str], concrete: list[str] | None = None,
       **kw: Any) -> dict[str, Any]:
    """A cpu_op with record_shapes args."""
    args: dict[str, Any] = {"Input Dims": dims, "Input type": types}
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    return cpu_op(name, ts, dur, **kw, **args)


def flops_of(tmp_path: Path, *events: dict[str, Any]) -> FlopsResult:
    return op_flops(load_events(tmp_path, trace(*events)))


def one(r: FlopsResult, name: str) -> dict[str, Any]:
    rows = r.ops.filter(pl.col("name") == name).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


# ------------------------------------------------------------------------------------------ formulas
@pytest.mark.parametrize(("name", "dims", "types", "concrete", "flops", "nbytes"), [
    ("aten::mm", [[32, 64], [64, 128]], [F32, F32], None, 2 * 32 * 64 * 128, 4 * (2048 + 8192 + 4096)),
    ("aten::addmm", [[128], [32, 64], [64, 128], [], []], [F32, F32, F32, "Scalar", "Scalar"], None,
     2 * 32 * 64 * 128, 4 * (128 + 2048 + 8192 + 4096)),
    ("aten::bmm", [[4, 8, 16], [4, 16, 2]], ["c10::BFloat16"] * 2, None, 2 * 4 * 8 * 16 * 2,
     2 * (512 + 128 + 64)),
    ("aten::baddbmm", [[4, 8, 2], [4, 8, 16], [4, 16, 2]], [F32] * 3, None, 2 * 4 * 8 * 16 * 2,
     4 * (64 + 512 + 128 + 64)),
    # batch dims broadcast: [3, 1, 5, 6] @ [4, 6, 7] -> [3, 4, 5, 7]
    ("aten::matmul", [[3, 1, 5, 6], [4, 6, 7]], [F32, F32], None, 2 * 12 * 5 * 6 * 7, 4 * (90 + 168 + 420)),
    ("aten::matmul", [[6], [6, 7]], [F32, F32], None, 2 * 6 * 7, 4 * (6 + 42 + 7)),
    ("aten::linear", [[8, 2, 32], [96, 32], [96]], [F32] * 3, None, 2 * 16 * 32 * 96,
     4 * (512 + 3072 + 96 + 1536)),
    # fp8 inputs, bf16 output (out_dtype 15 = BFloat16), scales read too
    ("aten::_scaled_mm", [[16, 32], [32, 64], [], [], [], [], [], []],
     ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F32, F32, "", "", "Scalar", "Scalar"],
     ["", "", "", "", "", "", "15", "False"], 2 * 16 * 32 * 64, 512 + 2048 + 4 + 4 + 2 * 16 * 64),
])
def test_matmul_family_against_hand_calculation(tmp_path: Path, name: str, dims: list[Any], types: list[str],
                                                concrete: list[str] | None, flops: int, nbytes: int) -> None:
    row = one(flops_of(tmp_path, op(name, 0, 10, dims, types, concrete)), name)
    assert (row["family"], row["flops"], row["bytes"], row["counted"]) == ("matmul", flops, nbytes, True)


def test_dtype_is_the_dominant_floating_input_normalized() -> None:
    assert resolve("aten::mm", "[[2, 2], [2, 2]]", '["c10::Half", "c10::Half"]', None)[2] == "fp16"
    # the fp8 operands outweigh the fp32 scales
    assert resolve("aten::_scaled_mm", "[[16, 32], [32, 64], [], []]",
                   '["c10::Float8_e5m2", "c10::Float8_e5m2", "float", "float"]', None)[2] == "fp8"
    # embedding: the table's dtype, not the int64 indices'
    assert resolve("aten::embedding", "[[10, 4], [1, 2]]", '["c10::BFloat16", "long int"]', None)[2] == "bf16"


def test_einsum_counts_when_its_equation_is_recorded_else_its_inner_product_does(tmp_path: Path) -> None:
    resolved = resolve("aten::einsum", "[[], [[4, 5, 6], [4, 6, 7]], []]", '["", "TensorList", ""]',
                       '["bij,bjk->bik", "", ""]')
    assert resolved[:2] == (2 * 4 * 5 * 6 * 7, None)  # bytes unknown: a TensorList's dtypes are not recorded
    r = flops_of(tmp_path,
                 op("aten::einsum", 0, 10, [[], [[4, 5, 6], [4, 6, 7]], []], ["", "TensorList", ""], ["", "", ""]),
                 op("aten::bmm", 2, 5, [[4, 5, 6], [4, 6, 7]], [F32, F32]))
    einsum, bmm = one(r, "aten::einsum"), one(r, "aten::bmm")
    assert einsum["flops"] is None and not einsum["counted"] and "equation not recorded" in einsum["skip_reason"]
    assert bmm["counted"] and r.total_flops == 2 * 4 * 5 * 6 * 7


CONV_TYPES = [F32, F32, F32, "ScalarList", "ScalarList", "ScalarList", "Scalar"]


@pytest.mark.parametrize(("name", "x", "w", "concrete", "out", "flops"), [
    # (16 + 2 - 2 - 1) // 2 + 1 = 8: 2 * N * Cout * Cin * k*k * 8*8
    ("aten::conv2d", [4, 3, 16, 16], [8, 3, 3, 3], ["[2, 2]", "[1, 1]", "[1, 1]", "1"], [4, 8, 8, 8],
     2 * 4 * 8 * 3 * 9 * 64),
    # groups 2: w[1] = 8 / 2; dilation 2: (8 - 4 - 1) // 1 + 1 = 4
    ("aten::conv2d", [4, 8, 8, 8], [8, 4, 3, 3], ["[1, 1]", "[0, 0]", "[2, 2]", "2"], [4, 8, 4, 4],
     2 * 4 * 8 * 4 * 9 * 16),
    ("aten::conv1d", [2, 4, 10], [6, 4, 3], ["[1]", "[1]", "[1]", "1"], [2, 6, 10], 2 * 2 * 6 * 4 * 3 * 10),
    ("aten::conv3d", [1, 2, 4, 4, 4], [3, 2, 2, 2, 2], ["[2, 2, 2]", "[0, 0, 0]", "[1, 1, 1]", "1"],
     [1, 3, 2, 2, 2], 2 * 1 * 3 * 2 * 8 * 8),
])
def test_convolution_forward_against_hand_calculation(tmp_path: Path, name: str, x: list[int], w: list[int],
                                                      concrete: list[str], out: list[int], flops: int) -> None:
    r = flops_of(tmp_path, op(name, 0, 10, [x, w, [w[0]], [], [], [], []], CONV_TYPES, ["", "", "", *concrete]))
    row = one(r, name)
    numel = {"x": x, "w": w, "b": [w[0]], "out": out}
    expected_bytes = 4 * sum(prod(s) for s in numel.values())
    assert (row["family"], row["flops"], row["bytes"]) == ("convolution", flops, expected_bytes)


def test_transposed_convolution_counts_over_the_input_positions(tmp_path: Path) -> None:
    # conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation); w [Cin, Cout, k, k]
    dims = [[2, 4, 5, 5], [4, 3, 3, 3], [], [], [], [], [], []]
    types = [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList"]
    r = flops_of(tmp_path, op("aten::conv_transpose2d", 0, 10, dims, types,
                              ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "1", "[1, 1]"]))
    row = one(r, "aten::conv_transpose2d")
    out_side = (5 - 1) * 2 - 0 + 1 * (3 - 1) + 1 + 1  # 12
    assert row["flops"] == 2 * 2 * 4 * 3 * 9 * 25  # torch: prod(input spatial), not the output's
    assert row["bytes"] == 4 * (200 + 108 + 2 * 3 * out_side * out_side)


def test_convolution_needs_its_concrete_inputs_and_then_its_inner_op_counts(tmp_path: Path) -> None:
    x, w = [1, 2, 6, 6], [2, 2, 3, 3]
    types = [F32, F32, "", "ScalarList", "", "ScalarList", "Scalar"]  # padding="same": a string, not recorded
    outer = op("aten::conv2d", 0, 20, [x, w, [], [], [], [], []], types, ["", "", "", "[1, 1]", "", "[1, 1]", "1"])
    inner = op("aten::convolution", 2, 10, [x, w, [], [], [], [], [], [], []],
               [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"],
               ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"])
    r = flops_of(tmp_path, outer, inner)
    conv2d = one(r, "aten::conv2d")
    assert conv2d["flops"] is None and "argument 4" in conv2d["skip_reason"]  # padding="same": not recorded
    assert one(r, "aten::convolution")["counted"] and r.total_flops == 2 * 1 * 2 * 2 * 9 * 36


def test_convolution_backward_counts_the_gradients_its_mask_asks_for(tmp_path: Path) -> None:
    types = [F32, F32, F32, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar",
             "ScalarList"]
    dims: list[Any] = [[4, 8, 4, 4], [4, 8, 8, 8], [8, 4, 3, 3], *[[]] * 8]

    def concrete(mask: str) -> list[str]:
        return ["", "", "", "[8]", "[1, 1]", "[0, 0]", "[2, 2]", "False", "[0, 0]", "2", mask]

    r = flops_of(tmp_path, op("aten::convolution_backward", 0, 10, dims, types, concrete("[True, True, True]")),
                 op("aten::convolution_backward", 20, 10, dims, types, concrete("[False, True, False]")))
    grad_input = 2 * 4 * 8 * 4 * 9 * 16  # the forward count again
    grad_weight = 2 * 9 * 16 * 8 * 8 * 4  # full C_in (8), as torch counts grouped convolutions
    assert r.ops["flops"].to_list() == [grad_input + grad_weight, grad_weight]
    grad_out, x, w = 4 * 512, 4 * 2048, 4 * 288  # fp32 elements x 4 bytes
    assert r.ops["bytes"].to_list() == [grad_out + x + w + x + w + 4 * 8, grad_out + x + w + w]


def test_attention_forward_and_backward_follow_torch(tmp_path: Path) -> None:
    q = [2, 4, 8, 16]
    fwd = op("aten::_scaled_dot_product_flash_attention", 0, 10, [q, q, q, [], [], [], []],
             [F32, F32, F32, "Scalar", "Scalar", "Scalar", ""], ["", "", "", "0.", "True", "False", ""])
    bwd = op("aten::_scaled_dot_product_flash_attention_backward", 20, 10, [q, q, q, q, q, [2, 4, 8]],
             [F32] * 6)
    r = flops_of(tmp_path, fwd, bwd)
    b, s, d = 8, 8, 16
    assert r.ops["flops"].to_list() == [2 * b * s * s * (d + d), 2 * b * s * s * (3 * d + 2 * d)]  # causal: no halving
    n = 2 * 4 * 8 * 16  # elements of q, k, v, out and each gradient
    assert r.ops["bytes"].to_list() == [4 * n * 4, 4 * (n * 5 + 2 * 4 * 8) + 4 * n * 3]
    assert set(r.ops["family"]) == {"attention"}


@pytest.mark.parametrize(("name", "dims", "types", "concrete", "family", "nbytes"), [
    ("aten::native_layer_norm", [[2, 8, 32], [], [32], [32], []], [F32, "ScalarList", F32, F32, "Scalar"], None,
     "norm", 4 * (512 + 32 + 32) + 4 * 512),
    ("aten::_softmax", [[16, 10], [], []], [F32, "Scalar", "Scalar"], None, "softmax", 4 * 160 * 2),
    ("aten::add", [[16, 128], [128], []], [F32, F32, "Scalar"], None, "elementwise", 4 * (2048 + 128) + 4 * 2048),
    ("aten::copy_", [[16, 128], [16, 128], []], ["c10::Half", F32, "Scalar"], None, "elementwise",
     4 * 2048 + 2 * 2048),
    ("aten::sum", [[16, 10], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[0]", "True", ""], "reduction",
     4 * 160 + 4 * 10),
    ("aten::mean", [[16, 10], []], [F32, ""], None, "reduction", 4 * 160 + 4),
    # norm(self, p, dim, keepdim): the dim is argument 2 (p=2 read as a dim once kept 16 of [16, 10], not 10)
    ("aten::norm", [[16, 10], [], [], []], [F32, "Scalar", "ScalarList", "Scalar"], ["", "2", "[1]", "False"],
     "reduction", 4 * 160 + 4 * 16),
    ("aten::linalg_vector_norm", [[16, 10], [], [], [], []], [F32, "Scalar", "ScalarList", "Scalar", ""],
     ["", "2", "[1]", "False", ""], "reduction", 4 * 160 + 4 * 16),
    ("aten::embedding", [[1000, 64], [4, 8], [], [], []], [F32, "long int", "Scalar", "Scalar", "Scalar"], None,
     "embedding", 8 * 32 + 2 * 4 * 32 * 64),
])
def test_bytes_bound_families_count_bytes_and_no_flops(tmp_path: Path, name: str, dims: list[Any], types: list[str],
                                                       concrete: list[str] | None, family: str, nbytes: int) -> None:
    row = one(flops_of(tmp_path, op(name, 0, 10, dims, types, concrete)), name)
    assert (row["family"], row["flops"], row["bytes"]) == (family, 0, nbytes)


@pytest.mark.parametrize(("strides", "nbytes"), [
    # MeanBackward1's gradient [32, 2048, 1, 1] expanded to [32, 2048, 7, 7]: read once per distinct element
    ([[2048, 1, 0, 0], []], 4 * 32 * 2048 + 8 + 4 * 32 * 2048 * 49),
    # no strides recorded (older torch): every element of the shape, as before
    (None, 4 * 32 * 2048 * 49 + 8 + 4 * 32 * 2048 * 49),
    # a transposed view reads all of its elements: only stride 0 is a broadcast
    ([[100352, 49, 1, 7], []], 4 * 32 * 2048 * 49 + 8 + 4 * 32 * 2048 * 49),
])
def test_a_broadcast_input_is_read_once_per_distinct_element(tmp_path: Path, strides: list[Any] | None,
                                                             nbytes: int) -> None:
    # GIVEN an elementwise op on an expanded input, with or without the Input Strides the trace recorded
    strided = {"Input Strides": strides} if strides is not None else {}
    r = flops_of(tmp_path, op("aten::div", 0, 10, [[32, 2048, 7, 7], []], [F32, "long int"], ["", ""], **strided))
    # THEN the input's bytes count each stride-0 dimension once; the output is written at its full shape
    assert one(r, "aten::div")["bytes"] == nbytes
    assert r.strides_recorded is (strides is not None)


BF16 = "c10::BFloat16"


@pytest.mark.parametrize(("name", "dims", "types", "concrete", "nbytes"), [
    # Inductor's extern_kernels.mm(a, b, out=buf): a and b read, buf written once
    ("aten::mm", [[32, 64], [64, 128], [32, 128]], [BF16] * 3, ["", "", ""], 2 * (2048 + 8192) + 2 * 4096),
    ("aten::addmm", [[10], [16, 32], [32, 10], [], [], [16, 10]], [F32, F32, F32, "Scalar", "Scalar", F32],
     ["", "", "", "1", "1", ""], 4 * (10 + 512 + 320) + 4 * 160),
    ("aten::bmm", [[4, 8, 16], [4, 16, 2], [4, 8, 2]], [BF16] * 3, None, 2 * (512 + 128) + 2 * 64),
    ("aten::linear", [[8, 32], [96, 32], [96], [8, 96]], [F32] * 4, None, 4 * (256 + 3072 + 96) + 4 * 768),
    ("aten::mul", [[128, 64], [], [128, 64]], [F32, "Scalar", F32], None, 4 * 8192 + 4 * 8192),  # mul.out
    ("aten::div", [[64, 1], [64, 1], [64, 1]], [F32] * 3, None, 4 * 128 + 4 * 64),  # div.out, not div.Tensor_mode
    ("aten::clamp_min", [[32, 64], [], [32, 64]], [F32, "Int", F32], None, 4 * 2048 + 4 * 2048),
    ("aten::where", [[8, 1], [8, 32], [8, 32], [8, 32]], ["bool", F32, F32, F32], None, 8 + 4 * 256 * 3),
    ("aten::sum", [[16, 10], [], [], [], [10]], [F32, "ScalarList", "Scalar", "", F32], ["", "[0]", "False", "", ""],
     4 * 160 + 4 * 10),  # sum.IntList_out
    ("aten::neg", [[16, 10], [16, 10]], [F32, F32], None, 4 * 160 + 4 * 160),
])
def test_an_out_tensor_is_written_once_not_also_read(tmp_path: Path, name: str, dims: list[Any], types: list[str],
                                                    concrete: list[str] | None, nbytes: int) -> None:
    # GIVEN an op called with out= (the out tensor recorded after the op's arguments)
    row = one(flops_of(tmp_path, op(name, 0, 10, dims, types, concrete)), name)
    # THEN its bytes are the arguments read and the output written, the out tensor once
    assert row["bytes"] == nbytes


def test_every_op_with_an_out_overload_says_where_its_arguments_end() -> None:
    """Only attention and einsum (no out= overload a trace records; einsum's bytes are unknown) read every tensor."""
    unlisted = {n for n in MODELS if n not in ARGUMENTS}
    assert {MODELS[n][0] for n in unlisted} == {"attention", "matmul"} and [
        n for n in unlisted if MODELS[n][0] == "matmul"] == ["aten::einsum"]
    assert set(ARGUMENTS) <= set(MODELS)


def test_max_of_two_tensors_is_refused_not_guessed() -> None:
    # max.other(self, other) is elementwise; max.unary_out(self, *, out) a reduction: the trace does not tell which
    dims, types = json.dumps([[4, 8], [4, 8]]), json.dumps([F32, F32])
    flops, nbytes, _, reason = resolve("aten::max", dims, types, None)
    assert (flops, nbytes) == (None, None) and reason is not None and "out=" in reason
    assert resolve("aten::max", json.dumps([[4, 8]]), json.dumps([F32]), None)[:2] == (0, 4 * 32 + 4)


def test_inductor_extern_mm_bytes_on_the_compile_trace(corpus: Path, tmp_path: Path) -> None:
    # GIVEN TraceLens's torch.compile trace: 7 aten::mm calls from Inductor's extern_kernels.mm(a, b, out=buf)
    r = op_flops(load(corpus / "traces/tracelens/torch_compile_triton/trace.json.gz", cache_dir=tmp_path))
    mm = r.ops.filter(pl.col("name") == "aten::mm")
    shapes = [json.loads(d) for d in mm["input_dims"].to_list()]
    assert mm.height == 7 and all(len(s) == 3 for s in shapes)
    # THEN the bytes are (MK + KN + MN) x 2 per call (bf16), the out tensor once: 3,221,225,472 (not 4,966,055,936)
    expected = sum(2 * (prod(a) + prod(b) + a[0] * b[1]) for a, b, _ in shapes)
    assert int(mm["bytes"].sum()) == expected == 3_221_225_472


# --------------------------------------------------------------------------------------------- nesting
def test_nested_modelled_ops_count_once_outermost_first(tmp_path: Path) -> None:
    x, w = [8, 2, 32], [96, 32]
    r = flops_of(
        tmp_path,
        op("aten::linear", 0, 100, [x, w, [96]], [F32] * 3),
        cpu_op("aten::t", 1, 2),
        op("aten::matmul", 5, 80, [x, [32, 96]], [F32, F32]),
        op("aten::mm", 10, 50, [[16, 32], [32, 96]], [F32, F32]),
        op("aten::add_", 90, 5, [[8, 2, 96], [96], []], [F32, F32, "Scalar"]),
        op("aten::mm", 200, 10, [[16, 96], [96, 32]], [F32, F32]),  # a backward mm on its own
    )
    counted = r.ops.filter("counted")
    assert counted["name"].to_list() == ["aten::linear", "aten::mm"]
    linear_id = one(r, "aten::linear")["event_id"]
    assert r.ops.filter(pl.col("name") != "aten::mm")["counting_event_id"].to_list() == [linear_id] * 3
    assert r.total_flops == 2 * 16 * 32 * 96 * 2
    assert r.families.filter(pl.col("family") == "matmul").to_dicts()[0] == {
        "family": "matmul", "ops": 4, "counted_ops": 2, "flops": r.total_flops,
        "bytes": 4 * (512 + 3072 + 96 + 1536) + 4 * (1536 + 3072 + 512)}
    assert (r.ops_modelled, r.ops_skipped, r.ops_unmodelled) == (5, 0, 1)


def test_unmodelled_gpu_fraction_is_kernel_time_no_modelled_op_launched(tmp_path: Path) -> None:
    r = flops_of(
        tmp_path,
        step(1, 0, 1000),
        op("aten::linear", 10, 100, [[4, 8], [16, 8], [16]], [F32] * 3),
        cpu_op("aten::addmm", 20, 50, external_id=1),
        runtime("cudaLaunchKernel", 30, 5, correlation=11, external_id=1),
        cpu_op("aten::topk", 200, 50, external_id=2),
        runtime("cudaLaunchKernel", 210, 5, correlation=12, external_id=2),
        kernel("sgemm", 300, 30, correlation=11),  # addmm (no shapes) inside a modelled linear: modelled
        kernel("topk_kernel", 400, 10, correlation=12),  # no model
    )
    assert r.unmodelled_gpu_fraction == pytest.approx(10 / 40)
    # and what it is made of, by the outermost op around the launch (a custom op's GEMMs show under its name)
    assert r.unmodelled_ops.rows() == [("aten::topk", 10_000, pytest.approx(10 / 40))]


def test_unmodelled_time_is_named_by_the_outermost_op(tmp_path: Path) -> None:
    # GIVEN a custom op whose GEMM kernel no formula counts (vLLM's moe_forward: 80% of a run's kernel time), and a
    # kernel launched by no op
    r = flops_of(tmp_path, step(1, 0, 1000),
                 cpu_op("vllm::moe_forward", 10, 100),
                 cpu_op("aten::empty", 20, 5), cpu_op("vllm::fused_moe_kernel", 30, 50),
                 runtime("cudaLaunchKernel", 40, 5, correlation=11),
                 runtime("cudaLaunchKernel", 500, 5, correlation=12),
                 kernel("fused_moe_kernel", 100, 30, correlation=11), kernel("stray", 200, 10, correlation=12))
    # THEN its time is under vllm::moe_forward, the stray kernel's under (no op)
    assert r.unmodelled_ops.rows() == [("vllm::moe_forward", 30_000, pytest.approx(0.75)),
                                       ("(no op)", 10_000, pytest.approx(0.25))]


def test_a_trace_without_shapes_says_so_and_models_nothing(tmp_path: Path) -> None:
    r = flops_of(tmp_path, cpu_op("aten::mm", 0, 10), cpu_op("aten::relu", 20, 5))
    assert not r.shapes_recorded and r.total_flops == 0 and r.ops_modelled == 0 and r.families.height == 0
    assert set(r.ops["skip_reason"]) == {"no input shapes recorded (record_shapes=False)"}
    assert r.unmodelled_gpu_fraction is None  # no kernels: nothing to share out


def test_the_traces_own_flops_are_compared_per_family(tmp_path: Path) -> None:
    r = flops_of(tmp_path, op("aten::mm", 0, 10, [[2, 4], [4, 8]], [F32, F32], flops=100.0),
                 op("aten::mul", 20, 10, [[2, 4], [2, 4]], [F32, F32], flops=8.0))
    assert r.trace_flops_present
    assert r.vs_trace.to_dicts() == [
        {"family": "matmul", "ops": 1, "flops": 128, "trace_flops": 100.0, "relative_difference": 0.28},
        {"family": "elementwise", "ops": 1, "flops": 0, "trace_flops": 8.0, "relative_difference": -1.0},
    ]


# ------------------------------------------------------------------------------ parity with torch
torch_only = pytest.mark.torch

_TORCH_FAMILY = {
    "mm": "matmul", "addmm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "_scaled_mm": "matmul",
    "convolution": "convolution", "_convolution": "convolution", "convolution_backward": "convolution",
}


def _torch_flops_by_family(torch: Any, run_step: Callable[[], None]) -> dict[str, int]:
    """FlopCounterMode on one step, by family. On CPU, sdpa runs `_scaled_dot_product_flash_attention_for_cpu`,
    which torch's registry leaves out; we map it (and its backward) to torch's own sdpa formulas."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    sdpa_fwd: Any = fc.sdpa_flop_count  # torch's own formulas (untyped)
    sdpa_bwd: Any = fc.sdpa_backward_flop_count

    def fwd(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(sdpa_fwd(q, k, v))

    def bwd(g: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(sdpa_bwd(g, q, k, v))

    mapping = {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
               aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}
    with fc.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        run_step()
    out: dict[str, int] = {}
    for op_packet, n in counter.get_flop_counts()["Global"].items():
        name = str(op_packet).removeprefix("aten.")
        family = "attention" if "attention" in name else _TORCH_FAMILY[name]
        out[family] = out.get(family, 0) + int(n)
    return out


def _mlp(torch: Any) -> Callable[[], None]:
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                              torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def run() -> None:
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return run


def _convnet(torch: Any) -> Callable[[], None]:
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, groups=2, dilation=2), nn.ReLU(),
                        nn.ConvTranspose2d(8, 4, 3, stride=2, output_padding=1), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(4, 10))
    opt = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))

    def run() -> None:
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return run


def _transformer(torch: Any) -> Callable[[], None]:
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    head = torch.nn.Linear(64, 64)
    params = [*layer.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params)
    x = torch.randn(2, 16, 64)

    def run() -> None:
        h = layer(x)
        q = k = v = h.view(2, 16, 4, 16).transpose(1, 2)  # a hand-written causal attention on top
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        head(a.transpose(1, 2).reshape(2, 16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return run


@torch_only
@pytest.mark.parametrize("model", [_mlp, _convnet, _transformer], ids=["mlp", "convnet", "transformer"])
def test_parity_with_torch_flop_counter(tmp_path: Path, model: Callable[[Any], Callable[[], None]]) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    run_step = model(torch)
    run_step()  # warm up (optimizer state, lazy init) so both counts see the same step
    expected = _torch_flops_by_family(torch, run_step)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run_step()
    path = tmp_path / "capture.pt.trace.json"
    prof.export_chrome_trace(str(path))
    r = op_flops(load(path, cache_dir=tmp_path / "cache"))

    ours = dict(zip(r.families["family"].to_list(), r.families["flops"].to_list(), strict=True))
    assert r.shapes_recorded
    for family in FLOP_FAMILIES:
        assert ours.get(family, 0) == pytest.approx(expected.get(family, 0), rel=0.01), family
    assert r.total_flops == pytest.approx(sum(expected.values()), rel=0.01)
    assert expected.get("matmul", 0) > 0


@torch_only
def test_an_expanded_input_on_a_cpu_capture_counts_its_distinct_elements(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    # GIVEN a CPU capture (record_shapes) of a [32, 2048, 1, 1] tensor expanded to [32, 2048, 7, 7] and divided
    g = torch.randn(32, 2048, 1, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        g.expand(32, 2048, 7, 7) / 49
    path = tmp_path / "capture.pt.trace.json"
    prof.export_chrome_trace(str(path))
    # WHEN its bytes are counted THEN the input is read at 32*2048 elements, not 32*2048*49
    r = op_flops(load(path, cache_dir=tmp_path / "cache"))
    assert r.strides_recorded
    assert one(r, "aten::div")["bytes"] == 4 * 32 * 2048 + 8 + 4 * 32 * 2048 * 49


# ------------------------------------------------------------------------------------------- corpus
@pytest.mark.corpus
def test_corpus_traces_with_shapes_have_flops_and_without_say_so(corpus: Path) -> None:
    resnet = next((corpus / "traces/kineto/resnet50_num_workers_0").glob("*.json*"))
    r = op_flops(load(resnet))
    assert r.shapes_recorded and r.total_flops > 0
    assert {"matmul", "norm", "elementwise"} <= set(r.families["family"])
    # a 2021 trace records no Concrete Inputs: its convolutions are skipped with a reason, not guessed
    conv = r.ops.filter(pl.col("family") == "convolution")
    assert conv.height > 0 and conv["flops"].null_count() == conv.height
    assert r.unmodelled_gpu_fraction is not None and 0 < r.unmodelled_gpu_fraction < 1

    qwen = op_flops(load(corpus / "traces/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))
    assert {"matmul", "attention"} <= set(qwen.families["family"]) and qwen.total_flops > 0

    no_shapes = op_flops(load(next((corpus / "traces/hta/critical_path/alexnet").glob("*.json*"))))
    assert not no_shapes.shapes_recorded and no_shapes.total_flops == 0 and no_shapes.families.height == 0


def test_json_args_round_trip_into_resolve() -> None:
    dims, types = json.dumps([[3, 4], [4, 5]]), json.dumps([F32, F32])
    assert resolve("aten::mm", dims, types, None) == (120, 4 * (12 + 20 + 15), "fp32", None)
    assert resolve("aten::nonexistent", dims, types, None)[3] == "no FLOP model for this op"


def test_addmm_flops_match_tracelens_published_gemm_table(corpus: Path, tmp_path: Path) -> None:
    # GIVEN the vLLM graph-capture trace whose GEMMs TraceLens tabulated (its GEMM.csv: aten::addmm, 72 calls,
    # 10,474.588 GFLOP, counting 2*M*N*K plus M*N for the bias)
    capture = next((corpus / "traces/tracelens/inference/vllm_prefilldecode_piecewise/capture_traces").iterdir())
    rows = op_flops(load(capture, cache_dir=tmp_path)).ops.filter(pl.col("name") == "aten::addmm")
    # WHEN our 2*M*N*K (torch's rule: no bias term) gets TraceLens's bias term added back
    bias = sum(json.loads(d)[1][0] * json.loads(d)[2][1] for d in rows["input_dims"].to_list())
    # THEN the totals agree to the published precision
    assert rows.height == 72
    assert (int(rows["flops"].sum()) + bias) / 1e9 == pytest.approx(10_474.588, abs=0.001)
