"""FLOPs and bytes per CPU op, from the recorded shapes (`Input Dims`), dtypes (`Input type`) and argument
values (`Concrete Inputs`), with torch's own conventions (`torch/utils/flop_counter.py`, `FlopCounterMode`).

One formula per op family. A multiply-add is 2 FLOPs; bias adds, scaling and softmax inside attention count
nothing; causal attention is not halved. These are torch's choices, matched so that our totals agree with
`FlopCounterMode` on the same step. Worked examples, one per family:

    family       op and recorded inputs                                   FLOPs
    -----------  -------------------------------------------------------  ------------------------------------
    matmul       aten::mm [32, 64] x [64, 128]                            2*32*64*128 = 524,288
                 (addmm, bmm, baddbmm, matmul with broadcast batch, linear, _scaled_mm, _int_mm, mv, dot; a
                 two-operand einsum when its equation is recorded: 2 x the product of every index size)
                 aten::linear x [8, 2, 32], w [96, 32], b [96]            2*(8*2)*32*96 = 98,304 (bias: 0)
                 (vLLM's vllm::rocm_unquantized_gemm(x, w, bias) is a linear too)
    convolution  aten::conv2d x [4, 3, 16, 16], w [8, 3, 3, 3],           out 8x8: 2*4*8*3*(3*3)*(8*8)
                 stride [2, 2], padding [1, 1], dilation [1, 1]            = 110,592
                 = 2 * N * w[0] * w[1] * prod(kernel) * prod(out spatial); the output's spatial size comes from
                 stride/padding/dilation in Concrete Inputs, (in + 2p - d(k-1) - 1) // s + 1. Groups are in
                 w[1] (= C_in / groups) already. Transposed: prod(*input* spatial) instead of the output's.
                 aten::convolution_backward (torch's conv_backward_flop): grad_input (output_mask[0]) =
                 the forward count again; grad_weight (output_mask[1]) = 2 * prod(kernel) * prod(grad_out
                 spatial) * C_in(full) * C_out * N, e.g. grad_out [4, 8, 4, 4], x [4, 8, 8, 8],
                 w [8, 4, 3, 3], groups 2, mask [True, True] -> 2*4*8*4*9*16 + 2*9*16*8*8*4 = 36,864 + 73,728
                 (torch counts grad_weight with the full C_in for grouped convolutions; so do we)
    attention    aten::_scaled_dot_product_flash_attention                2*B*s_q*s_k*(d_q + d_v), B = b*h_q:
                 q [2, 4, 8, 16], k [2, 4, 8, 16], v [2, 4, 8, 16]         2*8*8*8*(16+16) = 32,768
                 backward (grad_out, q, k, v, …)                           2*B*s_q*s_k*(3*d_q + 2*d_v) = 81,920
                 (math, flash, efficient, cudnn and the CPU flash kernel; causal not halved, as torch)
    norm         aten::native_layer_norm x [2, 8, 32] fp32                0 FLOPs; bytes 4*(512+32+32) + 4*512
    softmax      aten::_softmax x [16, 10] fp32                           0 FLOPs; bytes 4*160 + 4*160
    elementwise  aten::add x [16, 128], y [128] fp32                      0 FLOPs; bytes 4*(2048+128) + 4*2048
                 (the output is as large as the largest input: the broadcast shape, or `self` in place)
    reduction    aten::sum x [16, 10], dim [0] fp32                       0 FLOPs; bytes 4*160 + 4*10
    embedding    aten::embedding w [1000, 64], idx [4, 8] int64           0 FLOPs; bytes 8*32 + 2*4*(32*64)

The last five families are bytes-bound: torch's counter counts no FLOPs for them and neither do we (their
rows carry 0 FLOPs and a byte count, for the roofline). Bytes are every tensor argument read once plus the
output written once, from shapes x dtype size: `mm [32, 64] x [64, 128] fp32` moves 4*(2048 + 8192 + 4096)
bytes. An input is read at its distinct elements: where the trace records `Input Strides`, a dimension of
stride 0 (a broadcast: `expand`) counts once; where it does not, every input counts at its full shape, so a
broadcast input is overcounted:

    aten::div x [32, 2048, 7, 7] strides [2048, 1, 0, 0], 49 fp32    bytes 4*(32*2048) + 4*(32*2048*7*7)
                                            (no strides recorded:    bytes 4*(32*2048*7*7) + 4*(32*2048*7*7))
 Embedding reads only the gathered rows, not the whole table; copy_/fill_/zero_ do not read `self`.
An out= tensor is the output: recorded after the op's arguments (`ARGUMENTS`), it is written once, not read:

    aten::mm [32768, 2048], [2048, 2048], [32768, 2048] bf16   (Inductor's extern_kernels.mm(a, b, out=buf))
    bytes 2*(32768*2048 + 2048*2048) read + 2*32768*2048 written = 276,824,064 (not 411,041,792)

Nested ops count once: the OUTERMOST op with a resolved formula counts (`counted`), the modelled ops inside
it do not.

    aten::linear              counted     2*16*64*128
      aten::t                 (no model)
      aten::addmm             not counted (inside aten::linear)
    aten::einsum              equation not recorded: skipped, so the bmm inside it counts
      aten::bmm               counted

Not modelled: `_foreach_*` ops (a TensorList's dtypes are not recorded), nested/variable-length attention,
einsum without a recorded equation (its inner bmm/mm count instead), a convolution whose padding was given
as a string (its inner aten::convolution counts instead), and every op outside the tables below.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Literal

import numpy as np
import polars as pl

from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.nesting import parent_index, sort_for_nesting
from stepscope.analyze.schema import Kind

Family = Literal["matmul", "convolution", "attention", "norm", "softmax", "elementwise", "reduction", "embedding"]
FAMILIES: tuple[Family, ...] = Family.__args__  # type: ignore[attr-defined]
#: families torch's FlopCounterMode counts FLOPs for: the parity totals
FLOP_FAMILIES: tuple[Family, ...] = ("matmul", "convolution", "attention")

#: `Input type` -> (bytes per element, normalized dtype name)
DTYPES: dict[str, tuple[int, str]] = {
    "float": (4, "fp32"), "double": (8, "fp64"), "c10::Half": (2, "fp16"), "c10::BFloat16": (2, "bf16"),
    "c10::Float8_e4m3fn": (1, "fp8"), "c10::Float8_e5m2": (1, "fp8"), "c10::Float8_e4m3fnuz": (1, "fp8"),
    "c10::Float8_e5m2fnuz": (1, "fp8"), "c10::Float8_e8m0fnu": (1, "fp8"), "c10::Float4_e2m1fn_x2": (1, "fp4"),
    "signed char": (1, "int8"), "unsigned char": (1, "uint8"), "short int": (2, "int16"), "int": (4, "int32"),
    "long int": (8, "int64"), "long": (8, "int64"), "unsigned short": (2, "uint16"), "unsigned int": (4, "uint32"),
    "unsigned long": (8, "uint64"), "bool": (1, "bool"), "c10::complex<float>": (8, "complex64"),
    "c10::complex<double>": (16, "complex128"), "c10::complex<c10::Half>": (4, "complex32"),
    "c10::qint8": (1, "int8"), "c10::quint8": (1, "uint8"), "c10::qint32": (4, "int32"),
}
_FLOATING = frozenset({"fp64", "fp32", "fp16", "bf16", "fp8", "fp4", "complex64", "complex128", "complex32"})
#: c10::ScalarType codes as Concrete Inputs write a dtype argument (e.g. _scaled_mm's out_dtype)
_SCALAR_TYPE_CODES: dict[int, str] = {
    0: "unsigned char", 1: "signed char", 2: "short int", 3: "int", 4: "long int", 5: "c10::Half", 6: "float",
    7: "double", 11: "bool", 15: "c10::BFloat16", 23: "c10::Float8_e5m2", 24: "c10::Float8_e4m3fn",
}


class _Skip(Exception):
    """This op's recorded inputs do not resolve its formula; the message says why."""


