"""The PLEG: events from relists, and a stop that is never lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pykubelet.api.model import Pod
from pykubelet.kubelet.pleg import PLEG, EventType
from pykubelet.runtime.base import ContainerConfig
from pykubelet.runtime.process.runtime import ProcessRuntime


def pod() -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "uid1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
    )


async def test_started_and_died_events(tmp_path: Path) -> None:
    runtime = ProcessRuntime(tmp_path)
    await runtime.start()
    pleg = PLEG(runtime, period=10)  # only the runtime's pokes make it relist this soon
    task = asyncio.create_task(pleg.run())
    try:
        sandbox = await runtime.run_sandbox(pod())
        config = ContainerConfig(
            "c", "i", ["/bin/sh", "-c", "sleep 1"], [], [], None, 0, "h", "IfNotPresent"
        )
        await runtime.start_container(pod(), sandbox, config)
        first = await asyncio.wait_for(pleg.events.get(), 5)
        assert first.type is EventType.CONTAINER_STARTED and first.pod_uid == "uid1"
        second = await asyncio.wait_for(pleg.events.get(), 5)
        assert second.type is EventType.CONTAINER_DIED
    finally:
        task.cancel()
        await runtime.remove_pod("uid1")
        await runtime.close()


async def test_cancel_is_not_lost_while_the_runtime_keeps_poking(tmp_path: Path) -> None:
    # A regression: with asyncio.wait_for (3.11), a cancellation that arrived as a poke came in
    # was swallowed and the agent never stopped while containers were exiting.
    runtime = ProcessRuntime(tmp_path)
    await runtime.start()
    for _ in range(200):
        pleg = PLEG(runtime, period=10)
        task = asyncio.create_task(pleg.run())
        for _ in range(3):
            pleg._on_runtime_change("uid")
            await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(pleg._on_runtime_change, "uid")
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1)
        assert done, "PLEG did not stop after cancel"
    await runtime.close()


async def test_a_change_looks_at_its_pod_alone_and_keeps_the_gauges(tmp_path: Path) -> None:
    from pykubelet.common import metrics

    runtime = ProcessRuntime(tmp_path)
    await runtime.start()
    pleg = PLEG(runtime, period=10)
    listed: list[str] = []
    real_list = runtime.list_pods

    async def counted_list():  # type: ignore[no-untyped-def]
        listed.append("list")
        return await real_list()

    runtime.list_pods = counted_list  # type: ignore[method-assign]
    task = asyncio.create_task(pleg.run())
    try:
        sandbox = await runtime.run_sandbox(pod())
        config = ContainerConfig(
            "c", "i", ["/bin/sh", "-c", "sleep 0.2"], [], [], None, 0, "h", "IfNotPresent"
        )
        await runtime.start_container(pod(), sandbox, config)
        first = await asyncio.wait_for(pleg.events.get(), 5)
        assert first.type is EventType.CONTAINER_STARTED
        assert metrics.running_pods._value.get() == 1
        second = await asyncio.wait_for(pleg.events.get(), 5)
        assert second.type is EventType.CONTAINER_DIED and second.container_id == first.container_id
        assert metrics.running_pods._value.get() == 0
        assert metrics.running_containers.labels("exited")._value.get() == 1
        assert listed == ["list"]  # the one at start, and no other within the period
        await runtime.remove_pod("uid1")
        await pleg.relist()
        third = await asyncio.wait_for(pleg.events.get(), 5)
        assert third.type is EventType.CONTAINER_REMOVED
        assert metrics.running_containers.labels("exited")._value.get() == 0
    finally:
        task.cancel()
        await runtime.close()
