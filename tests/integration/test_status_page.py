"""The status page, rendered by a real headless Chromium."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

from tests.integration.agent import NODE, container_state, pod_yaml, wait_for, write_pod

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,800",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is needed for this test: `make test` installs it"
    return path


def page(agent) -> str:  # type: ignore[no-untyped-def]
    status, body = agent.get("/")
    return body.decode() if status == 200 else ""


def test_status_page_lists_pods_and_events(start_agent, manifests: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "frontend", pod_yaml("frontend", "sleep 600"))
    write_pod(manifests, "crashy", pod_yaml("crashy", "exit 1"))
    agent = start_agent()
    wait_for(
        "frontend running", lambda: "running" in container_state(agent.pod("frontend"))["state"]
    )
    wait_for("crashy restarted", lambda: container_state(agent.pod("crashy"))["restartCount"] >= 1)
    # The charts need two of the collector's samples (every 10 s): a line needs two points.
    wait_for(
        "frontend charted",
        lambda: re.search(r'<svg class="spark mem"[^>]*>.*?<path d="M', page(agent)),
        timeout=40,
        interval=1,
    )

    profile = tmp_path / "chromium-profile"
    common = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [*common, "--dump-dom", agent.url + "/"], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert f"Node {NODE}" in html
    assert f"default/frontend-{NODE}" in html and f"default/crashy-{NODE}" in html
    assert ">Running<" in html
    assert "Started container main" in html  # an event
    assert 'http-equiv="refresh"' in html
    # Per running pod, a CPU and a memory chart with their latest values; the pressure conditions.
    frontend = html[html.index(f"default/frontend-{NODE}") :].split("</tr>", 1)[0]
    assert re.search(r'<svg class="spark cpu".*?<path d="M[^"]+"', frontend), frontend
    assert re.search(r'<svg class="spark mem".*?<path d="M[^"]+"', frontend), frontend
    assert re.search(r"CPU \d+m", frontend) and re.search(r"memory \d+Mi", frontend)
    for condition in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        assert f'<td>{condition}</td><td class="ok">False</td>' in html

    shot = tmp_path / "status.png"
    result = subprocess.run(
        [*common, f"--screenshot={shot}", agent.url + "/"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 800)
    assert len(data) > 10_000  # a rendered page, not a blank one