@dataclass(frozen=True)
class _Inputs:
    """One op's recorded inputs: shapes, dtypes and concrete values, by position."""

    dims: list[object]
    types: list[object]
    concrete: list[object]
    arguments: int | None = None  # positions before this are the op's arguments; a tensor past them is an out=
    strides: Sequence[object] = ()  # per input, where recorded: a stride-0 dimension is broadcast

    def tensor(self, i: int) -> list[int]:
        """Shape of tensor input i; _Skip when it is absent or not a tensor."""
        if i >= len(self.dims) or i >= len(self.types) or self.types[i] not in DTYPES:
            raise _Skip(f"input {i} is not a recorded tensor")
        shape = self.dims[i]
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise _Skip(f"input {i} has no shape")
        return [int(d) for d in shape]

    def has_tensor(self, i: int) -> bool:
        """Whether input i is a recorded tensor."""
        try:
            self.tensor(i)
        except _Skip:
            return False
        return True

    def value(self, i: int) -> object:
        """Concrete value of input i (int, float, bool, str, list); None where not recorded."""
        if i >= len(self.concrete) or not isinstance(self.concrete[i], str):
            return None
        return _literal(str(self.concrete[i]))

    def ints(self, i: int, n: int, default: int | None = None) -> list[int]:
        """Input i as n ints (a one-element list or a scalar is repeated); `default` when not recorded."""
        v = self.value(i)
        if v is None and default is not None:
            return [default] * n
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise _Skip(f"argument {i} was not recorded as a list of ints (Concrete Inputs)")
        if len(v) == 1:
            v = v * n
        if len(v) != n:
            raise _Skip(f"argument {i} has {len(v)} values for {n} spatial dims")
        return [int(x) for x in v]

    def read(self, i: int) -> bool:
        """Whether input i is an argument the op reads, not an out= tensor after its arguments."""
        return self.arguments is None or i < self.arguments

    def tensor_bytes(self, *, skip: Sequence[int] = ()) -> int:
        """Bytes of every tensor argument (each distinct element read once, `distinct_elements`), leaving out the
        positions in `skip` and any out= tensor (the output: the formula counts it, written)."""
        total = 0
        for i, t in enumerate(self.types):
            if i in skip or t not in DTYPES or not self.read(i):
                continue
            shape = self.dims[i] if i < len(self.dims) else None
            if isinstance(shape, list) and all(isinstance(d, int) for d in shape):
                total += self.distinct_elements(i, shape) * DTYPES[str(t)][0]
        return total

    def distinct_elements(self, i: int, shape: list[int]) -> int:
        """The elements input i's memory holds: a dim of stride 0 (a broadcast) counts once where its strides are
        recorded; all of them otherwise.

            shape [32, 2048, 7, 7], strides [2048, 1, 0, 0] -> 32*2048        (no strides: 32*2048*7*7)
        """
        strides = self.strides[i] if i < len(self.strides) else None
        if (not isinstance(strides, list) or len(strides) != len(shape) or 0 in shape
                or not all(isinstance(s, int) for s in strides)):
            return prod(shape)
        return prod(d for d, s in zip(shape, strides, strict=True) if s != 0)

    def dtype(self) -> str | None:
        """The dominant input dtype: of the floating tensors, the one with the most elements (else any tensor)."""
        elems: dict[str, int] = {}
        for i, t in enumerate(self.types):
            shape = self.dims[i] if i < len(self.dims) else None
            if t in DTYPES and isinstance(shape, list):
                name = DTYPES[str(t)][1]
                elems[name] = elems.get(name, 0) + prod(d for d in shape if isinstance(d, int))
        if not elems:
            return None
        floating = {k: v for k, v in elems.items() if k in _FLOATING}
        pool = floating or elems
        return max(pool, key=lambda k: (pool[k], k))

    def size(self, i: int) -> int:
        """Bytes per element of tensor input i."""
        return DTYPES[str(self.types[i])][0]


