"""Sizes and durations are written one way everywhere (engine.core.common.formatting)."""

from __future__ import annotations

import math

import pytest

from engine.core.common.formatting import (
    format_age,
    format_bytes,
    format_duration,
    gib,
    mib,
    short_bytes,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0 bytes"),
        (1023, "1023 bytes"),
        (2048, "2 KiB"),
        (512 << 20, "512 MiB"),
        (3 << 29, "1.5 GiB"),
    ],
)
def test_format_bytes_in_sentences(value: int | None, text: str) -> None:
    assert format_bytes(value) == text


def test_unknown_bytes_can_be_named() -> None:
    assert format_bytes(None, "an unknown amount") == "an unknown amount"


def test_column_forms() -> None:
    assert short_bytes(612 << 20) == "612M"
    assert short_bytes(int(30.2 * (1 << 30))) == "30.2G"
    assert short_bytes(None) == "-"
    assert gib(80 << 30) == "80.0"
    assert gib(None) == "?"
    assert mib(612 << 20) == "612M"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (math.nan, "-"),
        (-1, "-"),
        (42.4, "42s"),
        (187, "3m07s"),
        (7500, "2h05m"),
        (93_600, "1d02h"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_an_age_has_a_decimal_under_ten_seconds() -> None:
    assert format_age(3.44) == "3.4s"
    assert format_age(-0.2) == "0.0s"
    assert format_age(75) == "1m15s"
