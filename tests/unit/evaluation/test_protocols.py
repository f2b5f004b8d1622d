"""Protocol arithmetic against hand-written expectations on small token streams."""

from __future__ import annotations

import numpy as np
import pytest

from kerple.evaluation.protocols import ProtocolError, WindowPlan, build_plans, last_token, nonoverlap, sliding


def scored_label_indices(plan: WindowPlan) -> np.ndarray:
    """Stream indices of every scored label token of ``plan``, in evaluation order."""
    parts = [
        np.arange(start + first + 1, start + plan.input_length + 1, dtype=np.int64)
        for start, first in zip(plan.starts.tolist(), plan.score_from.tolist())
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def test_nonoverlap_scores_the_same_tokens_at_every_length() -> None:
    # 37 tokens -> 36 labels; longest length 8 -> T = 32 labels shared by all lengths.
    plans = nonoverlap(37, [2, 4, 8])
    assert [p.num_windows for p in plans] == [16, 8, 4]
    assert [p.scored_tokens for p in plans] == [32, 32, 32]
    assert plans[2].starts.tolist() == [0, 8, 16, 24]
    assert plans[1].starts.tolist() == [0, 4, 8, 12, 16, 20, 24, 28]
    for plan in plans:
        assert scored_label_indices(plan).tolist() == list(range(1, 33))


def test_nonoverlap_num_tokens_and_fixed_window_count() -> None:
    plans = nonoverlap(100, [4, 8], num_tokens=20)  # 20 -> 16 (multiple of 8)
    assert [p.num_windows for p in plans] == [4, 2]
    fixed = nonoverlap(100, [4, 8], num_windows=3)
    assert [p.starts.tolist() for p in fixed] == [[0, 4, 8], [0, 8, 16]]
    assert [p.scored_tokens for p in fixed] == [12, 24]
    with pytest.raises(ProtocolError, match="need 105 tokens"):
        nonoverlap(100, [8], num_windows=13)


def test_nonoverlap_lengths_that_do_not_divide_the_longest_share_their_common_multiple() -> None:
    """Lengths such as 5 and 8 were refused ("use lengths that divide 8"): T was a multiple of the
    longest length only. 99 labels hold one multiple of lcm(5, 8) = 40 twice: T = 80."""
    plans = nonoverlap(100, [5, 8])
    assert [p.num_windows for p in plans] == [16, 10] and [p.scored_tokens for p in plans] == [80, 80]
    for plan in plans:
        assert scored_label_indices(plan).tolist() == list(range(1, 81))
    assert [p.num_windows for p in nonoverlap(100, [5, 8], num_tokens=79)] == [8, 5]  # 79 -> 40
    with pytest.raises(ProtocolError, match=r"^lengths 7, 8 tile the same tokens only in multiples of 56 \(their least "
                                            r"common multiple\), more than the 50 tokens scored; pass --num-windows N "
                                            r"\(N windows at every length\) or --num-tokens 56$"):
        nonoverlap(100, [7, 8], num_tokens=50)
    with pytest.raises(ProtocolError, match=r"at every length\)$"):  # no --num-tokens the stream cannot give
        nonoverlap(50, [7, 8])


def test_nonoverlap_needs_a_window_plus_label() -> None:
    assert nonoverlap(9, [8])[0].num_windows == 1
    with pytest.raises(ProtocolError, match="needs at least 9"):
        nonoverlap(8, [8])


def test_sliding_first_window_scores_all_then_last_stride() -> None:
    # 21 tokens, length 8, stride 4: T = 16 labels; windows start 0, 4, 8.
    (plan,) = sliding(21, [8], stride=4)
    assert plan.starts.tolist() == [0, 4, 8]
    assert plan.score_from.tolist() == [0, 4, 4]
    assert plan.scored_tokens == 16
    # window 0 scores labels 1..8, window 1 labels 9..12, window 2 labels 13..16
    assert scored_label_indices(plan).tolist() == list(range(1, 17))


def test_sliding_covers_the_same_labels_at_every_length() -> None:
    plans = sliding(40, [4, 8], stride=2)  # T = 32
    assert [p.num_windows for p in plans] == [15, 13]
    for plan in plans:
        assert scored_label_indices(plan).tolist() == list(range(1, 33))
    with pytest.raises(ProtocolError, match="stride must be"):
        sliding(40, [4, 8], stride=5)


def test_sliding_with_stride_equal_length_is_nonoverlap() -> None:
    (slide,) = sliding(37, [8], stride=8)
    (plain,) = nonoverlap(37, [8])
    assert slide.starts.tolist() == plain.starts.tolist()
    assert slide.score_from.tolist() == plain.score_from.tolist()


def test_last_token_same_targets_with_length_minus_one_context() -> None:
    # 26 tokens, longest 8: three disjoint segments [0,8), [8,16), [16,24); targets 7, 15, 23.
    plans = last_token(26, [2, 4, 8])
    for plan in plans:
        assert plan.num_windows == 3
        assert plan.scored_tokens == 3
        assert scored_label_indices(plan).tolist() == [7, 15, 23]
        assert plan.input_length == plan.length - 1
    short, _, long = plans
    assert short.starts.tolist() == [6, 14, 22]  # reads one token: the one right before the target
    assert long.starts.tolist() == [0, 8, 16]  # reads the 7 tokens before the target
    assert last_token(26, [4, 8], num_windows=2)[0].starts.tolist() == [4, 12]
    with pytest.raises(ProtocolError, match="holds 3"):
        last_token(26, [8], num_windows=4)


def test_build_plans_validates_its_arguments() -> None:
    with pytest.raises(ProtocolError, match="unknown protocol"):
        build_plans("strided", 100, [8])
    with pytest.raises(ProtocolError, match="needs --stride"):
        build_plans("sliding", 100, [8])
    with pytest.raises(ProtocolError, match="at most one"):
        build_plans("nonoverlap", 100, [8], num_tokens=16, num_windows=2)
    plans = build_plans("last_token", 100, [4, 8])
    assert isinstance(plans[0].starts, np.ndarray) and plans[0].starts.dtype == np.int64


@pytest.mark.parametrize("call, flag, fix", [
    # 100 tokens hold 99 labels; 12 windows of 8 read 97 tokens, 13 would read 105
    (lambda: nonoverlap(100, [4, 8], num_windows=13), "--num-windows 13", "--num-windows 12"),
    # sliding, length 8, stride 4: k windows read 8 + 4(k - 1) + 1 tokens, at most 100 -> k = 23
    (lambda: sliding(100, [8], stride=4, num_windows=30), "--num-windows 30", "--num-windows 23"),
    (lambda: last_token(26, [8], num_windows=4), "--num-windows 4", "--num-windows from 1 to 3"),
    (lambda: nonoverlap(100, [8], num_tokens=500), "--num-tokens 500", "--num-tokens all"),
    (lambda: nonoverlap(100, [4, 8], num_tokens=6), "--num-tokens 6", "--num-tokens 8 or more"),
    (lambda: nonoverlap(8, [4, 8]), "--eval-lengths 8", "shorter lengths or a larger split"),
])
def test_a_refusal_names_its_flag_and_a_value_that_works(call, flag: str, fix: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        call()
    message = str(refused.value)
    assert flag in message and fix in message and "\n" not in message


def test_the_suggested_window_counts_are_the_largest_that_fit() -> None:
    assert nonoverlap(100, [4, 8], num_windows=12)[1].starts[-1] + 8 + 1 == 97
    assert sliding(100, [8], stride=4, num_windows=23)[0].starts[-1] + 8 + 1 == 97
    with pytest.raises(ProtocolError):
        sliding(100, [8], stride=4, num_windows=24)  # 8 + 4 * 23 + 1 = 101 tokens