def _literal(text: str) -> object:
    """A Concrete Inputs value: '[2, 2]' -> [2, 2], 'False' -> False, '1' -> 1, '0.1' -> 0.1, '' -> None."""
    s = text.strip()
    if not s:
        return None
    if s in ("True", "False"):
        return s == "True"
    if s.startswith("[") and s.endswith("]"):
        inner = s[1:-1].strip()
        return [] if not inner else [_literal(part) for part in inner.split(",")]
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


# A formula: the op's inputs -> (FLOPs, bytes; None where dtypes are unknown). Raises _Skip when unresolved.
Formula = Callable[[_Inputs], tuple[int, int | None]]


def _out(inp: _Inputs, shape: Sequence[int], like: int = 0) -> int:
    """Bytes of an output of `shape` with the dtype of input `like`."""
    return prod(shape) * inp.size(like)


# ----------------------------------------------------------------------------------------------- matmul
def _mm_dims(a: list[int], b: list[int]) -> tuple[int, int, int]:
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise _Skip(f"shapes {a} x {b} do not multiply")
    return a[0], a[1], b[1]


def _mm_at(ia: int, ib: int) -> Formula:
    """mm-like op with its two matrices at positions ia, ib (addmm's bias adds nothing, as in torch)."""
    def formula(inp: _Inputs) -> tuple[int, int]:
        m, k, n = _mm_dims(inp.tensor(ia), inp.tensor(ib))
        return 2 * m * k * n, inp.tensor_bytes() + _out(inp, [m, n], ia)
    return formula


def _bmm_at(ia: int, ib: int, *, reduce_batch: bool = False) -> Formula:
    """bmm-like op (baddbmm: bias ignored; addbmm: the batch is summed into one [m, n] output)."""
    def formula(inp: _Inputs) -> tuple[int, int]:
        a, b = inp.tensor(ia), inp.tensor(ib)
        if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
            raise _Skip(f"shapes {a} x {b} are no batched product")
        out = [a[1], b[2]] if reduce_batch else [a[0], a[1], b[2]]
        return 2 * a[0] * a[1] * a[2] * b[2], inp.tensor_bytes() + _out(inp, out, ia)
    return formula


def _broadcast(a: Sequence[int], b: Sequence[int]) -> list[int]:
    out: list[int] = []
    pa, pb = [1] * (len(b) - len(a)) + list(a), [1] * (len(a) - len(b)) + list(b)
    for x, y in zip(reversed(pa), reversed(pb), strict=True):
        if x != y and 1 not in (x, y):
            raise _Skip(f"shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return out[::-1]


def _matmul(inp: _Inputs) -> tuple[int, int]:
    """torch.matmul: 1-D operands are promoted (and squeezed back), batch dims broadcast."""
    a, b = inp.tensor(0), inp.tensor(1)
    if not a or not b:
        raise _Skip("matmul of a 0-d tensor")
    a2 = [1, *a] if len(a) == 1 else a
    b2 = [*b, 1] if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise _Skip(f"shapes {a} x {b} do not multiply")
    batch = _broadcast(a2[:-2], b2[:-2])
    m, k, n = a2[-2], a2[-1], b2[-1]
    out = [*batch, *([m] if len(a) > 1 else []), *([n] if len(b) > 1 else [])]
    return 2 * prod(batch) * m * k * n, inp.tensor_bytes() + _out(inp, out)


def _linear(inp: _Inputs) -> tuple[int, int]:
    """x [..., k] @ w[n, k].T (+ bias, which counts nothing)."""
    x, w = inp.tensor(0), inp.tensor(1)
    if not x or len(w) != 2 or x[-1] != w[1]:
        raise _Skip(f"shapes {x} and weight {w} do not fit linear")
    rows = prod(x[:-1])
    return 2 * rows * w[1] * w[0], inp.tensor_bytes() + _out(inp, [*x[:-1], w[0]])


def _mv(inp: _Inputs, im: int, iv: int) -> tuple[int, int]:
    m, v = inp.tensor(im), inp.tensor(iv)
    if len(m) != 2 or len(v) != 1 or m[1] != v[0]:
        raise _Skip(f"shapes {m} x {v} are no matrix-vector product")
    return 2 * m[0] * m[1], inp.tensor_bytes() + _out(inp, [m[0]], im)


def _dot(inp: _Inputs) -> tuple[int, int]:
    a, b = inp.tensor(0), inp.tensor(1)
    if len(a) != 1 or a != b:
        raise _Skip(f"shapes {a} . {b} are no dot product")
    return 2 * a[0], inp.tensor_bytes() + _out(inp, [])


def _scaled_mm(inp: _Inputs) -> tuple[int, int]:
    """_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, …): mm FLOPs, output in out_dtype."""
    m, k, n = _mm_dims(inp.tensor(0), inp.tensor(1))
    code = inp.value(6)
    out_type = _SCALAR_TYPE_CODES.get(code, str(inp.types[0])) if isinstance(code, int) else str(inp.types[0])
    return 2 * m * k * n, inp.tensor_bytes() + m * n * DTYPES.get(out_type, (inp.size(0), ""))[0]


def _int_mm(inp: _Inputs) -> tuple[int, int]:
    m, k, n = _mm_dims(inp.tensor(0), inp.tensor(1))
    return 2 * m * k * n, inp.tensor_bytes() + 4 * m * n


_EINSUM_TERM = re.compile(r"^[A-Za-z]*$")


def _einsum(inp: _Inputs) -> tuple[int, int | None]:
    """Two operands and a recorded equation: 2 x the product of every distinct index size."""
    equation = inp.value(0)
    if not isinstance(equation, str):
        raise _Skip("einsum equation not recorded (Concrete Inputs)")
    shapes = inp.dims[1] if len(inp.dims) > 1 else None
    if not isinstance(shapes, list) or len(shapes) != 2 or not all(isinstance(s, list) for s in shapes):
        raise _Skip("einsum with other than two operands")
    lhs, _, rhs = equation.strip("'\"").replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not all(_EINSUM_TERM.match(t) for t in (*terms, rhs)):
        raise _Skip(f"einsum equation {equation!r} not resolvable (ellipsis or other than two operands)")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(term) != len(shape):
            raise _Skip(f"einsum term {term!r} does not fit shape {shape}")
        for letter, d in zip(term, shape, strict=True):
            sizes[letter] = max(sizes.get(letter, 1), int(d))
    if "->" in equation and not set(rhs) <= set(sizes):
        raise _Skip(f"einsum output {rhs!r} names an index no operand has")
    # bytes unknown: a TensorList's dtypes are not recorded
    return 2 * prod(sizes.values()), None


# ------------------------------------------------------------------------------------------ convolution
def _conv_count(x: Sequence[int], w: Sequence[int], out: Sequence[int], transposed: bool) -> int:
    """torch's conv_flop_count, literally: prod(spatial) * prod(kernel) * N * w[0] * w[1] * 2."""
    spatial = (x if transposed else out)[2:]
    return prod(spatial) * prod(w[2:]) * x[0] * w[0] * w[1] * 2


@dataclass(frozen=True)
class _ConvArgs:
    """Where a convolution op keeps its arguments (positions in its schema; None: not an argument)."""

    stride: int | None
    padding: int | None
    dilation: int | None
    transposed: int | bool
    output_padding: int | None
    groups: int | None


def _conv(layout: _ConvArgs) -> Formula:
    def formula(inp: _Inputs) -> tuple[int, int]:
        x, w = inp.tensor(0), inp.tensor(1)
        n_sp = len(w) - 2
        if n_sp < 1 or len(x) not in (n_sp + 1, n_sp + 2):
            raise _Skip(f"input {x} and weight {w} do not fit a convolution")
        if len(x) == n_sp + 1:  # unbatched input (conv2d on [C, H, W])
            x = [1, *x]
        t = layout.transposed
        transposed = t if isinstance(t, bool) else inp.value(t)
        if not isinstance(transposed, bool):
            raise _Skip("`transposed` not recorded (Concrete Inputs)")

        def arg(i: int | None, default: int) -> list[int]:
            return [default] * n_sp if i is None else inp.ints(i, n_sp)

        stride, padding, dilation = arg(layout.stride, 1), arg(layout.padding, 0), arg(layout.dilation, 1)
        kernel, sp = w[2:], x[2:]
        if transposed:
            out_pad = arg(layout.output_padding, 0)
            groups = inp.ints(layout.groups, 1, default=1)[0] if layout.groups is not None else 1
            out_sp = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
                      for i, s, p, d, k, op in zip(sp, stride, padding, dilation, kernel, out_pad, strict=True)]
            out = [x[0], w[1] * groups, *out_sp]
        else:
            out_sp = [(i + 2 * p - d * (k - 1) - 1) // s + 1
                      for i, s, p, d, k in zip(sp, stride, padding, dilation, kernel, strict=True)]
            out = [x[0], w[0], *out_sp]
        if min(out_sp) < 0:
            raise _Skip(f"arguments give a negative output size {out_sp}")
        return _conv_count(x, w, out, transposed), inp.tensor_bytes() + _out(inp, out)
    return formula


