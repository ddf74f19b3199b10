"""argparse value types: every out-of-range or malformed value is refused with a message naming it."""

from __future__ import annotations

import argparse

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from longmoe.cli.argtypes import MAX_PORT, device, port, positive_float, positive_int


@given(st.integers())
def test_positive_int_accepts_exactly_the_integers_from_one(n: int) -> None:
    if n >= 1:
        assert positive_int(str(n)) == n
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=str(n)):
            positive_int(str(n))


@given(st.integers(-(10**6), 10**6))
def test_port_accepts_exactly_0_to_65535(n: int) -> None:
    if 0 <= n <= MAX_PORT:
        assert port(str(n)) == n
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=r"0-65535"):
            port(str(n))


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_positive_float_accepts_exactly_finite_positive(x: float) -> None:
    if 0 < x < float("inf"):
        assert positive_float(repr(x)) == x
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(repr(x))


@pytest.mark.parametrize("fn", [positive_int, positive_float, port])
@pytest.mark.parametrize("text", ["", "x", "1e", "0x10", "one", "--"])
def test_non_numbers_are_refused(fn, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a"):
        fn(text)


def test_device_checks_existence_before_anything_is_loaded() -> None:
    assert device("cpu") == "cpu"
    for bad in ("gpu", "", "cuda:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a torch device"):
            device(bad)
    missing = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(argparse.ArgumentTypeError, match="CUDA"):
        device(missing)
