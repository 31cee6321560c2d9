"""When each kind of probe first runs after its container starts, as the kubelet's probe worker
runs them: readiness at once (after initialDelaySeconds), liveness and startup on the first
tick of their period that is past the initial delay."""

from __future__ import annotations

import pytest

from pykubelet.api.model import ExecAction, Probe
from pykubelet.probes.prober import first_probe_after


def probe(delay: int, period: int) -> Probe:
    return Probe(
        exec=ExecAction(command=["true"]), initial_delay_seconds=delay, period_seconds=period
    )


@pytest.mark.parametrize(
    ("delay", "period", "readiness", "others"),
    [
        (0, 10, 0.0, 10.0),  # a server gets a whole period to listen before liveness asks
        (0, 1, 0.0, 1.0),
        (5, 10, 5.0, 10.0),  # the delay ends between ticks: the next tick
        (10, 10, 10.0, 10.0),
        (15, 10, 15.0, 20.0),
        (3, 1, 3.0, 3.0),
    ],
)
def test_the_first_probe_of_each_kind(
    delay: int, period: int, readiness: float, others: float
) -> None:
    assert first_probe_after("readiness", probe(delay, period)) == readiness
    assert first_probe_after("liveness", probe(delay, period)) == others
    assert first_probe_after("startup", probe(delay, period)) == others