_CONV_LAYOUTS: dict[str, _ConvArgs] = {
    **{f"aten::conv{n}d": _ConvArgs(3, 4, 5, False, None, 6) for n in (1, 2, 3)},
    **{f"aten::conv_transpose{n}d": _ConvArgs(3, 4, 7, True, 5, 6) for n in (1, 2, 3)},
    "aten::convolution": _ConvArgs(3, 4, 5, 6, 7, 8),
    "aten::_convolution": _ConvArgs(3, 4, 5, 6, 7, 8),
    "aten::convolution_overrideable": _ConvArgs(3, 4, 5, 6, 7, 8),
    "aten::_convolution_mode": _ConvArgs(3, 4, 5, False, None, 6),
    "aten::cudnn_convolution": _ConvArgs(3, 2, 4, False, None, 5),
    "aten::cudnn_convolution_transpose": _ConvArgs(4, 2, 5, True, 3, 6),
    "aten::mkldnn_convolution": _ConvArgs(4, 3, 5, False, None, 6),
    "aten::miopen_convolution": _ConvArgs(4, 3, 5, False, None, 6),
    "aten::_slow_conv2d_forward": _ConvArgs(4, 5, None, False, None, None),
    "aten::thnn_conv2d": _ConvArgs(4, 5, None, False, None, None),
}


def _conv_backward(inp: _Inputs) -> tuple[int, int]:
    """convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask): torch's conv_backward_flop (grad_input + grad_weight)."""
    gout, x, w = inp.tensor(0), inp.tensor(1), inp.tensor(2)
    if len(gout) != len(x) or len(w) != len(x) or len(x) < 3:
        raise _Skip(f"grad_out {gout}, input {x}, weight {w} do not fit convolution_backward")
    transposed = inp.value(7)
    if not isinstance(transposed, bool):
        raise _Skip("`transposed` not recorded (Concrete Inputs)")
    mask = inp.value(10)
    if not (isinstance(mask, list) and len(mask) >= 2 and all(isinstance(m, bool) for m in mask)):
        mask = [True, True, True]  # not recorded: both gradients, as for any layer past the first

    def t(shape: Sequence[int]) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    flops = out_bytes = 0
    if mask[0]:
        flops += _conv_count(gout, w, x, not transposed)
        out_bytes += _out(inp, x, 1)
    if mask[1]:
        flops += _conv_count(t(gout), t(x), t(w), False) if transposed else _conv_count(t(x), t(gout), t(w), False)
        out_bytes += _out(inp, w, 2)
    if len(mask) > 2 and mask[2]:
        out_bytes += gout[1] * inp.size(0)
    return flops, inp.tensor_bytes() + out_bytes


