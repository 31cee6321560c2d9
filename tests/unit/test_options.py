from __future__ import annotations

import pytest

from pykubelet.cmd.cli import parse_options
from pykubelet.common.options import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20s", 20),
        ("1m30s", 90),
        ("500ms", 0.5),
        ("1h", 3600),
        ("0", 0),
        ("1.5s", 1.5),
        ("2m", 120),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "20", "s", "1x", "1m30", "soon", "1 s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(90) == "1m30s" and format_duration(20) == "20s"
    assert format_duration(0.5) == "0.5s" and format_duration(0) == "0s"


def test_defaults_are_the_kubelets() -> None:
    opts = parse_options([])
    assert opts.file_check_frequency == 20 and opts.sync_frequency == 60
    assert opts.address == "127.0.0.1" and opts.read_only_port == 10255
    assert opts.container_runtime == "process" and opts.node_name
    assert opts.streaming_connection_idle_timeout == 4 * 3600
    assert opts.kubelet_configuration()["streamingConnectionIdleTimeout"] == "4h"


def test_flags() -> None:
    opts = parse_options(
        [
            "--node-name",
            "n1",
            "--pod-manifest-path",
            "/etc/m",
            "--file-check-frequency",
            "1s",
            "--sync-frequency",
            "1m30s",
            "--read-only-port",
            "0",
            "--keep-pods-on-exit",
        ]
    )
    assert opts.node_name == "n1" and str(opts.pod_manifest_path) == "/etc/m"
    assert opts.file_check_frequency == 1 and opts.sync_frequency == 90
    assert opts.read_only_port == 0 and opts.keep_pods_on_exit is True


def test_the_streaming_idle_timeout_takes_a_go_duration() -> None:
    opts = parse_options(["--streaming-connection-idle-timeout", "1m30s"])
    assert opts.streaming_connection_idle_timeout == 90
    assert opts.kubelet_configuration()["streamingConnectionIdleTimeout"] == "1m30s"
    assert parse_options(["--streaming-connection-idle-timeout", "0"]).validate() == []


def test_a_negative_streaming_idle_timeout_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_options(["--streaming-connection-idle-timeout=-1s"])
    assert info.value.code == 2
    assert "--streaming-connection-idle-timeout: must not be negative" in capsys.readouterr().err


def test_bad_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_options(["--sync-frequency", "0s"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--sync-frequency: must be greater than 0" in err
