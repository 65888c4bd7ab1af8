"""Words on the report page (html.py, report.html.j2): counts with their noun in the right number, the full
names behind the top-kernel bar labels."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
from builders import kernel, load_events, trace
from markupsafe import escape

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.reports import html as H
from stepscope.reports.labels import top_kernels
from stepscope.reports.units import plural


def test_plural() -> None:
    assert plural(1, "trace") == "1 trace"
    assert plural(0, "trace") == "0 traces"
    assert plural(2, "rank") == "2 ranks"
    assert plural(1, "copy", "copies") == "1 copy" and plural(1024, "copy", "copies") == "1,024 copies"


def test_the_page_counts_rows_in_the_right_number() -> None:
    frame = pl.DataFrame({"name": ["a", "b"], "dur_ns": [1, 2]})
    section = H.Section(id="t", title="T", tables=[H.frame_table(frame, "Two rows", max_rows=1)])
    page = H.render_page(title="t", subtitle="s", sections=[section])
    assert "showing 1 of 2 rows" in page
    big = pl.DataFrame({"dur_ns": list(range(1234))})
    page = H.render_page(title="t", subtitle="s", sections=[H.Section(id="t", title="T",
                                                                      tables=[H.frame_table(big, "Many")])])
    assert f"showing {H.MAX_TABLE_ROWS} of 1,234 rows" in page


def test_kernel_bar_labels_have_their_full_names_beside_the_figure(tmp_path: Path) -> None:
    """GIVEN kernels whose long names differ only past their first 48 characters
    WHEN the report is rendered
    THEN a table beside the figure pairs each distinct bar label with the kernel's whole name."""
    name = "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT{}_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_WS64_WG32_8_1"
    tiles = ("256x128x64", "128x224x64", "128x128x64")
    bundle = TraceAnalysis.of(load_events(tmp_path, trace(*[kernel(name.format(x), ts=10 * i, dur=9 - i)
                                                            for i, x in enumerate(tiles)])))
    page = H.trace_report(bundle, source="rocm.json")
    table = page[page.index("Top kernels in the figure"):page.index("By category")]
    top = top_kernels(bundle.kernels)
    assert top["label"].n_unique() == 3
    for label, full in zip(top["label"], top["name"], strict=True):
        assert f">{escape(label)}</td>" in table and f">{full}</td>" in table  # the whole name, not cut


def test_long_text_is_never_lost_on_the_page() -> None:
    """A table's last text column whole (a warning's detail, wrapping); a cell cut elsewhere (a kernel name) keeps
    its full text as its tooltip; a headline sentence whole in its card."""
    from stepscope.reports.text import MAX_CELL

    name, detail = "k" * (MAX_CELL + 30), "a detail " * 20 + "END"
    table = H.frame_table(pl.DataFrame({"name": [name], "count": [1], "detail": [detail]}), "t")
    cells = table.rows[0]
    assert cells[2].text == detail.strip() and table.wrap == [False, False, True]
    assert cells[0].text.endswith("…") and cells[0].sort == name
    page = H.render_page(title="t", subtitle="s", sections=[H.Section(id="s", title="S", tables=[table])])
    assert f'title="{name}"' in page and detail.strip() in page

    @dataclasses.dataclass
    class Result:
        serving: str

    assert H.headline_items(Result(serving="vLLM " + "words " * 40 + "END")) == [
        ("serving", "vLLM " + "words " * 40 + "END")]


def test_names_cut_alike_stay_apart_on_the_page() -> None:
    """Two kernels whose names differ past the cut: distinct cells, each with its whole name as its tooltip."""
    a, b = "void kernel<" + "float, " * 20 + "5ul>(int)", "void kernel<" + "float, " * 20 + "2ul>(int)"
    table = H.frame_table(pl.DataFrame({"name": [a, b], "total_ns": [1, 2]}), "t")
    first, second = (row[0] for row in table.rows)
    assert first.text != second.text and "5ul>(int)" in first.text and "2ul>(int)" in second.text
    page = H.render_page(title="t", subtitle="s", sections=[H.Section(id="s", title="S", tables=[table])])
    assert f'title="{escape(a)}"' in page and f'title="{escape(b)}"' in page