# ------------------------------------------------------------------------------------------- attention
def _qkv(inp: _Inputs, first: int, layout: Literal["bhsd", "bshd"]) -> tuple[int, int, int, int, int]:
    """(batch x query heads, s_q, s_k, d_q, d_v) of q, k, v at positions first .. first+2."""
    q, k, v = inp.tensor(first), inp.tensor(first + 1), inp.tensor(first + 2)
    if layout == "bshd":
        if len(q) != 4 or len(k) != 4 or len(v) != 4:
            raise _Skip("variable-length (nested) attention is not modelled")
        return q[0] * q[2], q[1], k[1], q[3], v[3]
    if len(q) < 2 or len(k) < 2 or len(v) < 2 or k[-2] != v[-2] or q[-1] != k[-1]:
        raise _Skip(f"q {q}, k {k}, v {v} do not fit attention")
    return prod(q[:-2]), q[-2], k[-2], q[-1], v[-1]


def _attention(layout: Literal["bhsd", "bshd"]) -> Formula:
    """torch's sdpa_flop_count: QK^T and PV as two batched products (no causal halving)."""
    def formula(inp: _Inputs) -> tuple[int, int]:
        bh, sq, sk, dq, dv = _qkv(inp, 0, layout)
        flops = 2 * bh * sq * dq * sk + 2 * bh * sq * sk * dv
        return flops, inp.tensor_bytes() + bh * sq * dv * inp.size(0)
    return formula


def _attention_backward(layout: Literal["bhsd", "bshd"]) -> Formula:
    """torch's sdpa_backward_flop_count: recompute QK^T, then dP, dV, dQ, dK (five batched products)."""
    def formula(inp: _Inputs) -> tuple[int, int]:
        bh, sq, sk, dq, dv = _qkv(inp, 1, layout)
        flops = 2 * bh * sq * sk * (3 * dq + 2 * dv)
        grads = prod(inp.tensor(1)) + prod(inp.tensor(2)) + prod(inp.tensor(3))
        return flops, inp.tensor_bytes() + grads * inp.size(1)
    return formula


# ---------------------------------------------------------------------------------------- bytes-bound
def _like_first(inp: _Inputs) -> tuple[int, int]:
    """Norms, softmax: 0 FLOPs; the output has the first input's shape."""
    return 0, inp.tensor_bytes() + _out(inp, inp.tensor(0))


def _elementwise(inp: _Inputs) -> tuple[int, int]:
    """0 FLOPs; the output is as large as the largest tensor input (the broadcast shape, or `self`)."""
    if any(t == "TensorList" for t in inp.types):
        raise _Skip("TensorList inputs: their dtypes are not recorded")
    tensors = [i for i in range(len(inp.types)) if inp.has_tensor(i) and inp.read(i)]
    if not tensors:
        raise _Skip("no tensor input recorded")
    largest = max(tensors, key=lambda i: prod(inp.tensor(i)))
    return 0, inp.tensor_bytes() + _out(inp, inp.tensor(largest), largest)


def _write_only(inp: _Inputs) -> tuple[int, int]:
    """copy_/fill_/zero_: `self` is written, not read."""
    return 0, inp.tensor_bytes(skip=(0,)) + _out(inp, inp.tensor(0))


def _reduction(inp: _Inputs, *, at: int = 1) -> tuple[int, int]:
    """0 FLOPs; the output keeps the dims not reduced (argument `at`: a dim or dim list; none: all of them).
    `at` is 2 for `norm(self, p, dim)` and `linalg_vector_norm(self, ord, dim)`, whose argument 1 is the order."""
    x = inp.tensor(0)
    if inp.has_tensor(1) and inp.read(1):  # max.other(self, other) or max.unary_out(self, *, out): not told apart
        raise _Skip("a second tensor: max/min of two tensors, or an out= tensor, which the trace does not tell apart")
    dims = inp.value(at) if len(inp.types) > at and inp.types[at] in ("Scalar", "ScalarList") else None
    if isinstance(dims, bool) or not isinstance(dims, (int, list)):
        dims = []
    reduced = {d % len(x) for d in ([dims] if isinstance(dims, int) else dims) if isinstance(d, int)} if x else set()
    out = [] if not reduced else [s for i, s in enumerate(x) if i not in reduced]
    return 0, inp.tensor_bytes() + _out(inp, out)


def _embedding(inp: _Inputs) -> tuple[int, int]:
    """embedding(weight, indices): the indices plus the gathered rows, read, and the output, written."""
    w, idx = inp.tensor(0), inp.tensor(1)
    if len(w) != 2:
        raise _Skip(f"embedding table {w} is not 2-D")
    return 0, inp.tensor_bytes(skip=(0,)) + 2 * _out(inp, [*idx, w[1]])


def _embedding_backward(inp: _Inputs) -> tuple[int, int]:
    """embedding_(dense_)backward(grad, indices, num_weights, …): the whole grad table is written."""
    grad = inp.tensor(0)
    rows = inp.value(2)
    if not isinstance(rows, int) or isinstance(rows, bool) or not grad:
        raise _Skip("num_weights not recorded (Concrete Inputs)")
    return 0, inp.tensor_bytes() + _out(inp, [rows, grad[-1]])


def _names(*names: str) -> tuple[str, ...]:
    return tuple(f"aten::{n}" for n in names)


def _arguments(count: int, *names: str) -> dict[str, int]:
    return dict.fromkeys(_names(*names), count)


