"""The value types of the command's flags: each parses one flag's text into its value or raises
argparse.ArgumentTypeError with a one-line reason (argparse names the flag)."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable

from pykubelet.cmd import node_resources
from pykubelet.common.node_registration import Taint, parse_label_pairs, parse_taints
from pykubelet.common.options import parse_duration


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: must be 0-65535")
    return value


def header(text: str) -> tuple[str, str]:
    # Split at the first ':' only: a value may hold ':' (URLs, tokens) (kubernetes#37346).
    key, sep, value = text.partition(":")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"invalid header {text!r}: expected Key:Value")
    return key.strip(), value.strip()


def size(text: str) -> int:
    units = {"": 1, "k": 1000, "ki": 1024, "m": 1000**2, "mi": 1024**2, "g": 1000**3, "gi": 1024**3}
    number = text.rstrip("kKmMgGiI")
    unit = text[len(number) :].lower()
    try:
        return int(float(number) * units[unit])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: e.g. 10Mi or 1048576") from None


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no"}:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}: use true or false")


def comma_list(text: str) -> list[str]:
    """The comma-separated items, trimmed, empty ones dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def path_list(text: str) -> list[str]:
    paths = comma_list(text)
    for path in paths:
        if not path.startswith("/"):
            raise argparse.ArgumentTypeError(f"{path!r} is not an absolute path")
    return paths


def ip_list(text: str) -> list[str]:
    ips = comma_list(text)
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{ip!r} is not an IP address") from None
    return ips


class Replace(argparse.Action):
    """A repeatable list flag whose first use replaces the default (a --config file's list),
    as a kubelet flag overrides its configuration; later uses extend it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        given = f"_{self.dest}_given"
        current = getattr(namespace, self.dest) if getattr(namespace, given, False) else []
        setattr(namespace, self.dest, [*current, *(values if isinstance(values, list) else [])])
        setattr(namespace, given, True)


def key_value_map(separator: str) -> Callable[[str], dict[str, str]]:
    def parse(text: str) -> dict[str, str]:
        try:
            return node_resources.parse_map(text, separator)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def labels(text: str) -> dict[str, str]:
    try:
        return parse_label_pairs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def taints(text: str) -> list[Taint]:
    try:
        return parse_taints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
