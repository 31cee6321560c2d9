"""The kubelet's rules for one container: when it is restarted (its pod's restart policy, a
change of its spec's hash), how long it is given to stop, and the image pull policy it gets when
its spec names none."""

from __future__ import annotations

import hashlib
import json

from pykubelet.api.model import Container, Pod

# The kubelet never gives a container less than this to stop, whatever the pod asks.
MIN_GRACE_SECONDS = 2.0
DEFAULT_GRACE_SECONDS = 30.0


def spec_hash(container: Container) -> str:
    """A container is restarted when this changes (a spec update of an API pod)."""
    data = json.dumps(container.to_api(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def default_pull_policy(image: str) -> str:
    """The API's default when a container names none: Always for :latest or no tag, else
    IfNotPresent (a digest included)."""
    name = image.rsplit("/", 1)[-1]
    if "@" in name:
        return "IfNotPresent"
    tag = name.split(":", 1)[1] if ":" in name else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def should_restart(policy: str, exit_code: int | None) -> bool:
    """Whether a container that exited with `exit_code` is started again under the pod's
    restartPolicy."""
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return exit_code != 0
    return False


def grace_seconds(pod: Pod | None, override: float | None) -> float:
    """How long a container of `pod` is given to stop: `override` (a probe's, a kill's), else
    the deletion's grace period, else the pod's terminationGracePeriodSeconds; never less than
    MIN_GRACE_SECONDS."""
    if override is not None:
        grace = override
    elif pod is not None and pod.metadata.deletion_grace_period_seconds is not None:
        grace = float(pod.metadata.deletion_grace_period_seconds)
    elif pod is not None:
        grace = float(pod.spec.termination_grace_period_seconds)
    else:
        grace = DEFAULT_GRACE_SECONDS
    return max(grace, MIN_GRACE_SECONDS)