#: op -> how many leading recorded inputs are its arguments: 1 + the last position any of its functional overloads
#: (those of older torch releases too) takes a tensor at. A tensor recorded past them is an out= tensor (`mm.out(self,
#: mat2, *, out)`, `sum.IntList_out(self, dim, keepdim, *, dtype, out)`): the output, written, not read. Ops not
#: listed (attention) have no out= overload a trace records; every tensor they record is read.
ARGUMENTS: dict[str, int] = {
    **_arguments(2, "mm", "_int_mm", "bmm", "matmul", "mv", "dot"),
    **_arguments(3, "addmm", "_addmm_activation", "baddbmm", "addbmm", "addmv", "linear"),
    "aten::_scaled_mm": 7,  # torch 2.1: (self, mat2, bias, out_dtype, scale_a, scale_b, scale_result, …)
    "vllm::rocm_unquantized_gemm": 3,
    **_arguments(3, "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "convolution", "_convolution", "convolution_overrideable", "_convolution_mode", "mkldnn_convolution",
                 "miopen_convolution", "convolution_backward", "convolution_backward_overrideable",
                 "cudnn_convolution", "cudnn_convolution_transpose"),  # cudnn_*: a bias at 2 before torch 1.8
    **_arguments(4, "_slow_conv2d_forward", "thnn_conv2d"),
    **_arguments(4, "layer_norm", "native_layer_norm", "group_norm"),
    **_arguments(3, "rms_norm", "_fused_rms_norm", "native_group_norm"),
    **_arguments(5, "batch_norm", "_batch_norm_impl_index", "native_batch_norm", "_native_batch_norm_legit",
                 "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_no_update",
                 "cudnn_batch_norm", "miopen_batch_norm", "instance_norm", "native_group_norm_backward",
                 "_fused_rms_norm_backward"),
    **_arguments(7, "native_layer_norm_backward", "native_batch_norm_backward", "miopen_batch_norm_backward"),
    "aten::cudnn_batch_norm_backward": 9,  # reserveSpace at 8
    "aten::batch_norm_backward": 11,  # reserve at 10
    **_arguments(1, "softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"),
    **_arguments(4, "_softmax_backward_data", "_log_softmax_backward_data"),  # `self` at 3 before torch 1.11
    **_arguments(1, "neg", "abs", "exp", "exp_", "log", "log_", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "reciprocal",
                 "sin", "cos", "relu", "relu_", "gelu", "gelu_", "silu", "silu_", "sigmoid", "sigmoid_", "tanh",
                 "tanh_", "hardtanh", "hardtanh_", "leaky_relu", "leaky_relu_", "elu", "erf", "sign", "neg_",
                 "native_dropout", "zero_"),
    **_arguments(2, "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "pow", "pow_", "maximum",
                 "minimum", "eq", "ne", "lt", "le", "gt", "ge", "gelu_backward", "silu_backward",
                 "sigmoid_backward", "tanh_backward", "threshold_backward", "hardtanh_backward",
                 "native_dropout_backward", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "copy_", "fill_"),
    **_arguments(3, "clamp", "clamp_", "where", "masked_fill", "masked_fill_", "addcmul", "addcmul_", "addcdiv",
                 "addcdiv_", "lerp", "lerp_"),
    **_arguments(1, "sum", "mean", "amax", "amin", "argmax", "argmin", "norm", "linalg_vector_norm", "var", "std",
                 "var_mean", "std_mean", "prod", "logsumexp", "all", "any"),
    **_arguments(2, "max", "min"),  # max.other(self, other): a second tensor is refused (`_reduction`)
    **_arguments(2, "embedding", "embedding_backward", "embedding_dense_backward"),
}


#: op name -> (family, formula): the whole model
MODELS: dict[str, tuple[Family, Formula]] = {
    "aten::mm": ("matmul", _mm_at(0, 1)),
    "aten::_int_mm": ("matmul", _int_mm),
    "aten::addmm": ("matmul", _mm_at(1, 2)),
    "aten::_addmm_activation": ("matmul", _mm_at(1, 2)),
    "aten::bmm": ("matmul", _bmm_at(0, 1)),
    "aten::baddbmm": ("matmul", _bmm_at(1, 2)),
    "aten::addbmm": ("matmul", _bmm_at(1, 2, reduce_batch=True)),
    "aten::matmul": ("matmul", _matmul),
    "aten::linear": ("matmul", _linear),
    "aten::mv": ("matmul", lambda inp: _mv(inp, 0, 1)),
    "aten::addmv": ("matmul", lambda inp: _mv(inp, 1, 2)),
    "aten::dot": ("matmul", _dot),
    "aten::_scaled_mm": ("matmul", _scaled_mm),
    "aten::einsum": ("matmul", _einsum),
    # vLLM's ROCm linear (x, weight, bias): TraceLens models it too; the aten::addmm / mm inside count through it
    "vllm::rocm_unquantized_gemm": ("matmul", _linear),
    **{name: ("convolution", _conv(layout)) for name, layout in _CONV_LAYOUTS.items()},
    "aten::convolution_backward": ("convolution", _conv_backward),
    "aten::convolution_backward_overrideable": ("convolution", _conv_backward),
    **{name: ("attention", _attention("bhsd")) for name in _names(
        "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable")},
    **{name: ("attention", _attention("bshd")) for name in _names("_flash_attention_forward",
                                                                   "_efficient_attention_forward")},
    **{name: ("attention", _attention_backward("bhsd")) for name in _names(
        "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_fused_attention_overrideable_backward")},
    **{name: ("attention", _attention_backward("bshd")) for name in _names("_flash_attention_backward",
                                                                            "_efficient_attention_backward")},
    **{name: ("norm", _like_first) for name in _names(
        "layer_norm", "native_layer_norm", "native_layer_norm_backward", "batch_norm", "_batch_norm_impl_index",
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "_batch_norm_with_update", "_batch_norm_no_update", "cudnn_batch_norm", "miopen_batch_norm",
        "native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward",
        "miopen_batch_norm_backward", "group_norm", "native_group_norm", "native_group_norm_backward",
        "instance_norm", "rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward")},
    **{name: ("softmax", _like_first) for name in _names(
        "softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax", "_softmax_backward_data",
        "_log_softmax_backward_data")},
    **{name: ("elementwise", _elementwise) for name in _names(
        "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "neg", "neg_", "abs", "exp", "exp_",
        "log", "log_", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "pow", "pow_", "reciprocal", "sin", "cos",
        "relu", "relu_", "gelu", "gelu_", "gelu_backward", "silu", "silu_", "silu_backward", "sigmoid", "sigmoid_",
        "sigmoid_backward", "tanh", "tanh_", "tanh_backward", "threshold_backward", "hardtanh", "hardtanh_",
        "hardtanh_backward", "leaky_relu", "leaky_relu_", "elu", "clamp", "clamp_", "clamp_min", "clamp_min_",
        "clamp_max", "clamp_max_", "where", "masked_fill", "masked_fill_", "addcmul", "addcmul_", "addcdiv",
        "addcdiv_", "lerp", "lerp_", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "native_dropout",
        "native_dropout_backward", "erf", "sign")},
    **{name: ("elementwise", _write_only) for name in _names("copy_", "fill_", "zero_")},
    **{name: ("reduction", _reduction) for name in _names(
        "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "std_mean", "prod",
        "logsumexp", "all", "any")},
    **{name: ("reduction", functools.partial(_reduction, at=2)) for name in _names("norm", "linalg_vector_norm")},
    "aten::embedding": ("embedding", _embedding),
    "aten::embedding_backward": ("embedding", _embedding_backward),
    "aten::embedding_dense_backward": ("embedding", _embedding_backward),
}


