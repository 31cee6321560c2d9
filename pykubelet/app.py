"""The composition root: builds the runtime, the pod sources, the kubelet, the read-only server
and, with --kubeconfig, the cluster layer; wires each to the narrow protocols it needs; runs them
until a signal; stops them in order (pods first, then the cluster's last statuses, the runtime
and the server).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pykubelet import __version__
from pykubelet.common import metrics, nodeip
from pykubelet.common.allocatable import (
    ENFORCE_KUBE_RESERVED,
    ENFORCE_PODS,
    ENFORCE_SYSTEM_RESERVED,
    NodeResources,
    node_resources,
)
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.common.gcpolicy import tune_collector
from pykubelet.common.heap import trim_heap_periodically
from pykubelet.common.machine import MachineFacts, read_machine_facts
from pykubelet.common.options import DEFAULT_ENDPOINTS, Options
from pykubelet.common.sdnotify import Notifier
from pykubelet.config.file import FileSource
from pykubelet.config.pod_config import PodConfig
from pykubelet.config.types import API_SOURCE, FILE_SOURCE, HTTP_SOURCE, NotificationMode
from pykubelet.kubelet.kubelet import Kubelet
from pykubelet.pod.volumes import NoApiServer, ObjectLookup, ObjectRegistry
from pykubelet.runtime.base import Runtime, RuntimeFailure
from pykubelet.runtime.instrumented import InstrumentedRuntime
from pykubelet.server.auth import (
    AlwaysAllow,
    Authenticator,
    Authorizer,
    ReviewError,
    WebhookAuthorizer,
)
from pykubelet.server.endpoints import HttpServer, build_app
from pykubelet.server.secure import build_secure_app
from pykubelet.server.stats import add_stats_routes
from pykubelet.server.tls import ServingConfig, ServingContext, TlsError
from pykubelet.stats.collector import StatsCollector
from pykubelet.status.manager import StatusManager

if TYPE_CHECKING:
    # Cluster mode's alone: imported where it starts, so that a node on its own does not hold
    # the API client's code (2 MiB of its idle memory).
    from pykubelet.client.kubeapi import KubeApi
    from pykubelet.cluster.connection import ApiConnection

log = logging.getLogger("pykubelet")

# File I/O (state files with fsync, logs, manifests) runs in this pool: the OS has no async
# file API. fsync waits on the disk, not the CPU, so more threads than cores pay off when
# hundreds of containers start or stop at once (measured: bench/profile.py).
IO_THREADS = 32


def make_runtime(opts: Options, host_ip: str, resources: NodeResources | None = None) -> Runtime:
    endpoint = opts.container_runtime_endpoint or DEFAULT_ENDPOINTS.get(opts.container_runtime, "")
    if opts.container_runtime == "remote":
        from pykubelet.runtime.cri.runtime import CriRuntime

        return CriRuntime(endpoint, opts.pod_infra_container_image, opts.root_dir, node_ip=host_ip)
    if opts.container_runtime == "docker":
        from pykubelet.runtime.docker.runtime import DockerRuntime

        return DockerRuntime(
            endpoint,
            opts.pod_infra_container_image,
            opts.root_dir,
            node_ip=host_ip,
            pod_pids_limit=opts.pod_max_pids,
        )
    from pykubelet.runtime.process.cgroups import PodsLimits, ReservedCgroup
    from pykubelet.runtime.process.runtime import ProcessRuntime

    limits = None
    if resources is not None:
        # kubepods: allocatable without the eviction threshold when `pods` is enforced (the
        # kubelet's getNodeAllocatableInternalAbsolute), else the node's capacity.
        enforced = ENFORCE_PODS in opts.enforce_node_allocatable
        size = resources.pods_cgroup if enforced else resources.capacity
        limits = PodsLimits(size["memory"], size["cpu"], size.get("pid") if enforced else None)
    reserved = tuple(
        ReservedCgroup(
            what,
            cgroup,
            PodsLimits(amounts.get("memory"), amounts.get("cpu"), amounts.get("pid")),
        )
        for key, what, cgroup, amounts in (
            (
                ENFORCE_SYSTEM_RESERVED,
                "System Reserved",
                opts.system_reserved_cgroup,
                opts.system_reserved.amounts,
            ),
            (
                ENFORCE_KUBE_RESERVED,
                "Kube Reserved",
                opts.kube_reserved_cgroup,
                opts.kube_reserved.amounts,
            ),
        )
        if key in opts.enforce_node_allocatable
    )
    return ProcessRuntime(
        opts.root_dir,
        node_ip=host_ip,
        pod_pids_limit=opts.pod_max_pids,
        pods_limits=limits,
        reserved_cgroups=reserved,
        cgroup_root=opts.cgroup_root,
    )


def _counter(server_type: str) -> Callable[[str, str, int], None]:
    def count(method: str, path: str, code: int) -> None:
        # The first segment only, as the kubelet does: pod names must not become label values.
        first = "/" + path.lstrip("/").split("/", 1)[0]
        metrics.http_requests.labels(method, first, server_type, str(code)).inc()

    return count


class ApiReviews:
    """TokenReviews and SubjectAccessReviews through the cluster's connection."""

    def __init__(self, connection: ApiConnection) -> None:
        self._connection = connection

    async def review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        api = self._connection.api
        if api is None:
            raise ReviewError("not connected to the API server yet")
        from pykubelet.client.kubeapi import ApiError

        try:
            return await api.create(path, body)
        except ApiError as exc:
            raise ReviewError(str(exc)) from None


