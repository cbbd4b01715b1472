"""The ± shown to analysts is never below the bound it stands for."""

from hypothesis import given
from hypothesis import strategies as st

from dpproxy.results import format_bound, format_number


def test_error_bounds_round_up_at_the_digits_shown() -> None:
    assert format_bound(95.913871) == "95.92"  # format_number shows 95.91: below the bound
    assert format_number(95.913871) == "95.91"
    assert format_bound(1234.2) == "1,235"
    assert format_bound(1234567.0) == "1.24e+06"
    assert format_bound(180.0) == "180"
    assert format_bound(None) == "-"


@given(st.floats(min_value=1e-9, max_value=1e15, allow_nan=False))
def test_a_shown_bound_is_never_below_the_bound(value: float) -> None:
    assert float(format_bound(value).replace(",", "")) >= value
