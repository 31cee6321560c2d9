"""Test doubles for what sits outside the unit under test (the kubelet's fake_runtime_service)."""

from tests.fakes.runtime import Behaviour, Call, FakeRuntime

__all__ = ["Behaviour", "Call", "FakeRuntime"]