def secure_server(
    opts: Options,
    kubelet: Kubelet,
    connection: ApiConnection | None,
    host_ip: str,
    facts: MachineFacts,
    stats: StatsCollector,
) -> tuple[HttpServer, ServingContext]:
    """The authenticated kubelet API on --port and its SSL context (a bootstrapped serving
    certificate replaces the first one through it); raises TlsError naming a file it cannot
    use."""
    reviews = ApiReviews(connection) if connection is not None else None
    authenticator = Authenticator(
        anonymous=opts.anonymous_auth,
        token_reviews=reviews if opts.authentication_token_webhook else None,
        token_cache_ttl=opts.authentication_token_webhook_cache_ttl,
    )
    authorizer: Authorizer = AlwaysAllow()
    if opts.authorization_mode == "Webhook" and reviews is not None:
        authorizer = WebhookAuthorizer(
            reviews,
            opts.authorization_webhook_cache_authorized_ttl,
            opts.authorization_webhook_cache_unauthorized_ttl,
        )
    context = ServingContext(
        ServingConfig(
            cert_file=opts.tls_cert_file,
            key_file=opts.tls_private_key_file,
            cert_dir=opts.certificate_dir,
            client_ca_file=opts.client_ca_file,
            min_version=opts.tls_min_version,
            node_name=opts.node_name,
            hostname=facts.hostname,
            addresses=(host_ip,),
        )
    )
    app = build_secure_app(
        kubelet,
        authenticator,
        authorizer,
        opts.kubelet_configuration,
        _counter("readwrite"),
        streaming_idle_timeout=opts.streaming_connection_idle_timeout,
    )
    add_stats_routes(app, stats)
    return HttpServer(app, opts.address, opts.port, context.listener()), context


Task = tuple[str, Coroutine[Any, Any, None]]


