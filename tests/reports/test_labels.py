"""Figure labels (labels.py): labels for bars side by side stay short and tell the names apart, the top
kernels' labels included."""

from __future__ import annotations

from pathlib import Path

from builders import kernel, load_events, trace
from hypothesis import given
from hypothesis import strategies as st

from stepscope.analyze.kernels import kernel_summary
from stepscope.reports.labels import KERNEL_LABEL_CHARS, literal, metric_labels, short_labels, top_kernels

# six ROCm GEMM kernels (hipBLASLt names) alike in their first 48 characters and in their last 60
PREFIX = "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT"
SUFFIX = "_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_WS64_WG32_8_1"
ROCM = [PREFIX + tile + SUFFIX for tile in ("256x128x64", "128x224x64", "128x128x64", "256x256x64", "64x64x64",
                                           "128x128x32")]


def test_long_names_sharing_a_long_prefix_get_distinct_labels_within_the_width() -> None:
    labels = short_labels(ROCM, 44)
    assert len(set(labels)) == len(ROCM)
    assert all(len(label) <= 44 for label in labels)
    for tile, label in zip(("256x128x64", "128x224x64", "128x128x64", "256x256x64", "64x64x64", "128x128x32"),
                           labels, strict=True):
        assert tile in label and label.startswith("Cijk_") and "…" in label  # the part that tells them apart


def test_a_long_name_is_cut_in_the_middle_and_short_names_are_kept() -> None:
    name = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::AddFunctor>>(int)"
    label, short = short_labels([name, "attn_fwd"], 40)
    assert short == "attn_fwd"
    assert len(label) == 40 and label.startswith("void at::native::") and label.endswith(">>(int)")


def test_equal_names_share_a_label_and_whitespace_is_one_line() -> None:
    assert short_labels(["a\n b", "a b", "c"]) == ["a b", "a b", "c"]


def test_labels_are_plain_text_until_drawn() -> None:
    assert short_labels(["$\\frac"]) == ["$\\frac"] and literal("$\\frac") == "\\$\\frac"


@given(st.lists(st.text(alphabet="ab_x", min_size=0, max_size=90), max_size=12), st.integers(12, 60))
def test_distinct_names_get_distinct_labels_within_the_width(names: list[str], width: int) -> None:
    labels = short_labels(names, width)
    assert all(len(label) <= width for label in labels)
    assert len(set(labels)) == len(set(names))


def test_top_kernel_labels_are_distinct_and_name_their_kernel(tmp_path: Path) -> None:
    """Six ROCm GEMMs alike in their first 48 characters: six bar labels, each holding its tile size."""
    tiles = ("256x128x64", "128x224x64", "128x128x64", "256x256x64", "64x64x64", "128x128x32")
    name = "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT{}_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_WS64_WG32_8_1"
    doc = trace(*[kernel(name.format(t), ts=10 * i, dur=9 - i) for i, t in enumerate(tiles)])
    top = top_kernels(kernel_summary(load_events(tmp_path, doc)))
    labels = top["label"].to_list()
    assert len(set(labels)) == 6 and all(len(x) <= KERNEL_LABEL_CHARS for x in labels)
    assert all(t in x for t, x in zip(tiles, labels, strict=True))
    assert top["name"].to_list() == [name.format(t) for t in tiles]  # the full names, for the table


def test_metric_labels_keep_the_part_that_tells_the_names_apart() -> None:
    sass = [f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in ("dadd", "dfma", "ffma", "hadd")]
    labels, pattern = metric_labels(sass)
    assert list(labels.values()) == ["dadd", "dfma", "ffma", "hadd"]
    assert pattern == "smsp__sass_thread_inst_executed_op_*_pred_on.sum"
    assert [pattern.replace("*", v) for v in labels.values()] == sass  # the pattern gives the names back
    # names with nothing long in common, or one name alone, keep their own
    other = ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum"]
    assert metric_labels(other) == ({n: n for n in other}, "")
    assert metric_labels(sass[:1]) == ({sass[0]: sass[0]}, "")
    # names that part at a '_' of one of them: the shared start ends at the last '_' both have
    parted = ["x_a_1.sum", "x_ab.sum"]
    labels, pattern = metric_labels(parted)
    assert [pattern.replace("*", v) for v in labels.values()] == parted
