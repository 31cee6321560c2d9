"""The node allocatable flags and KubeletConfiguration fields parsed, in the kubelet's words.

`--kube-reserved` / `--system-reserved` (`cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000`)
as cmd/kubelet/app/server.go's parseResourceList; `--eviction-hard`
(`memory.available<100Mi,nodefs.available<10%`) as eviction/helpers.go's
parseThresholdStatement: every signal the kubelet knows, a positive quantity or a percentage
(0% and 100% are ignored, as there); `--eviction-soft` alike, `--eviction-soft-grace-period`
(`memory.available=1m30s`) and `--eviction-minimum-reclaim` (`memory.available=0Mi,...`) as its
parseGracePeriods and parseMinimumReclaims. The flags' `k=v,k=v` / `k<v,k<v` lists as the kubelet's
MapStringString / LangleSeparatedMapStringString.
"""

from __future__ import annotations

from collections.abc import Mapping

from pykubelet.api.quantity import QuantityError, parse_quantity, to_bytes, to_millicpu
from pykubelet.common.allocatable import RESERVABLE, SIGNALS, Reserved, Threshold, percentage
from pykubelet.common.options import parse_duration

# apimachinery's resource.ErrFormatWrong.
QUANTITY_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def parse_map(text: str, separator: str) -> dict[str, str]:
    """`k=v,k=v` (or `k<v,...`) into a map; empty parts are skipped."""
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part:
            continue
        key, sep, value = part.partition(separator)
        if not sep:
            raise ValueError(f"malformed pair, expect string{separator}string")
        out[key.strip()] = value.strip()
    return out


def parse_reserved(given: Mapping[str, str]) -> Reserved:
    """A reservation; raises ValueError with the kubelet's message."""
    amounts: dict[str, int] = {}
    for name, text in given.items():
        if name not in RESERVABLE:
            raise ValueError(f'cannot reserve "{name}" resource')
        try:
            value = parse_quantity(text)
        except QuantityError:
            raise ValueError(
                f'failed to parse quantity "{text}" for "{name}" resource: {QUANTITY_FORMAT}'
            ) from None
        if value < 0:
            raise ValueError(f'resource quantity for "{name}" cannot be negative: {text}')
        amounts[name] = to_millicpu(text) if name == "cpu" else to_bytes(text)
    return Reserved(amounts, dict(given))


def parse_thresholds(given: Mapping[str, str]) -> tuple[Threshold, ...]:
    """Hard eviction thresholds; raises ValueError with the kubelet's message."""
    out: list[Threshold] = []
    for signal, text in given.items():
        if signal not in SIGNALS:
            raise ValueError(f"unsupported eviction signal {signal}")
        if text.endswith("%"):
            if text in {"0%", "100%"}:
                continue  # the kubelet ignores these
            try:
                fraction = percentage(text)
            except ValueError:
                raise ValueError(
                    f'strconv.ParseFloat: parsing "{text.rstrip("%")}": invalid syntax'
                ) from None
            if fraction < 0:
                raise ValueError(f"eviction percentage threshold {signal} must be >= 0%: {text}")
            if fraction > 1:
                raise ValueError(f"eviction percentage threshold {signal} must be <= 100%: {text}")
            out.append(Threshold(signal, text, percentage=fraction))
            continue
        try:
            value = parse_quantity(text)
        except QuantityError:
            raise ValueError(QUANTITY_FORMAT) from None
        if value <= 0:
            raise ValueError(f"eviction threshold {signal} must be positive: {text}")
        out.append(Threshold(signal, text, quantity=to_bytes(text)))
    return tuple(out)


def parse_grace_periods(given: Mapping[str, str]) -> dict[str, float]:
    """`--eviction-soft-grace-period`: seconds by signal; ValueError in the kubelet's words."""
    out: dict[str, float] = {}
    for signal, text in given.items():
        if signal not in SIGNALS:
            raise ValueError(f"unsupported eviction signal {signal}")
        seconds = parse_duration(text)
        if seconds < 0:
            raise ValueError(
                f"invalid eviction grace period specified: {text}, must be a positive value"
            )
        out[signal] = seconds
    return out


def parse_minimum_reclaims(given: Mapping[str, str]) -> dict[str, Threshold]:
    """`--eviction-minimum-reclaim`: an amount (a quantity or a percentage of capacity) by
    signal; ValueError in the kubelet's words."""
    out: dict[str, Threshold] = {}
    for signal, text in given.items():
        if signal not in SIGNALS:
            raise ValueError(f"unsupported eviction signal {signal}")
        if text.endswith("%"):
            try:
                fraction = percentage(text)
            except ValueError:
                raise ValueError(
                    f'strconv.ParseFloat: parsing "{text.rstrip("%")}": invalid syntax'
                ) from None
            if fraction <= 0:
                raise ValueError(
                    f"eviction percentage minimum reclaim {signal} must be positive: {text}"
                )
            out[signal] = Threshold(signal, text, percentage=fraction)
            continue
        try:
            value = parse_quantity(text)
        except QuantityError:
            raise ValueError(QUANTITY_FORMAT) from None
        if value < 0:
            raise ValueError(f"negative eviction minimum reclaim specified for {signal}")
        out[signal] = Threshold(signal, text, quantity=to_bytes(text))
    return out