def started_pool(workers: int) -> ThreadPoolExecutor:
    """The blocking calls' pool with all its threads already started: a burst of pod starts then
    waits for no thread to be created (starting them was 9 % of the loop's time in a 100-pod
    start's profile). The threads meet at a barrier, so each one is started, none runs twice."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="io")
    gate = threading.Barrier(workers)
    for _ in range(workers):
        pool.submit(gate.wait)
    return pool


async def run_agent(opts: Options) -> int:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(started_pool(IO_THREADS))
    stop = asyncio.Event()
    notifier = Notifier.from_environment()  # systemd's Type=notify; a no-op without it

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            log.info("%s: stopping (a second signal exits at once)", sig.name)
            notifier.stopping("stopping the pods")
            stop.set()
            return
        # The pods that still run keep running; the next agent adopts them.
        log.warning("%s again: exiting now, without waiting for the pods to stop", sig.name)
        logging.shutdown()
        os._exit(128 + sig.value)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        node_ips = await asyncio.to_thread(nodeip.node_ips, opts.node_ip, opts.node_name)
    except nodeip.NodeIPError as exc:
        log.error("cannot start: %s", exc)
        return 1
    host_ip = node_ips[0]
    try:
        opts.root_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        log.error("--root-dir %s: %s", opts.root_dir, exc.strerror)
        return 1
    if not await _bootstrap(opts, stop):
        return 1
    facts = await asyncio.to_thread(read_machine_facts, opts.root_dir)
    resources = node_resources(
        facts, opts.max_pods, opts.kube_reserved, opts.system_reserved, opts.eviction_hard
    )
    runtime = InstrumentedRuntime(make_runtime(opts, host_ip, resources))
    recorder = EventRecorder()

    def merger_event(reason: str, subject: str, message: str) -> None:
        recorder.record("Warning", reason, message, ObjectRef.node(opts.node_name))

    pod_config = PodConfig(NotificationMode.INCREMENTAL, recorder=merger_event)
    statuses = StatusManager()
    connection = None
    objects: ObjectLookup = NoApiServer()
    registry: ObjectRegistry | None = None
    watch_objects: Callable[[], Coroutine[Any, Any, None]] | None = None
    services = None
    if opts.kubeconfig is not None:
        from pykubelet.cluster.connection import ApiConnection
        from pykubelet.cluster.objects import ApiObjectLookup
        from pykubelet.cluster.services import ServiceWatch
        from pykubelet.cluster.watched_objects import WatchedObjects

        connection = ApiConnection(
            opts.kubeconfig, opts.node_name, qps=opts.kube_api_qps, burst=opts.kube_api_burst
        )
        if opts.config_map_and_secret_change_detection_strategy == "Watch":
            # The kubelet's default: a watch of each object the desired pods name, read from
            # its copy (the idle time as the kubelet's: five periodic syncs).
            objects = registry = watching = WatchedObjects(connection, 5 * opts.sync_frequency)
            watch_objects = watching.run
        else:
            objects = ApiObjectLookup(connection)
        services = ServiceWatch()  # the service variables' Services
    stats = StatsCollector(
        runtime,
        opts.node_name,
        opts.housekeeping_interval,
        root_dir=opts.root_dir,
        storage=runtime,
        storage_period=opts.volume_stats_agg_period,
    )
    kubelet = Kubelet(
        opts,
        runtime,
        host_ip,
        pod_config=pod_config,
        recorder=recorder,
        statuses=statuses,
        objects=objects,
        facts=facts,
        registry=registry,
        services=services,
        on_sync_loop=notifier.watchdog,
        stats=stats,
    )
    reservation_problems = kubelet.node_resources().problems()
    if reservation_problems:  # as the kubelet's validateNodeAllocatable, which stops its start
        log.error(
            "cannot start: invalid Node Allocatable configuration. %s",
            " ".join(reservation_problems),
        )
        return 1
    tasks: list[Task] = _sources(opts, pod_config, recorder)
    cluster = None
    if connection is not None:
        from pykubelet.cluster.cluster import Cluster

        cluster = Cluster(
            opts,
            connection,
            kubelet,
            runtime,
            runtime_name=runtime.name,
            host_ip=host_ip,
            facts=facts,
            recorder=recorder,
            statuses=statuses,
            push=pod_config.channel(API_SOURCE),
            services=services,
            node_ips=node_ips,
            node_runtime=runtime,
        )
        tasks.extend(cluster.tasks())
        if watch_objects is not None:
            tasks.append(("cluster-objects", watch_objects()))
        log.info("joining the cluster of %s as node %s", opts.kubeconfig, opts.node_name)
    if not tasks:
        log.warning(
            "no pod source configured (--pod-manifest-path, --manifest-url, --kubeconfig): "
            "no pods will run"
        )
    tasks.append(("stats", stats.run()))
    tasks.append(("heap-trim", trim_heap_periodically()))
    log.info(
        "pykubelet %s starting: node %s, runtime %s", __version__, opts.node_name, runtime.name
    )
    server = HttpServer(
        build_app(kubelet, on_request=_counter("readonly"), history=stats, pressure=kubelet),
        opts.address,
        opts.read_only_port,
    )
    try:
        secure, context = await asyncio.to_thread(
            secure_server, opts, kubelet, connection, host_ip, facts, stats
        )
    except TlsError as exc:
        log.error("cannot start: %s", exc)
        return 1
    if connection is not None:
        tasks.extend(await _certificate_tasks(opts, connection, context, facts, host_ip))
    running: list[asyncio.Task[None]] = []
    try:
        notifier.status(f"starting the {runtime.name} runtime")
        try:
            await runtime.start()
        except RuntimeFailure as exc:
            log.error("cannot start: %s", exc)
            return 1
        url = await server.start()
        log.info("read-only API at %s (pods at %s/pods)", url, url)
        log.info("kubelet API at %s", await secure.start())
        if cluster is not None:
            cluster.node.advertise_port(secure.port)
        tune_collector()  # everything built: what follows is the pods' work
        running = [asyncio.create_task(coro, name=name) for name, coro in tasks]
        running.append(asyncio.create_task(_notify_ready(notifier, opts, pod_config, runtime.name)))
        await kubelet.run(stop)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    finally:
        for _, coro in tasks[len(running) :]:
            coro.close()  # never started
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await kubelet.shutdown()
        if cluster is not None:
            await cluster.close()
        await runtime.close()
        await server.stop()
        await secure.stop()
        notifier.close()
    log.info("stopped")
    return 0


async def _notify_ready(
    notifier: Notifier, opts: Options, pod_config: PodConfig, runtime_name: str
) -> None:
    """READY=1 once the runtime and the servers are up and the manifest directory has been
    listed (its watch is armed before its first listing is sent). The API server and a manifest
    URL are not waited for: like the kubelet, the agent is up while it retries them."""
    if not notifier.enabled:
        return
    if opts.pod_manifest_path is not None:
        await pod_config.wait_listed(FILE_SOURCE)
    notifier.ready(f"running: node {opts.node_name}, runtime {runtime_name}")


async def _bootstrap(opts: Options, stop: asyncio.Event) -> bool:
    """--bootstrap-kubeconfig: a client certificate for --kubeconfig before anything starts, as
    the kubelet; False (logged) when it cannot be had. A signal meanwhile ends the wait."""
    if opts.kubeconfig is None or opts.bootstrap_kubeconfig is None:
        return True
    from pykubelet.client.kubeapi import KubeApi
    from pykubelet.cluster.bootstrap import BootstrapError, load_client_cert

    async def connect(path: Path) -> KubeApi:
        return await KubeApi.connect(path, opts.node_name)

    boot = asyncio.ensure_future(
        load_client_cert(
            opts.kubeconfig,
            opts.bootstrap_kubeconfig,
            opts.certificate_dir,
            opts.node_name,
            connect,
        )
    )
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({boot, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not boot.done():
        boot.cancel()
        await asyncio.gather(boot, return_exceptions=True)
        log.info("stopped while bootstrapping")
        return False
    try:
        boot.result()
    except BootstrapError as exc:
        log.error("cannot start: failed to bootstrap the client certificate: %s", exc)
        return False
    return True


async def _certificate_tasks(
    opts: Options,
    connection: ApiConnection,
    context: ServingContext,
    facts: MachineFacts,
    host_ip: str,
) -> list[Task]:
    """--rotate-certificates and serverTLSBootstrap: their certificate managers' tasks."""
    from pykubelet.cluster.bootstrap import uses_store
    from pykubelet.cluster.certificates import (
        CertificateManager,
        client_template,
        serving_template,
    )

    tasks: list[Task] = []
    cert_dir = opts.certificate_dir
    if opts.rotate_certificates and opts.kubeconfig is not None:
        if await asyncio.to_thread(uses_store, opts.kubeconfig, cert_dir):

            def expired() -> None:
                # The kubelet's os.Exit: its restart bootstraps again; the pods keep running
                # and the next agent adopts them.
                log.error("exiting: no valid client certificate")
                logging.shutdown()
                os._exit(1)

            client = CertificateManager(
                client_template(opts.node_name), cert_dir, connection.reload, on_expired=expired
            )
            tasks.append(("certificate-client", connection.with_api(client.run)))
        else:
            log.error(
                "--rotate-certificates: the client certificate of --kubeconfig %s is not "
                "%s/kubelet-client-current.pem (as --bootstrap-kubeconfig writes it): not rotated",
                opts.kubeconfig,
                cert_dir,
            )
    if opts.server_tls_bootstrap:

        async def load(path: Path) -> None:
            try:
                await asyncio.to_thread(context.load, path)
            except TlsError as exc:
                log.error(
                    "kubelet API: %s; the previous certificate is still served until the next "
                    "rotation",
                    exc,
                )
                return
            log.info("kubelet API serving certificate %s loaded", path)

        serving = CertificateManager(
            serving_template(opts.node_name, [opts.node_name, facts.hostname], [host_ip]),
            cert_dir,
            load,
        )
        stored = await asyncio.to_thread(serving.current)
        if stored is not None:
            await load(stored.path)
        else:
            log.info("serverTLSBootstrap: self-signed serving certificate until a CSR is issued")
        tasks.append(("certificate-serving", connection.with_api(serving.run)))
    return tasks


def _sources(opts: Options, pod_config: PodConfig, recorder: EventRecorder) -> list[Task]:
    tasks: list[Task] = []
    if opts.pod_manifest_path is not None:
        source = FileSource(
            opts.pod_manifest_path,
            opts.node_name,
            opts.file_check_frequency,
            pod_config.channel(FILE_SOURCE),
            recorder,
        )
        tasks.append(("source-file", source.run()))
        log.info(
            "watching %s for pod manifests (re-listed every %gs)",
            opts.pod_manifest_path,
            opts.file_check_frequency,
        )
    if opts.manifest_url is not None:
        from pykubelet.config.http import HttpSource

        http = HttpSource(
            url=opts.manifest_url,
            headers=opts.manifest_url_headers,
            period=opts.http_check_frequency,
            push=pod_config.channel(HTTP_SOURCE),
            recorder=recorder,
            node_name=opts.node_name,
            max_bytes=opts.manifest_url_max_bytes,
            ca_file=opts.manifest_url_ca_file,
        )
        tasks.append(("source-http", http.run()))
        log.info(
            "fetching pod manifests from %s every %gs",
            opts.manifest_url,
            opts.http_check_frequency,
        )
    return tasks
