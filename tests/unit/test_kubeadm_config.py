"""The KubeletConfiguration `kubeadm join` writes (/var/lib/kubelet/config.yaml, kubeadm 1.32,
verbatim in tests/data) is accepted as a whole: what is implemented takes effect with the
kubelet's defaults for its zero values, what means nothing here is reported as ignored with
why, and a value that would change what the user gets is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pykubelet.cmd import config_file
from pykubelet.cmd.cli import parse_options

KUBEADM = Path(__file__).parent.parent / "data" / "kubeadm-1.32-kubelet-config.yaml"
# Fields the DNS branch implements (clusterDNS, clusterDomain, resolvConf): ignored here until
# it is merged; the merge drops them from config_file.IGNORED and from this set.
IMPLEMENTED = {
    "apiVersion", "kind", "authentication", "authorization", "containerRuntimeEndpoint",
    "fileCheckFrequency", "httpCheckFrequency", "logging", "staticPodPath",
    "streamingConnectionIdleTimeout", "syncFrequency", "clusterDNS", "clusterDomain",
    "volumeStatsAggPeriod",
    "resolvConf", "imageMinimumGCAge", "evictionPressureTransitionPeriod", "rotateCertificates",
}  # fmt: skip


def test_every_field_of_kubeadms_file_is_implemented_or_ignored_with_a_reason() -> None:
    fields = set(yaml.safe_load(KUBEADM.read_text()))
    config = config_file.load(KUBEADM)
    ignored = {note.split(":", 1)[0] for note in config_file.ignored_fields(config)}
    assert fields - IMPLEMENTED == {f for f in ignored if not f.startswith("logging.")}
    assert ignored >= {"logging.flushFrequency", "logging.options"}
    for note in config_file.ignored_fields(config):
        _, _, why = note.partition(": ignored: ")
        assert why and len(why) > 20, note


def test_kubeadms_file_takes_effect_with_the_kubelets_defaults() -> None:
    opts = parse_options(["--config", str(KUBEADM), "--kubeconfig", "/etc/kubernetes/kubelet.conf"])
    assert opts.pod_manifest_path == Path("/etc/kubernetes/manifests")
    assert opts.client_ca_file == Path("/etc/kubernetes/pki/ca.crt")
    assert opts.authentication_token_webhook is True and opts.anonymous_auth is False
    assert opts.authorization_mode == "Webhook"
    # 0s in the file: the kubelet's defaults (SetDefaults_KubeletConfiguration).
    assert opts.sync_frequency == 60.0
    assert opts.file_check_frequency == 20.0 and opts.http_check_frequency == 20.0
    assert opts.streaming_connection_idle_timeout == 4 * 3600.0
    assert opts.authentication_token_webhook_cache_ttl == 120.0
    assert opts.authorization_webhook_cache_authorized_ttl == 300.0
    assert opts.authorization_webhook_cache_unauthorized_ttl == 30.0
    assert opts.container_runtime_endpoint is None  # "": the runtime's default
    assert opts.rotate_certificates is True  # kubeadm's rotateCertificates: true
    assert not any(n.startswith("rotateCertificates") for n in opts.ignored_config_fields)


def kubeadm_with(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(KUBEADM.read_text())
    data.update(changes)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"shutdownGracePeriod": "30s"},
            "shutdownGracePeriod: graceful node shutdown is not implemented: only 0s",
        ),
        ({"memorySwap": {"swapBehavior": "LimitedSwap"}}, "memorySwap: swapBehavior: only NoSwap"),
        ({"cgroupDriver": "cgroupsfs"}, "cgroupDriver: must be systemd or cgroupfs"),
        ({"nodeStatusUpdateFrequency": "1m"}, "nodeStatusUpdateFrequency: only the default 10s"),
        ({"cpuManagerPolicy": "static"}, "cpuManagerPolicy: only none is supported"),
        (
            {"crashLoopBackOff": {"maxContainerRestartPeriod": "1m"}},
            "crashLoopBackOff: maxContainerRestartPeriod: only the default 5m",
        ),
        ({"cgroupDrivr": "systemd"}, "cgroupDrivr: unknown field"),
        (
            {"registerWithTaints": [{"key": "a", "effect": "Sometimes"}]},
            "registerWithTaints: invalid taint effect: Sometimes, unsupported taint effect",
        ),
    ],
)
def test_what_would_change_what_the_user_gets_is_refused(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(config_file.ConfigFileError) as exc:
        config_file.load(kubeadm_with(tmp_path, **changes))
    assert message in str(exc.value)
    assert str(exc.value).startswith(str(tmp_path / "config.yaml"))


def test_defaults_spelled_out_are_accepted(tmp_path: Path) -> None:
    config_file.load(
        kubeadm_with(
            tmp_path,
            shutdownGracePeriod="0s",
            memorySwap={"swapBehavior": "NoSwap"},
            nodeStatusUpdateFrequency="10s",
            cgroupDriver="cgroupfs",
            cpuManagerPolicy="none",
            serverTLSBootstrap=False,
            crashLoopBackOff={"maxContainerRestartPeriod": "5m"},
        )
    )


def test_a_flag_still_wins_over_the_file() -> None:
    opts = parse_options(["--config", str(KUBEADM), "--sync-frequency", "5s", "--kubeconfig", "k"])
    assert opts.sync_frequency == 5.0
