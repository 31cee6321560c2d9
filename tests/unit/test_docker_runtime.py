"""DockerRuntime against a scripted engine (an aiohttp server on a unix socket) that behaves as
Podman 4.3 was measured to: infra containers outlive their members' removal only in order,
names conflict with HTTP 500, events carry no labels. Plus the pure helpers, and the exec
streams against the real engine (the session's private Podman, as tests/integration has it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pykubelet.api.model import Pod
from pykubelet.api.quantity import parse_quantity
from pykubelet.runtime.base import (
    LABEL_POD_UID,
    STDERR,
    STDOUT,
    ContainerConfig,
    ContainerRunState,
    ExecStream,
    Mount,
    RuntimeContainer,
    RuntimeFailure,
    StartError,
    TerminalSize,
)
from pykubelet.runtime.docker.convert import (
    LABEL_TYPE,
    LogDemuxer,
    container_body,
    event_kind,
    parse_time,
    resource_limits,
    sandbox_body,
    tail_offset,
)
from pykubelet.runtime.docker.runtime import DockerRuntime
from pykubelet.runtime.sandbox.engine import Kind
from pykubelet.runtime.sandbox.naming import normalize_endpoint

TIMEOUT = 5.0


def make_pod(name: str = "web", **spec: Any) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": uuid.uuid4().hex},
            "spec": {"containers": [{"name": "c", "image": "busybox:test"}], **spec},
        }
    )


def config(
    *args: str,
    command: list[str] | None = None,
    name: str = "c",
    attempt: int = 0,
    image: str = "busybox:test",
    policy: str = "IfNotPresent",
    limits: dict[str, str] | None = None,
    env: list[tuple[str, str]] | None = None,
) -> ContainerConfig:
    return ContainerConfig(
        name=name,
        image=image,
        command=command if command is not None else [],
        args=list(args),
        env=env or [],
        working_dir=None,
        attempt=attempt,
        spec_hash="h1",
        image_pull_policy=policy,
        limits=limits or {},
    )


async def wait_until(pred: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not pred():  # noqa: ASYNC110 - polls state owned by the code under test
            await asyncio.sleep(0.01)


async def settle(fake: FakeEngine) -> None:
    """Until the runtime has taken in the events sent so far (it inspects on some)."""
    await wait_until(fake.events.empty, "events read")
    await asyncio.sleep(0.1)


# --- pure helpers -------------------------------------------------------------------------------


def test_quantities() -> None:
    assert parse_quantity("128Mi") == 128 * 1024 * 1024
    assert parse_quantity("500m") * 1000 == 500
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("1E") == 10**18
    assert parse_quantity("2k") == 2000
    with pytest.raises(ValueError):
        parse_quantity("12 apples")


def test_resource_limits_as_the_kubelet_sets_them() -> None:
    assert resource_limits({"memory": "64Mi", "cpu": "250m"}) == {
        "Memory": 64 << 20,
        "MemorySwap": 64 << 20,
        "CpuPeriod": 100_000,
        "CpuQuota": 25_000,
        "CpuShares": 256,
    }
    assert resource_limits({"cpu": "1m"})["CpuQuota"] == 1_000  # the engines' minimum
    assert resource_limits({}) == {}


def test_cpu_shares_come_from_the_request() -> None:
    assert resource_limits({"cpu": "1"}, {"cpu": "250m"})["CpuShares"] == 256
    assert resource_limits({}, {"cpu": "100m"}) == {"CpuShares": 102}
    assert resource_limits({"memory": "1Gi"}, {"cpu": "1m"})["CpuShares"] == 2  # the minimum


def test_mounts_users_and_pids_limit_in_the_create_request() -> None:
    cfg = dataclasses.replace(
        config(),
        mounts=[Mount("/srv/data", "/data"), Mount("/etc/app.conf", "/app.conf", read_only=True)],
        run_as_user=1000,
        run_as_group=3000,
        supplemental_groups=[4000, 4001],
        read_only_root_filesystem=True,
        privileged=True,
    )
    body = container_body(make_pod(), "i", cfg, podman=True, pids_limit=20)
    host = body["HostConfig"]
    assert host["Binds"] == ["/srv/data:/data", "/etc/app.conf:/app.conf:ro"]
    assert body["User"] == "1000:3000" and host["GroupAdd"] == ["4000", "4001"]
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is True
    assert host["PidsLimit"] == 20
    plain = container_body(make_pod(), "i", config(), podman=True)
    assert "User" not in plain and "PidsLimit" not in plain["HostConfig"]
    assert "OpenStdin" not in plain and "Tty" not in plain
    stdio = dataclasses.replace(config(), stdin=True, stdin_once=True, tty=True)
    body = container_body(make_pod(), "i", stdio, podman=True)
    assert (body["OpenStdin"], body["StdinOnce"], body["Tty"]) == (True, True, True)
    assert "Binds" not in plain["HostConfig"] and "Privileged" not in plain["HostConfig"]
    assert (
        container_body(make_pod(), "i", dataclasses.replace(config(), run_as_user=0), podman=True)[
            "User"
        ]
        == "0"
    )

    for bad in (
        dataclasses.replace(config(), run_as_group=5),
        dataclasses.replace(config(), mounts=[Mount("/a:b", "/c")]),
        dataclasses.replace(config(), mounts=[Mount("relative", "/c")]),
    ):
        with pytest.raises(StartError) as err:
            container_body(make_pod(), "i", bad, podman=True)
        assert err.value.reason == "CreateContainerConfigError"


def test_command_and_args_follow_kubernetes() -> None:
    pod = make_pod()
    body = container_body(pod, "infra", config("a", command=["/bin/sh"]), podman=False)
    assert body["Entrypoint"] == ["/bin/sh"] and body["Cmd"] == ["a"]
    # A command alone drops the image's cmd too.
    body = container_body(pod, "infra", config(command=["/bin/true"]), podman=False)
    assert body["Entrypoint"] == ["/bin/true"] and body["Cmd"] == []
    body = container_body(pod, "infra", config("x"), podman=False)
    assert "Entrypoint" not in body and body["Cmd"] == ["x"]
    body = container_body(pod, "infra", config(), podman=False)
    assert "Entrypoint" not in body and "Cmd" not in body


def test_containers_join_the_infra_namespaces() -> None:
    pod = make_pod()
    docker = container_body(pod, "abc", config(), podman=False)["HostConfig"]
    assert docker["NetworkMode"] == docker["IpcMode"] == "container:abc"
    assert "UTSMode" not in docker  # Docker shares it with the network and rejects it
    podman = container_body(pod, "abc", config(), podman=True)["HostConfig"]
    assert podman["UTSMode"] == "container:abc"


def test_env_keeps_first_position_last_value() -> None:
    env = [("A", "1"), ("B", "2"), ("A", "3")]
    body = container_body(make_pod(), "i", config(env=env), podman=False)
    assert body["Env"] == ["A=3", "B=2"]


def test_bad_limit_is_a_config_error() -> None:
    with pytest.raises(StartError) as err:
        container_body(make_pod(), "i", config(limits={"memory": "lots"}), podman=False)
    assert err.value.reason == "CreateContainerConfigError"


def test_sandbox_publishes_the_host_ports_of_every_container() -> None:
    pod = make_pod(
        containers=[
            {"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]},
            {
                "name": "b",
                "image": "x",
                "ports": [
                    {"containerPort": 53, "hostPort": 5353, "protocol": "UDP"},
                    {"containerPort": 9000},
                ],
            },
        ]
    )
    body = sandbox_body(pod, "pause", 0)
    assert body["Hostname"] == "web"
    assert body["ExposedPorts"] == {"80/tcp": {}, "53/udp": {}}
    assert body["HostConfig"]["PortBindings"] == {
        "80/tcp": [{"HostIp": "", "HostPort": "8080"}],
        "53/udp": [{"HostIp": "", "HostPort": "5353"}],
    }
    assert body["HostConfig"]["IpcMode"] == "shareable"
    host = sandbox_body(make_pod(hostNetwork=True), "pause", 0)
    assert host["HostConfig"]["NetworkMode"] == "host" and "Hostname" not in host


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def test_log_demuxer_handles_frames_split_anywhere() -> None:
    raw = _frame(1, b"one\n") + _frame(2, b"two\n") + _frame(1, b"three")
    for cut in range(len(raw) + 1):
        demux = LogDemuxer()
        assert demux.feed(raw[:cut]) + demux.feed(raw[cut:]) == b"one\ntwo\nthree"
    assert LogDemuxer().feed(b"plain text") == b"plain text"  # a TTY's log is not framed


def test_log_demuxer_rewrites_each_frames_time_as_the_kubelet_prints_it() -> None:
    raw = (
        _frame(1, b"2026-12-03T15:09:19Z part")  # Podman 4.3: whole seconds
        + _frame(2, b"2026-12-03T15:09:20.2284595Z three\n")  # Docker: RFC3339Nano, trimmed
        + _frame(1, b"no time here\n")
    )
    for cut in range(len(raw) + 1):
        demux = LogDemuxer(retime=True)
        assert demux.feed(raw[:cut]) + demux.feed(raw[cut:]) == (
            b"2026-12-03T15:09:19.000000000Z part"
            b"2026-12-03T15:09:20.228459500Z three\n"
            b"no time here\n"
        )


def test_tail_offset() -> None:
    data = b"a\nb\nc\n"
    assert data[tail_offset(data, 1) :] == b"c\n"
    assert data[tail_offset(data, 2) :] == b"b\nc\n"
    assert data[tail_offset(data, 9) :] == data
    assert b"a\nb"[tail_offset(b"a\nb", 1) :] == b"b"
    assert tail_offset(data, 0) == len(data)


def test_times_and_endpoints() -> None:
    t = parse_time("2026-12-02T17:50:55.293400693Z")
    assert t is not None and t.microsecond == 293400 and t.utcoffset() is not None
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert normalize_endpoint("/var/run/docker.sock") == "unix:///var/run/docker.sock"
    assert normalize_endpoint("unix:///x.sock") == "unix:///x.sock"


# --- a scripted engine --------------------------------------------------------------------------


@dataclass
class FakeContainer:
    id: str
    name: str
    body: dict[str, Any]
    status: str = "created"
    exit_code: int = 0
    pid: int = 0
    log: bytes = b""

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.body.get("Labels") or {})

    def inspect(self) -> dict[str, Any]:
        return {
            "Id": self.id,
            "Name": "/" + self.name,
            "Created": "2026-01-01T00:00:00.000000001Z",
            "Image": "sha256:feed",
            "Config": {"Labels": self.labels, "Image": self.body.get("Image"), "Tty": False},
            "State": {
                "Status": self.status,
                "Running": self.status == "running",
                "Pid": self.pid if self.status == "running" else 0,
                "ExitCode": self.exit_code,
                "OOMKilled": False,
                "Error": "",
                "StartedAt": "2026-01-01T00:00:01Z"
                if self.status != "created"
                else "0001-01-01T00:00:00Z",
                "FinishedAt": "2026-01-01T00:00:02Z"
                if self.status == "exited"
                else "0001-01-01T00:00:00Z",
            },
            "HostConfig": self.body.get("HostConfig") or {},
            "NetworkSettings": {"IPAddress": "10.88.0.9" if self.status == "running" else ""},
        }


@dataclass
class FakeEngine:
    images: set[str] = field(default_factory=lambda: {"busybox:test", "pause:test"})
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    fail_start: str | None = None
    pull_error: str | None = None

    def emit(self, action: str, c: FakeContainer) -> None:
        # As Podman 4.3: no labels in the attributes.
        self.events.put_nowait(
            {
                "status": action,
                "id": c.id,
                "Type": "container",
                "Action": action,
                "Actor": {"ID": c.id, "Attributes": {"name": c.name}},
            }
        )

    def add(self, name: str, labels: dict[str, str], status: str) -> FakeContainer:
        c = FakeContainer(uuid.uuid4().hex * 2, name, {"Labels": labels}, status=status, pid=4242)
        self.containers[c.id] = c
        return c

    def find(self, ref: str) -> FakeContainer | None:
        if ref in self.containers:
            return self.containers[ref]
        return next((c for c in self.containers.values() if c.name == ref), None)

    def app(self) -> web.Application:
        routes = web.RouteTableDef()

        def err(status: int, message: str) -> web.Response:
            return web.json_response({"message": message}, status=status)

        @routes.get("/_ping")
        async def ping(request: web.Request) -> web.Response:
            # What Podman 4.3 says; Docker has no Libpod-Api-Version.
            headers = {"Api-Version": "1.41", "Libpod-Api-Version": "4.3.1"}
            return web.Response(text="OK", headers={**headers, "Server": "Libpod/4.3.1 (linux)"})

        @routes.get("/v1.41/events")
        async def events(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            while True:
                event = await self.events.get()
                await resp.write(json.dumps(event).encode() + b"\n")

        @routes.get("/v1.41/containers/json")
        @routes.get("/v1.41/libpod/containers/json")
        async def list_(request: web.Request) -> web.Response:
            self.calls.append("list")
            wanted = json.loads(request.query.get("filters", "{}")).get("label", [])
            rows = []
            for c in self.containers.values():
                ok = True
                for f in wanted:
                    key, _, value = f.partition("=")
                    if key not in c.labels or (value and c.labels[key] != value):
                        ok = False
                if ok:
                    rows.append({"Id": c.id, "State": c.status, "Labels": c.labels})
            return web.json_response(rows)

        @routes.get("/v1.41/containers/{id}/json")
        async def inspect(request: web.Request) -> web.Response:
            self.calls.append("inspect")
            c = self.find(request.match_info["id"])
            return web.json_response(c.inspect()) if c else err(404, "no such container")

        @routes.post("/v1.41/containers/create")
        async def create(request: web.Request) -> web.Response:
            self.calls.append("create")
            body = await request.json()
            name = request.query["name"]
            if self.find(name):
                return err(500, f'the container name "{name}" is already in use')
            if body["Image"] not in self.images:
                return err(404, "no such image")
            c = FakeContainer(uuid.uuid4().hex * 2, name, body)
            self.containers[c.id] = c
            self.emit("create", c)
            return web.json_response({"Id": c.id}, status=201)

        @routes.post("/v1.41/libpod/containers/{id}/init")
        async def init(request: web.Request) -> web.Response:
            self.calls.append("init")
            return web.Response(status=204)

        @routes.post("/v1.41/containers/{id}/start")
        async def start(request: web.Request) -> web.Response:
            self.calls.append("start")
            c = self.find(request.match_info["id"])
            if c is None:
                return err(404, "no such container")
            if self.fail_start:
                return err(500, self.fail_start)
            c.status, c.pid = "running", 4242
            self.emit("start", c)
            return web.Response(status=204)

        @routes.post("/v1.41/containers/{id}/stop")
        async def stop(request: web.Request) -> web.Response:
            self.calls.append("stop")
            c = self.find(request.match_info["id"])
            if c is None:
                return err(404, "no such container")
            if c.status == "running":
                c.status, c.exit_code = "exited", 143
                self.emit("die", c)
            return web.Response(status=204)

        @routes.delete("/v1.41/containers/{id}")
        async def delete(request: web.Request) -> web.Response:
            self.calls.append("delete")
            c = self.find(request.match_info["id"])
            if c is None:
                return err(404, "no such container")
            if c.status == "running" and request.query.get("force") != "1":
                return err(409, "container is running")
            members = [
                m.id
                for m in self.containers.values()
                if (m.body.get("HostConfig") or {}).get("NetworkMode") == f"container:{c.id}"
            ]
            if members:
                return err(500, f"container {c.id} has dependent containers: {members}")
            del self.containers[c.id]
            self.emit("remove", c)
            return web.Response(status=204)

        @routes.get("/v1.41/images/{name:.+}/json")
        async def image(request: web.Request) -> web.Response:
            self.calls.append("image")
            name = request.match_info["name"]
            return web.json_response({"Id": name}) if name in self.images else err(404, "no image")

        @routes.post("/v1.41/images/create")
        async def pull(request: web.Request) -> web.Response:
            self.calls.append("pull")
            ref = request.query["fromImage"]
            if self.pull_error:
                return web.Response(
                    text=json.dumps(
                        {"error": self.pull_error, "errorDetail": {"message": self.pull_error}}
                    ),
                    content_type="application/json",
                )
            self.images.add(ref if ":" in ref else f"{ref}:{request.query.get('tag', 'latest')}")
            return web.Response(
                text=json.dumps({"status": "done"}), content_type="application/json"
            )

        @routes.get("/v1.41/containers/{id}/logs")
        async def logs(request: web.Request) -> web.Response:
            c = self.find(request.match_info["id"])
            return web.Response(body=c.log) if c else err(404, "no such container")

        app = web.Application()
        app.add_routes(routes)
        return app


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.1)
    await runner.setup()
    sock = str(tmp_path / "engine.sock")
    site = web.UnixSite(runner, sock)
    await site.start()
    yield fake, f"unix://{sock}"
    await runner.cleanup()


@pytest.fixture
async def runtime(
    engine: tuple[FakeEngine, str], tmp_path: Path
) -> AsyncIterator[tuple[DockerRuntime, FakeEngine]]:
    fake, url = engine
    rt = DockerRuntime(url, "pause:test", tmp_path)
    await rt.start()
    yield rt, fake
    await rt.close()


async def test_pod_lifecycle_and_cheap_relists(runtime: tuple[DockerRuntime, FakeEngine]) -> None:
    rt, fake = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    assert sandbox.ready and sandbox.ip == "10.88.0.9"
    assert (await rt.run_sandbox(pod)).id == sandbox.id  # the ready one is returned
    started = await rt.start_container(pod, sandbox, config("x", command=["/bin/sh"]))
    assert started.state is ContainerRunState.RUNNING and started.container_id.startswith(
        "docker://"
    )
    await settle(fake)
    fake.calls.clear()
    pods = await rt.list_pods()
    pods = await rt.list_pods()
    assert [p.uid for p in pods] == [pod.uid] and len(pods[0].containers) == 1
    assert fake.calls == ["list", "list"]  # nothing changed: nothing inspected

    await rt.stop_container(started, 2)
    got = await rt.get_pod(pod.uid)
    assert got is not None and got.containers[0].state is ContainerRunState.EXITED
    assert got.containers[0].reason == "Error" and got.containers[0].exit_code == 143
    await rt.remove_pod(pod.uid)
    assert fake.containers == {} and await rt.get_pod(pod.uid) is None


async def test_an_exit_reported_by_an_event_reaches_the_listener(
    runtime: tuple[DockerRuntime, FakeEngine],
) -> None:
    rt, fake = runtime
    seen: list[str] = []
    rt.add_listener(seen.append)
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, sandbox, config("x"))
    seen.clear()
    fc = fake.containers[c.id]
    fc.status, fc.exit_code = "exited", 0
    fake.emit("die", fc)
    await wait_until(lambda: pod.uid in seen, "listener called")
    got = await rt.get_pod(pod.uid)  # from the cache, refreshed by the event
    assert got is not None and got.containers[0].reason == "Completed"


async def test_relist_finds_what_events_missed(runtime: tuple[DockerRuntime, FakeEngine]) -> None:
    rt, fake = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, sandbox, config("x"))
    fake.containers[c.id].status = "exited"  # no event
    pods = await rt.list_pods()
    assert pods[0].containers[0].state is ContainerRunState.EXITED
    del fake.containers[c.id]  # removed behind our back, no event
    assert (await rt.list_pods())[0].containers == []


async def test_image_pull_policies(runtime: tuple[DockerRuntime, FakeEngine]) -> None:
    rt, fake = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    with pytest.raises(StartError) as err:
        await rt.start_container(pod, sandbox, config(image="absent:1", policy="Never"))
    assert err.value.reason == "ErrImageNeverPull"
    assert (
        err.value.message == 'Container image "absent:1" is not present with pull policy of Never'
    )
    assert "pull" not in fake.calls and "create" not in fake.calls[-1:]

    fake.pull_error = "pinging container registry: no such host"
    with pytest.raises(StartError) as err:
        await rt.start_container(pod, sandbox, config(image="absent:1"))
    assert err.value.reason == "ErrImagePull" and "no such host" in err.value.message

    fake.pull_error = None
    await settle(fake)
    fake.calls.clear()
    await rt.start_container(pod, sandbox, config(image="fresh:2"))
    assert fake.calls[:3] == ["image", "pull", "create"]
    await settle(fake)
    fake.calls.clear()
    await rt.start_container(pod, sandbox, config(name="d", image="fresh:2", policy="Always"))
    assert fake.calls[0] == "pull"  # Always pulls, even when present


async def test_failed_start_leaves_nothing(runtime: tuple[DockerRuntime, FakeEngine]) -> None:
    rt, fake = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    fake.fail_start = 'exec: "nope": executable file not found in $PATH'
    with pytest.raises(StartError) as err:
        await rt.start_container(pod, sandbox, config(command=["nope"]))
    assert err.value.reason == "RunContainerError" and "nope" in err.value.message
    assert [c.name for c in fake.containers.values()] == [f"k8s_POD_web_default_{pod.uid}_0"]


async def test_a_leftover_of_the_same_attempt_is_replaced(
    runtime: tuple[DockerRuntime, FakeEngine],
) -> None:
    rt, fake = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    name = f"k8s_c_web_default_{pod.uid}_0"
    fake.add(name, {"x": "not ours"}, "created")
    c = await rt.start_container(pod, sandbox, config())
    assert [x.id for x in fake.containers.values() if x.name == name] == [c.id]


async def test_running_containers_cannot_be_removed(
    runtime: tuple[DockerRuntime, FakeEngine],
) -> None:
    rt, _ = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, sandbox, config())
    with pytest.raises(RuntimeFailure):
        await rt.remove_container(c)


async def test_start_adopts_running_and_drops_never_started(
    engine: tuple[FakeEngine, str], tmp_path: Path
) -> None:
    fake, url = engine
    uid = "u1"
    base = {
        LABEL_POD_UID: uid,
        "io.kubernetes.pod.name": "p",
        "io.kubernetes.pod.namespace": "default",
    }
    infra = fake.add("k8s_POD_p", {**base, LABEL_TYPE: "podsandbox"}, "running")
    live = fake.add(
        "k8s_c_p", {**base, LABEL_TYPE: "container", "io.kubernetes.container.name": "c"}, "running"
    )
    fake.add(
        "k8s_d_p", {**base, LABEL_TYPE: "container", "io.kubernetes.container.name": "d"}, "created"
    )
    fake.add("someone-else", {"app": "x"}, "running")
    rt = DockerRuntime(url, "pause:test", tmp_path)
    await rt.start()
    try:
        pods = await rt.list_pods()
        assert len(pods) == 1 and pods[0].sandbox is not None and pods[0].sandbox.id == infra.id
        assert [c.id for c in pods[0].containers] == [live.id]
        assert {c.name for c in fake.containers.values()} == {
            "k8s_POD_p",
            "k8s_c_p",
            "someone-else",
        }
        # remove_pod goes by labels, members before the infra (Podman refuses the other order).
        await rt.remove_pod(uid)
        assert {c.name for c in fake.containers.values()} == {"someone-else"}
    finally:
        await rt.close()


async def test_unreachable_engine(tmp_path: Path) -> None:
    rt = DockerRuntime(f"unix://{tmp_path}/none.sock", "pause:test", tmp_path)
    with pytest.raises(RuntimeFailure, match="cannot reach the container engine"):
        await rt.start()


async def test_a_dead_sandbox_is_replaced_and_its_containers_stopped(
    runtime: tuple[DockerRuntime, FakeEngine],
) -> None:
    rt, fake = runtime
    pod = make_pod()
    first = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, first, config("x"))
    fake.containers[first.id].status = "exited"  # killed behind our back
    got = (await rt.list_pods())[0]
    assert got.sandbox is not None and not got.sandbox.ready
    second = await rt.run_sandbox(pod)
    assert second.id != first.id and second.ready
    assert fake.containers[second.id].name == f"k8s_POD_web_default_{pod.uid}_1"
    # Its containers lost their network with it: stopped, to be restarted in the new one.
    assert fake.containers[c.id].status == "exited"
    got = (await rt.list_pods())[0]
    assert got.sandbox is not None and got.sandbox.id == second.id
    await rt.remove_pod(pod.uid)
    assert fake.containers == {}


def test_event_kind_from_labels_or_our_names() -> None:
    assert event_kind({LABEL_TYPE: "podsandbox"}, by_name=False) is Kind.SANDBOX
    assert event_kind({LABEL_TYPE: "container"}, by_name=False) is Kind.CONTAINER
    assert event_kind({"name": "k8s_POD_web_default_u_0"}, by_name=False) is None  # Docker
    # Podman's events carry no labels: our names say what a container is.
    assert event_kind({"name": "k8s_POD_web_default_u_0"}, by_name=True) is Kind.SANDBOX
    assert event_kind({"name": "k8s_c_web_default_u_0"}, by_name=True) is Kind.CONTAINER
    assert event_kind({"name": "someone-else"}, by_name=True) is None


async def test_an_oom_event_makes_the_exit_oomkilled(
    runtime: tuple[DockerRuntime, FakeEngine],
) -> None:
    rt, fake = runtime
    pod = make_pod()
    sandbox = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, sandbox, config("x", limits={"memory": "16Mi"}))
    fc = fake.containers[c.id]
    fc.status, fc.exit_code = "exited", 137  # the engine itself says OOMKilled: false
    fake.emit("oom", fc)
    fake.emit("die", fc)
    await settle(fake)
    got = await rt.get_pod(pod.uid)
    assert got is not None and (got.containers[0].reason, got.containers[0].exit_code) == (
        "OOMKilled",
        137,
    )


async def test_a_start_event_finds_a_container_not_known_yet(
    runtime: tuple[DockerRuntime, FakeEngine],
) -> None:
    rt, fake = runtime
    seen: list[str] = []
    rt.add_listener(seen.append)
    labels = {
        LABEL_POD_UID: "u2",
        "io.kubernetes.pod.name": "p",
        "io.kubernetes.pod.namespace": "default",
        LABEL_TYPE: "container",
        "io.kubernetes.container.name": "c",
    }
    c = fake.add("k8s_c_p_default_u2_0", labels, "running")
    fake.emit("start", c)
    await wait_until(lambda: "u2" in seen, "listener called")
    got = await rt.get_pod("u2")  # from the cache: no relist
    assert got is not None and [x.id for x in got.containers] == [c.id]
    await settle(fake)
    fake.calls.clear()
    fake.emit("start", fake.add("someone-else", {"app": "x"}, "running"))
    await settle(fake)
    assert "inspect" not in fake.calls  # not named as ours: not looked at


# --- exec streams, against the real engine ------------------------------------------------------

REAL_TIMEOUT = 30.0
REAL_INFRA = os.environ.get("PYKUBELET_TEST_INFRA_IMAGE", "localhost/pause:test")
FOREVER = 'trap "exit 0" TERM; while :; do sleep 1 & wait; done'


@pytest.fixture
async def real(podman_endpoint: str, tmp_path: Path) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(podman_endpoint, REAL_INFRA, tmp_path)
    await rt.start()
    yield rt
    for pod in await rt.list_pods():
        await rt.remove_pod(pod.uid)
    await rt.close()


async def real_container(rt: DockerRuntime) -> RuntimeContainer:
    pod = make_pod("exec")
    sandbox = await rt.run_sandbox(pod)
    cfg = config("-c", FOREVER, command=["/bin/sh"], image="localhost/busybox:test", policy="Never")
    return await rt.start_container(pod, sandbox, cfg)


async def collect(stream: ExecStream) -> dict[str, bytes]:
    out = {STDOUT: b"", STDERR: b""}
    async with asyncio.timeout(REAL_TIMEOUT):
        async for name, data in stream.output():
            out[name] += data
    return out


async def read_until(stream: ExecStream, pattern: bytes) -> bytes:
    seen = b""
    async with asyncio.timeout(REAL_TIMEOUT):
        async for _, data in stream.output():
            seen += data
            if re.search(pattern, seen):
                return seen
    pytest.fail(f"{pattern!r} never came; got {seen!r}")


async def exit_code(stream: ExecStream) -> int | None:
    async with asyncio.timeout(REAL_TIMEOUT):
        return await stream.wait()


@pytest.mark.docker
async def test_exec_stream_keeps_stdout_and_stderr_apart_with_the_exit_code(
    real: DockerRuntime,
) -> None:
    c = await real_container(real)
    script = "echo out; echo err >&2; echo out again; exit 3"
    stream = await real.exec_stream(c, ["/bin/sh", "-c", script], [], stdin=False, tty=False)
    try:
        assert await collect(stream) == {STDOUT: b"out\nout again\n", STDERR: b"err\n"}
        assert await exit_code(stream) == 3
    finally:
        await stream.close()
    await stream.close()  # twice is fine


@pytest.mark.docker
async def test_exec_stream_stdin_and_its_eof(real: DockerRuntime) -> None:
    c = await real_container(real)
    stream = await real.exec_stream(c, ["cat"], [], stdin=True, tty=False)
    try:
        await stream.write_stdin(b"hello\n")
        assert await read_until(stream, b"hello\n") == b"hello\n"
        await stream.write_stdin(b"again")
        await stream.close_stdin()  # a half-close: cat reads its EOF and ends
        assert await collect(stream) == {STDOUT: b"again", STDERR: b""}
        assert await exit_code(stream) == 0
    finally:
        await stream.close()


@pytest.mark.docker
async def test_exec_stream_with_a_terminal_and_its_size(real: DockerRuntime) -> None:
    c = await real_container(real)
    script = "tty; read line; echo err >&2; stty size; exit 5"
    stream = await real.exec_stream(c, ["/bin/sh", "-c", script], [], stdin=True, tty=True)
    try:
        # Resized once it runs (the size it starts with is the next test's).
        seen = await read_until(stream, rb"/dev/pts/\d+\r\n")
        await stream.resize(100, 40)
        await stream.write_stdin(b"go\n")
        seen += await read_until(stream, rb"40 100\r\n")
        assert re.search(rb"/dev/pts/\d+\r\ngo\r\nerr\r\n40 100\r\n", seen), seen
        rest = await collect(stream)
        assert rest[STDERR] == b""  # a terminal has one stream
        assert await exit_code(stream) == 5
    finally:
        await stream.close()


@pytest.mark.docker
async def test_exec_stream_has_the_clients_terminal_size_from_the_start(
    real: DockerRuntime,
) -> None:
    c = await real_container(real)
    stream = await real.exec_stream(
        c, ["/bin/sh", "-c", "stty size"], [], stdin=False, tty=True, size=TerminalSize(132, 43)
    )
    try:
        assert (await collect(stream))[STDOUT] == b"43 132\r\n"
        assert await exit_code(stream) == 0
    finally:
        await stream.close()


@pytest.mark.docker
async def test_exec_stream_close_kills_the_command(real: DockerRuntime) -> None:
    c = await real_container(real)
    stream = await real.exec_stream(
        c, ["/bin/sh", "-c", "echo started; exec sleep 600"], [], stdin=False, tty=False
    )
    await read_until(stream, b"started\n")
    await stream.close()
    assert await exit_code(stream) == 137  # SIGKILL, as the engine reports it


@pytest.mark.docker
async def test_exec_stream_needs_a_running_container(real: DockerRuntime) -> None:
    c = await real_container(real)
    await real.stop_container(c, 5)
    with pytest.raises(RuntimeFailure, match="not running"):
        await real.exec_stream(c, ["true"], [], stdin=False, tty=False)