def _parse(text: str | None) -> list[object]:
    if text is None:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def resolve(name: str, input_dims: str | None, input_types: str | None, concrete_inputs: str | None,
            input_strides: str | None = None) -> tuple[int | None, int | None, str | None, str | None]:
    """(FLOPs, bytes, dtype, skip_reason) of one op from its recorded args (JSON text, as ingested).

    FLOPs and bytes are None with a reason where the formula cannot be resolved from what was recorded.

        resolve("aten::mm", "[[32, 64], [64, 128]]", '["float", "float"]', None)
        -> (524288, 57344, "fp32", None)
    """
    if name not in MODELS:
        return None, None, None, "no FLOP model for this op"
    if input_dims is None:
        return None, None, None, "no input shapes recorded (record_shapes=False)"
    inp = _Inputs(_parse(input_dims), _parse(input_types), _parse(concrete_inputs), ARGUMENTS.get(name),
                  _parse(input_strides))
    dtype = inp.dtype()
    try:
        flops, nbytes = MODELS[name][1](inp)
    except _Skip as why:
        return None, None, dtype, str(why)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as err:
        return None, None, dtype, f"recorded inputs do not fit the formula ({type(err).__name__})"
    return int(flops), None if nbytes is None else int(nbytes), dtype, None


# --------------------------------------------------------------------------------------------- result
@dataclass(frozen=True, kw_only=True)
class FlopsResult:
    """FLOPs and bytes per CPU op with a model (see the module docstring).

    `ops` columns: event_id, name, family, dtype, flops, bytes (null where skipped), counted (False inside an
    outer counted op, and where skipped), counting_event_id (the op whose count includes this one: itself
    when counted), skip_reason, trace_flops (the trace's own `flops` arg), input_dims, pid, tid, ts_ns, dur_ns.
    `families`: family, ops, counted_ops, flops, bytes (counted ops only), in FAMILIES order.
    `vs_trace`: per family where the trace has its own `flops` arg: ops, flops (ours, the same ops),
    trace_flops, relative_difference ((ours - trace) / trace; null where the trace says 0).
    """

    shapes_recorded: bool
    strides_recorded: bool  # Input Strides: without them a broadcast input's bytes count at its full shape
    total_flops: int
    total_bytes: int
    ops_total: int  # CPU ops in the trace
    ops_modelled: int  # with a resolved formula
    ops_skipped: int  # with a model, but the recorded inputs do not resolve it (skip_reason says why)
    ops_unmodelled: int  # no model for the op at all
    unmodelled_gpu_fraction: float | None  # kernel time whose launching op (and its ancestors) has no model
    unmodelled_ops: pl.DataFrame  # that kernel time by the outermost op around its launch (`_unmodelled_ops`)
    trace_flops_present: bool
    ops: pl.DataFrame
    families: pl.DataFrame
    vs_trace: pl.DataFrame


_SIG = ("name", "input_dims", "input_types", "concrete_inputs", "input_strides")


def _models(cpu: pl.DataFrame) -> pl.DataFrame:
    """Resolve each distinct (name, shapes, types, values) once: shapes repeat across layers and steps."""
    sigs = cpu.filter(pl.col("name").is_in(list(MODELS))).select(_SIG).unique(maintain_order=True)
    rows = [resolve(*sig) for sig in sigs.iter_rows()]
    return sigs.with_columns(
        family=pl.Series([MODELS[n][0] for n in sigs["name"]], dtype=pl.String),
        flops=pl.Series([r[0] for r in rows], dtype=pl.Int64),
        bytes=pl.Series([r[1] for r in rows], dtype=pl.Int64),
        dtype=pl.Series([r[2] for r in rows], dtype=pl.String),
        skip_reason=pl.Series([r[3] for r in rows], dtype=pl.String),
    )


def _outermost_resolved(parent: np.ndarray, depth: np.ndarray, resolved: np.ndarray) -> np.ndarray:
    """Per row, the row of the outermost resolved op on its path from the root (itself included); -1 if none.

    Vectorized level by level (parents have depth one less than their children)."""
    n = len(parent)
    top = np.where(resolved, np.arange(n), -1)
    for d in range(1, int(depth.max()) + 1 if n else 0):
        rows = np.flatnonzero(depth == d)
        up = top[parent[rows]]
        top[rows] = np.where(up >= 0, up, top[rows])
    return top


