"""Kubernetes resource quantities ("64Mi", "500m", "1.5", "1e3", "2G") as exact numbers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL: dict[str, Fraction] = {
    "m": Fraction(1, 1000),
    **{s: Fraction(10 ** (3 * i)) for i, s in enumerate("kMGTPE", 1)},
}


# Beyond what any resource needs (the API server caps values at 2^63): keeps parsing cheap.
MAX_EXPONENT = 30
MAX_DIGITS = 40


class QuantityError(ValueError):
    pass


def parse_quantity(raw: str | int | float) -> Fraction:
    """The exact value of a quantity; raises QuantityError naming what is wrong."""
    if isinstance(raw, bool):
        raise QuantityError(f"invalid quantity {raw!r}")
    text = str(raw).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(
            f"invalid quantity {raw!r}: expected a number with an optional suffix "
            "(m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent), e.g. 500m or 64Mi"
        )
    number, suffix = match.groups()
    if (
        len(number) > MAX_DIGITS
        or (
            suffix is not None
            and len(suffix) > 1  # "E" alone is exa, not an exponent
            and suffix[0] in "eE"
            and abs(int(suffix[1:])) > MAX_EXPONENT
        )
    ):
        # 10**(10**7) alone would hold the interpreter for seconds: refuse before computing.
        raise QuantityError(f"invalid quantity {str(raw)[:40]!r}: out of range")
    try:
        value = Fraction(Decimal(number))
    except InvalidOperation:  # the pattern admits only decimal numbers; kept for safety
        raise QuantityError(f"invalid quantity {raw!r}") from None
    if suffix is None:
        return value
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    exponent = int(suffix[1:])  # e3, E-2
    scale = Fraction(10**exponent) if exponent >= 0 else Fraction(1, 10**-exponent)
    return value * scale


def ceil_div(value: Fraction, divisor: Fraction) -> int:
    """`value / divisor` rounded up, as the downward API reports resources."""
    quotient = value / divisor
    return -((-quotient.numerator) // quotient.denominator)


def to_bytes(raw: str | int | float) -> int:
    """A memory or storage quantity in whole bytes (rounded up, as the API server does)."""
    return ceil_div(parse_quantity(raw), Fraction(1))


def to_millicpu(raw: str | int | float) -> int:
    """A cpu quantity in millicores (rounded up)."""
    return ceil_div(parse_quantity(raw) * 1000, Fraction(1))
