from __future__ import annotations

from pathlib import Path

import pytest

from pykubelet.cmd import config_file
from pykubelet.cmd.cli import parse_options


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kubelet.yaml"
    path.write_text(text)
    return path


def test_round_trip_to_options(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        config_file.dump(
            {
                "staticPodPath": "/etc/kubernetes/manifests",
                "staticPodURL": "http://config.example/pods",
                "staticPodURLHeader": {"Authorization": ["Bearer a:b"], "X-Node": ["n1", "n2"]},
                "fileCheckFrequency": "5s",
                "httpCheckFrequency": "1m",
                "syncFrequency": "30s",
                "streamingConnectionIdleTimeout": "30m",
                "address": "0.0.0.0",
                "readOnlyPort": 10266,
                "maxPods": 50,
                "podPidsLimit": 20,
                "logging": {"format": "logfmt", "verbosity": 4},
            }
        ),
    )
    opts = parse_options(["--config", str(path)])
    assert str(opts.pod_manifest_path) == "/etc/kubernetes/manifests"
    assert opts.manifest_url == "http://config.example/pods"
    assert opts.manifest_url_headers == [
        ("Authorization", "Bearer a:b"),
        ("X-Node", "n1"),
        ("X-Node", "n2"),
    ]
    assert (opts.file_check_frequency, opts.http_check_frequency, opts.sync_frequency) == (
        5,
        60,
        30,
    )
    assert (opts.address, opts.read_only_port, opts.max_pods) == ("0.0.0.0", 10266, 50)
    assert (opts.log_format, opts.verbosity) == ("logfmt", 4)
    assert opts.pod_max_pids == 20
    assert opts.streaming_connection_idle_timeout == 1800


def test_flags_win(tmp_path: Path) -> None:
    path = write(tmp_path, config_file.dump({"readOnlyPort": 1, "syncFrequency": "30s"}))
    opts = parse_options(["--config", str(path), "--read-only-port", "0"])
    assert opts.read_only_port == 0 and opts.sync_frequency == 30
    path = write(tmp_path, config_file.dump({"podPidsLimit": 100}))
    assert parse_options(["--config", str(path), "--pod-max-pids", "7"]).pod_max_pids == 7
    assert parse_options(["--config", str(path)]).pod_max_pids == 100
    assert parse_options([]).pod_max_pids == -1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("kind: KubeletConfiguration\n", "apiVersion: required"),
        (config_file.dump({"maxPods": 0}), "maxPods: Input should be greater than or equal to 1"),
        (config_file.dump({"readOnlyPort": "x"}), "readOnlyPort: Input should be a valid integer"),
        (config_file.dump({"logging": {"format": "xml"}}), "logging.format:"),
        (
            config_file.dump({"staticPodURLHeader": {"A": "b"}}),
            "staticPodURLHeader.A: Input should be a valid list",
        ),
        (
            config_file.dump({"serializeImagePulls": True}),
            "serializeImagePulls: not supported by pykubelet yet",
        ),
        ("- a\n", "expected a KubeletConfiguration object"),
        ("a: [", "invalid YAML"),
    ],
)
def test_rejects_bad_fields(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(config_file.ConfigFileError) as info:
        config_file.load(path)
    assert expected in str(info.value) and str(path) in str(info.value)


def test_garbage_collection_and_log_rotation_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fields = {
        "imageGCHighThresholdPercent": 90,
        "imageGCLowThresholdPercent": 70,
        "imageMinimumGCAge": "5m",
        "containerLogMaxSize": "1Mi",
        "containerLogMaxFiles": 3,
        "containerLogMonitorInterval": "5s",
    }
    path = write(tmp_path, config_file.dump(fields))
    opts = parse_options(["--config", str(path)])
    assert (opts.image_gc_high_threshold, opts.image_gc_low_threshold) == (90, 70)
    assert opts.image_minimum_gc_age == 300
    assert (opts.container_log_max_size, opts.container_log_max_files) == (1 << 20, 3)
    assert opts.container_log_monitor_interval == 5
    served = opts.kubelet_configuration()
    assert {k: served[k] for k in fields} == {**fields, "containerLogMaxSize": str(1 << 20)}
    defaults = parse_options([])
    assert (defaults.image_gc_high_threshold, defaults.image_gc_low_threshold) == (85, 80)
    assert defaults.maximum_dead_containers_per_container == 1
    assert defaults.maximum_dead_containers == -1
    # The kubelet's validation of the thresholds.
    with pytest.raises(SystemExit):
        parse_options(["--image-gc-high-threshold", "50", "--image-gc-low-threshold", "50"])
    assert (
        "imageGCLowThresholdPercent (50) must be less than imageGCHighThresholdPercent (50)"
        in capsys.readouterr().err
    )


def test_api_client_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    defaults = parse_options([])
    assert (defaults.kube_api_qps, defaults.kube_api_burst) == (50, 100)
    assert (defaults.event_qps, defaults.event_burst) == (50, 100)
    assert defaults.config_map_and_secret_change_detection_strategy == "Watch"
    fields = {
        "kubeAPIQPS": 200,
        "kubeAPIBurst": 400,
        "eventRecordQPS": 0,
        "eventBurst": 10,
        "configMapAndSecretChangeDetectionStrategy": "Get",
    }
    path = write(tmp_path, config_file.dump(fields))
    opts = parse_options(["--config", str(path), "--kube-api-burst", "300"])
    assert (opts.kube_api_qps, opts.kube_api_burst) == (200, 300)  # the flag wins
    assert (opts.event_qps, opts.event_burst) == (0, 10)  # 0: no limit on events
    served = opts.kubelet_configuration()
    assert {k: served[k] for k in fields} == {**fields, "kubeAPIBurst": 300}
    for body, flags, message in (
        (
            {"configMapAndSecretChangeDetectionStrategy": "Cache"},
            [],
            "configMapAndSecretChangeDetectionStrategy: 'Cache': not supported by pykubelet",
        ),
        (
            {"configMapAndSecretChangeDetectionStrategy": "Poll"},
            [],
            "configMapAndSecretChangeDetectionStrategy: 'Poll': must be Watch or Get",
        ),
        ({}, ["--kube-api-qps", "0"], "--kube-api-qps: must be greater than 0"),
        ({}, ["--event-qps", "-1"], "--event-qps: must not be negative (0: no limit)"),
    ):
        path = write(tmp_path, config_file.dump(body))
        with pytest.raises(SystemExit):
            parse_options(["--config", str(path), *flags])
        assert message in capsys.readouterr().err