def op_flops(source: Source) -> FlopsResult:
    """FLOPs and bytes of every CPU op with a FLOP model, nested ops counted once (see the module docstring)."""
    frames = frames_of(source)
    trace = frames.trace
    columns = trace.events.collect_schema().names()  # ingested before schema 2 (concrete) or 4 (strides): absent
    cpu = (
        trace.cpu_ops.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
        .select("event_id", "name", "pid", "tid", "ts_ns", "dur_ns", "input_dims", "input_types",
                *(pl.col(c) if c in columns else pl.lit(None, pl.String).alias(c)
                  for c in ("concrete_inputs", "input_strides")),
                trace_flops="flops")
        .collect(engine="in-memory")
    )
    if frames.graph_ops.height:  # ops of graph replays, from the capture: counted once per replay
        cpu = pl.concat([cpu, frames.graph_ops.select(cpu.columns[:-1] + ["flops"]).rename({"flops": "trace_flops"})],
                        how="vertical_relaxed")
    cpu = sort_for_nesting(cpu)
    shapes_recorded = bool(cpu["input_dims"].is_not_null().any()) if cpu.height else False
    models = _models(cpu)
    cpu = cpu.join(models, on=list(_SIG), how="left", nulls_equal=True, maintain_order="left")
    parent, depth = parent_index(cpu)
    resolved = cpu["flops"].is_not_null().to_numpy()
    top = _outermost_resolved(parent, depth, resolved)
    event_ids = cpu["event_id"].to_numpy()
    root = np.arange(cpu.height)  # each op's outermost enclosing op (itself at depth 0)
    for d in range(1, int(depth.max()) + 1 if cpu.height else 0):
        rows = np.flatnonzero(depth == d)
        root[rows] = root[parent[rows]]
    names = cpu["name"]
    cpu = cpu.with_columns(
        counted=pl.Series(resolved & (top == np.arange(cpu.height))),
        counting_event_id=pl.Series(np.where(top >= 0, event_ids[np.maximum(top, 0)], -1)).replace(-1, None),
        covered=pl.Series(top >= 0),
        root_name=names.gather(root) if cpu.height else names.clear(),  # (gathered in polars: a null name stays null)
    )
    ops = cpu.filter(pl.col("family").is_not_null()).select(
        "event_id", "name", "family", "dtype", "flops", "bytes", "counted", "counting_event_id", "skip_reason",
        "trace_flops", "input_dims", "pid", "tid", "ts_ns", "dur_ns",
    ).sort("event_id")
    counted = ops.filter("counted")
    n_modelled = int(ops["flops"].is_not_null().sum())
    return FlopsResult(
        shapes_recorded=shapes_recorded,
        strides_recorded=bool(cpu["input_strides"].is_not_null().any()) if cpu.height else False,
        total_flops=int(counted["flops"].sum()),
        total_bytes=int(counted["bytes"].sum()),
        ops_total=cpu.height,
        ops_modelled=n_modelled,
        ops_skipped=ops.height - n_modelled,
        ops_unmodelled=cpu.height - ops.height,
        unmodelled_gpu_fraction=_unmodelled_gpu_fraction(frames.launches, cpu),
        unmodelled_ops=_unmodelled_ops(frames.launches, cpu),
        trace_flops_present=bool(cpu["trace_flops"].is_not_null().any()) if cpu.height else False,
        ops=ops,
        families=_families(ops),
        vs_trace=_vs_trace(ops),
    )


def _families(ops: pl.DataFrame) -> pl.DataFrame:
    """family, ops (resolved), counted_ops, flops, bytes (of counted ops): one row per family present."""
    order = pl.DataFrame({"family": list(FAMILIES)}).with_row_index("order")
    return (
        ops.filter(pl.col("flops").is_not_null())
        .group_by("family")
        .agg(ops=pl.len(), counted_ops=pl.col("counted").sum(),
             flops=pl.col("flops").filter("counted").sum(), bytes=pl.col("bytes").filter("counted").sum())
        .join(order, on="family").sort("order").drop("order")
    )


def _vs_trace(ops: pl.DataFrame) -> pl.DataFrame:
    """Ours against the trace's own `flops` arg, per family, over the ops that carry both."""
    both = ops.filter(pl.col("trace_flops").is_not_null() & pl.col("flops").is_not_null())
    order = pl.DataFrame({"family": list(FAMILIES)}).with_row_index("order")
    return (
        both.group_by("family")
        .agg(ops=pl.len(), flops=pl.col("flops").sum(), trace_flops=pl.col("trace_flops").sum())
        .with_columns(relative_difference=pl.when(pl.col("trace_flops") != 0)
                      .then((pl.col("flops") - pl.col("trace_flops")) / pl.col("trace_flops")))
        .join(order, on="family").sort("order").drop("order")
    )


#: rows of `unmodelled_ops`
UNMODELLED_TOP = 5


def _unmodelled_ops(launches: pl.DataFrame, cpu: pl.DataFrame) -> pl.DataFrame:
    """name, gpu_ns, of_kernel_time_fraction: the kernel time no FLOP model covers, by the outermost op around its
    launch (a custom op such as vllm::moe_forward, whose GEMMs no formula counts), `(no op)` where none is linked;
    the UNMODELLED_TOP largest. What `unmodelled_gpu_fraction` is made of."""
    schema = {"name": pl.String, "gpu_ns": pl.Int64, "of_kernel_time_fraction": pl.Float64}
    kernels = launches.filter((pl.col("kind") == Kind.KERNEL.value) & pl.col("dur_ns").is_not_null())
    total = int(kernels["dur_ns"].sum()) if kernels.height else 0
    if total == 0:
        return pl.DataFrame(schema=schema)
    return (kernels.join(cpu.select(op_event_id="event_id", covered="covered", root="root_name"), on="op_event_id",
                         how="left", maintain_order="left")
            .filter(~pl.col("covered").fill_null(False))
            .group_by(name=pl.col("root").fill_null("(no op)")).agg(gpu_ns=pl.col("dur_ns").sum())
            .with_columns(of_kernel_time_fraction=pl.col("gpu_ns") / total)
            .sort(["gpu_ns", "name"], descending=[True, False]).head(UNMODELLED_TOP).cast(schema))  # type: ignore[arg-type]


def _unmodelled_gpu_fraction(launches: pl.DataFrame, cpu: pl.DataFrame) -> float | None:
    """Share of kernel time whose launching op is neither modelled nor inside a modelled op (None: no kernels).

    A kernel no op could be linked to (no External id match) counts as unmodelled: nothing says what it did."""
    kernels = launches.filter((pl.col("kind") == Kind.KERNEL.value) & pl.col("dur_ns").is_not_null())
    total = int(kernels["dur_ns"].sum()) if kernels.height else 0
    if total == 0:
        return None
    covered = kernels.join(cpu.select(op_event_id="event_id", covered="covered"), on="op_event_id", how="left",
                           maintain_order="left")
    return float(covered.filter(~pl.col("covered").fill_null(False))["dur_ns"].sum()) / total
