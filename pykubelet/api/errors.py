"""Errors that name the manifest, the field and the reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    path: str  # e.g. "spec.containers[0].name"; "" for the document itself
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class ManifestError(Exception):
    """A manifest that cannot be run: every problem found, each with its field path."""

    def __init__(self, location: str, errors: list[FieldError]) -> None:
        self.location = location
        self.errors = errors
        super().__init__(self.describe())

    def describe(self) -> str:
        return "; ".join(f"{self.location}: {e}" for e in self.errors)

    def lines(self) -> list[str]:
        return [f"{self.location}: {e}" for e in self.errors]
