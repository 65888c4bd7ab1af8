"""The op table as torch prints it (`EventList.table()`): the same column names, units and number formats,
so a table pasted into an issue reads the same whether it came from torch or from stepscope.

Columns appear as torch shows them: device columns only when some op has device time, memory columns
when the trace has `[memory]` events (device memory only when some op has it), "Input Shapes" when grouped
by shape, "Total FLOPs" (scaled like torch's KFLOPs/MFLOPs/…) when recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stepscope.analyze.ops import OpTable

_FLOP_UNITS = ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs")


def format_time_us(time_us: float) -> str:
    """torch's `_format_time`: 12.345us, 1.234ms, 1.234s."""
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def format_memory(nbytes: int) -> str:
    """torch's `_format_memory`: 1.50 KB, 2.00 MB, 3.00 GB (binary multiples), 12 B."""
    kb, mb, gb = 1024, 1024**2, 1024**3
    if abs(nbytes) >= gb:
        return f"{nbytes / gb:.2f} GB"
    if abs(nbytes) >= mb:
        return f"{nbytes / mb:.2f} MB"
    if abs(nbytes) >= kb:
        return f"{nbytes / kb:.2f} KB"
    return f"{nbytes} B"


def format_share(fraction: float | None) -> str:
    """torch's `_format_time_share`: 12.34% (NaN where the total is zero)."""
    return "NaN" if fraction is None else f"{fraction * 100:.2f}%"


@dataclass(frozen=True, kw_only=True)
class _Columns:
    """Which optional column groups the table shows, and the device's name in their headers."""

    dev: str
    device_time: bool
    memory: bool
    device_mem: bool
    shapes: bool
    flops_scale: float
    flops_header: str  # "" when no op has FLOPs


def _columns(result: OpTable) -> _Columns:
    """The optional column groups torch would show for this table; FLOPs scaled to the smallest op's unit."""
    ops = result.ops
    flops_vals = [f for f in ops["flops"].to_list() if f is not None and f > 0]
    flops_scale, flops_header = 1.0, ""
    if flops_vals:
        power = max(0, min(int(math.floor(math.log10(min(flops_vals)) / 3)), len(_FLOP_UNITS) - 1))
        flops_scale, flops_header = 10.0 ** (-3 * power), f"Total {_FLOP_UNITS[power]}"
    return _Columns(dev=result.device_name or "CUDA", device_time=bool((ops["self_device_ns"] > 0).any()),
                    memory=result.has_memory, device_mem=bool((ops["self_device_mem_bytes"] != 0).any()),
                    shapes=result.group_by_shape, flops_scale=flops_scale, flops_header=flops_header)


def _headers(cols: _Columns) -> list[str]:
    """Column headers in torch's order."""
    dev = cols.dev
    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if cols.device_time:
        headers += [f"Self {dev}", f"Self {dev} %", f"{dev} total", f"{dev} time avg"]
    if cols.memory:
        headers += ["CPU Mem", "Self CPU Mem"]
        if cols.device_mem:
            headers += [f"{dev} Mem", f"Self {dev} Mem"]
    headers.append("# of Calls")
    if cols.shapes:
        headers.append("Input Shapes")
    if cols.flops_header:
        headers.append(cols.flops_header)
    return headers


#: the Name cell of events the trace wrote without a `name` (pooled into one row, as torch pools by name)
UNNAMED = "(no name)"


def _row(r: dict[str, Any], cols: _Columns, max_name_width: int, max_shapes_width: int) -> list[str]:
    """One op's cells, formatted as torch formats them, matching `_headers`."""
    name = r["name"] if r["name"] is not None else UNNAMED  # a trace event written without a name
    if len(name) >= max_name_width - 3:
        name = name[: max_name_width - 3] + "..."
    row = [name, format_share(r["self_cpu_fraction"]), format_time_us(r["self_cpu_ns"] / 1e3),
           format_share(r["cpu_total_fraction"]), format_time_us(r["cpu_total_ns"] / 1e3),
           format_time_us(r["cpu_total_ns"] / 1e3 / r["calls"])]
    if cols.device_time:
        row += [format_time_us(r["self_device_ns"] / 1e3), format_share(r["self_device_fraction"]),
                format_time_us(r["device_total_ns"] / 1e3), format_time_us(r["device_total_ns"] / 1e3 / r["calls"])]
    if cols.memory:
        row += [format_memory(r["cpu_mem_bytes"]), format_memory(r["self_cpu_mem_bytes"])]
        if cols.device_mem:
            row += [format_memory(r["device_mem_bytes"]), format_memory(r["self_device_mem_bytes"])]
    row.append(str(r["calls"]))
    if cols.shapes:
        row.append(str(r["input_shapes"])[:max_shapes_width])
    if cols.flops_header:
        f: Any = r["flops"]
        row.append("--" if f is None or f <= 0 else f"{f * cols.flops_scale:8.3f}")
    return row


def _grid(headers: list[str], rows: list[list[str]], max_name_width: int, max_shapes_width: int) -> list[str]:
    """The table's lines: separator, headers, separator, rows, separator; cells right-aligned, the name
    (and input shapes) column as wide as its longest cell allows, every other column 12 wide."""
    name_width = min(max(len(r[0]) for r in rows) + 4, max_name_width)
    widths = [name_width] + [12] * (len(headers) - 1)
    if "Input Shapes" in headers:
        idx = headers.index("Input Shapes")
        widths[idx] = min(max(len(r[idx]) for r in rows) + 4, max_shapes_width)
    sep = "  ".join("-" * w for w in widths)

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True))

    return [sep, line(headers), sep, *(line(r) for r in rows), sep]


def render_ops_table(result: OpTable, *, max_name_width: int = 55, max_shapes_width: int = 80) -> str:
    """The canonical key_averages() table for an OpTable result."""
    if result.ops.height == 0:
        return "no CPU ops, annotations or GPU events in this trace: nothing to tabulate\n"
    cols = _columns(result)
    rows = [_row(r, cols, max_name_width, max_shapes_width) for r in result.ops.iter_rows(named=True)]
    out = _grid(_headers(cols), rows, max_name_width, max_shapes_width)
    out.append(f"Self CPU time total: {format_time_us(result.self_cpu_total_ns / 1e3)}")
    if cols.device_time:
        out.append(f"Self {cols.dev} time total: {format_time_us(result.self_device_total_ns / 1e3)}")
    if result.ops_shown < result.ops_total:
        out.append(f"(top {result.ops_shown} of {result.ops_total} rows, sorted by {result.sort_by}; "
                   "--top 0 shows all)")
    return "\n".join(out) + "\n"
