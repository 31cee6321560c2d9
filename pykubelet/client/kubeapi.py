"""The one client of the Kubernetes API server: every request of the agent goes through here.

`KubeApi` wraps `kubernetes.aio` (the official client's asyncio API; untyped, so this is the
typed boundary). Requests go through its REST client (configuration, TLS, proxy, the aiohttp
session) with JSON in and out as plain dicts: the generated models would re-serialise a
MicroTime such as a Lease's renewTime without its six fractional digits, which a real API server
rejects. The URL and headers are made here, not by the ApiClient's `param_serialize`, which
walks every body, header and query value in Python first. A watch asks for bookmarks and reads
its stream a line an event, one JSON decode each (the client's `Watch` decoded each event,
encoded its object again and decoded that: most of the agent's watch CPU in a burst); a 410 is
an ApiError. The single-object watches of ConfigMaps and Secrets (many at once) are on a pool of
connections of their own with no size limit (each holds one: HTTP/1.1 has no streams to share
it). Every request first takes a token from one bucket (--kube-api-qps, --kube-api-burst:
the kubelet's defaults are 50 per second, bursts of 100) unless it brings its own (the events'
client, --event-qps).

The credentials are ours, not the library's (credentials.py: an exec plugin, a tokenFile, the
certificate files, kept fresh): the bearer token is set before each request and watch, the
client is rebuilt when the TLS material changes, and a request answered 401 is sent once more
with the credentials fetched anew (authentication comes before anything is done, so any request
may be repeated).
"""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, Awaitable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from pykubelet import __version__
from pykubelet.client.credentials import CredentialError, Credentials, from_user, in_cluster
from pykubelet.client.throttle import RateLimiter

log = logging.getLogger(__name__)

Obj = dict[str, Any]
T = TypeVar("T")

REQUEST_TIMEOUT = 30.0
REQUEST_CONNECTIONS = 100  # the requests' pool (client-go's HTTP/2 shares one connection)
# A watch that carries nothing, not even a bookmark (an API server sends one about every minute),
# for this long is taken for a dead connection (half-open: no reset ever comes) and resumed.
WATCH_IDLE_TIMEOUT = 150.0


class ApiError(Exception):
    """A failed API call. `status` 0: no answer (refused, reset, timed out, TLS)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def unreachable(self) -> bool:
        return self.status == 0


class ConfigError(Exception):
    """The kubeconfig (or the in-cluster configuration) cannot be used."""


def _status_error(status: int, raw: bytes) -> ApiError:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or raw[:200].decode(errors="replace").strip())
    return ApiError(status, reason, message)


def _transport_error(exc: BaseException) -> ApiError:
    if isinstance(exc, TimeoutError):
        return ApiError(0, "Timeout", "no answer in time")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ApiError(0, "Broken", "the connection broke in the middle of an answer")
    text = " ".join(str(exc).split()) or type(exc).__name__
    return ApiError(0, "Unreachable", text)


_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


# --- the client ---------------------------------------------------------------------------------


_AUTH_FIELDS = ("exec", "token", "tokenFile", "username", "password")


def _current_user(kubeconfig: Path) -> tuple[str, Obj, Obj]:
    """The current context's user name, user and cluster (reads the file)."""
    try:
        data = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{kubeconfig}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{kubeconfig}: not a kubeconfig")

    def named(kind: str, name: str) -> Obj:
        for item in data.get(f"{kind}s") or []:
            if isinstance(item, dict) and item.get("name") == name:
                value = item.get(kind)
                return value if isinstance(value, dict) else {}
        raise ConfigError(f"{kubeconfig}: current-context: no {kind} named {name!r}")

    context = named("context", str(data.get("current-context") or ""))
    user_name = str(context.get("user") or "")
    user = named("user", user_name) if user_name else {}
    cluster = named("cluster", str(context.get("cluster") or ""))
    return user_name, user, cluster


def _tls_files(kubeconfig: Path, user: Obj, cluster: Obj) -> list[Path]:
    files = []
    for section, key in ((cluster, "certificate-authority"), (user, "client-certificate"),
                         (user, "client-key")):  # fmt: skip
        if section.get(key) and not section.get(f"{key}-data"):
            path = Path(str(section[key]))
            files.append(path if path.is_absolute() else kubeconfig.parent / path)
    return files


def read_credentials(kubeconfig: Path) -> Credentials:
    """The user's credentials (their files not read yet); runs in a worker thread."""
    if str(kubeconfig) in ("", "."):
        return in_cluster()
    if not kubeconfig.is_file():
        raise ConfigError(f"{kubeconfig}: no such file")
    name, user, cluster = _current_user(kubeconfig)
    try:
        return from_user(kubeconfig, name, user, _tls_files(kubeconfig, user, cluster))
    except CredentialError as exc:
        raise ConfigError(str(exc)) from None


def _load_configuration(kubeconfig: Path, creds: Credentials) -> Any:
    """Build the client's configuration: the cluster and TLS from the kubeconfig, the
    credentials' certificate if they have one (a bearer token is set per request); runs in a
    worker thread (it reads files)."""
    kube_config: Any = importlib.import_module("kubernetes.aio.config.kube_config")
    client: Any = importlib.import_module("kubernetes.aio.client")
    cfg = client.Configuration()
    try:
        if str(kubeconfig) in ("", "."):
            # An empty --kubeconfig, as client-go: the pod's service account.
            kube_config.load_incluster_config(client_configuration=cfg)
        else:
            data = yaml.safe_load(kubeconfig.read_text())
            name, user, _ = _current_user(kubeconfig)
            for item in data.get("users") or []:
                if isinstance(item, dict) and item.get("name") == name:
                    stripped = {k: v for k, v in user.items() if k not in _AUTH_FIELDS}
                    if creds.exec_cert is not None:
                        cert, key = creds.exec_cert
                        stripped.pop("client-certificate-data", None)
                        stripped.pop("client-key-data", None)
                        stripped.update({"client-certificate": str(cert), "client-key": str(key)})
                    item["user"] = stripped
            loader = kube_config.KubeConfigLoader(
                config_dict=data, config_base_path=str(kubeconfig.parent.absolute())
            )
            asyncio.run(loader.load_and_set(cfg))
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{kubeconfig or 'in-cluster config'}: {exc}") from None
    # The token is ours to set, request by request (and never read on the event loop).
    cfg.refresh_api_key_hook = None
    # The environment's proxy decided once, here: aiohttp's trust_env would look up ~/.netrc and
    # the proxy variables in the default thread pool at every request, queued behind whatever
    # blocking work fills it (a burst of pod starts held every API request for seconds).
    cfg.client_session_kwargs = {**(cfg.client_session_kwargs or {}), "trust_env": False}
    if not cfg.proxy:
        cfg.proxy = env_proxy(str(cfg.host))
    cfg.api_key.pop("BearerToken", None)
    creds.reset_files()
    return cfg


def env_proxy(url: str) -> str | None:
    """The proxy for `url` from HTTPS_PROXY / HTTP_PROXY and NO_PROXY (either case), as Go's
    ProxyFromEnvironment decides it for client-go: none for a loopback host or one NO_PROXY
    names."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme or "https")
    if not proxy or urllib.request.proxy_bypass(host):  # NO_PROXY, on Linux
        return None
    return proxy


def _build_client(cfg: Any, user_agent: str) -> tuple[Any, Any]:
    """The requests' ApiClient (whose pool the pods' and Services' watches share) and the
    single-object watches' (built in a thread: each reads the CA files)."""
    kube: Any = importlib.import_module("kubernetes.aio.client")
    cfg.connection_pool_maxsize = REQUEST_CONNECTIONS
    client = kube.ApiClient(cfg)  # builds the SSL context: reads CA files
    client.user_agent = user_agent
    # The single-object watches (ConfigMaps, Secrets) on a pool of their own with no limit
    # (aiohttp's 0): each holds a connection for its life, and in the requests' pool 100 of
    # them would leave no connection for a request. The same configuration: the same token.
    cfg.connection_pool_maxsize = 0
    objects = kube.ApiClient(cfg)
    objects.user_agent = user_agent
    return client, objects


async def _within_idle(read: Awaitable[T], idle_timeout: float) -> T:
    """The next read of a watch stream, as ApiError when it fails: 0 "Idle" after `idle_timeout`
    without anything (a half-open connection), "TooLong" for a line over the client's buffer
    (resuming would read it again: re-list), else the transport's error."""
    try:
        async with asyncio.timeout(idle_timeout):
            return await read
    except TimeoutError:
        raise ApiError(0, "Idle", f"no event or bookmark for {idle_timeout:g}s") from None
    except ValueError:
        raise ApiError(0, "TooLong", "a watch event too long for the client") from None
    except _TRANSPORT_ERRORS as exc:
        raise _transport_error(exc) from None


def _watch_event(status: int, line: bytes) -> Obj:
    """One line of a watch stream as an event; an ERROR event's Status raised as ApiError (a
    410 Gone: the version was compacted away)."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    obj = event.get("object") if isinstance(event, dict) else None
    if not isinstance(event, dict) or not isinstance(obj, dict):
        text = " ".join(line.decode(errors="replace").split())[:200]
        raise ApiError(status, "BadResponse", f"not a watch event: {text}")
    kind = str(event.get("type", ""))
    if kind == "ERROR":
        code = obj.get("code")
        raise ApiError(
            code if isinstance(code, int) else 500,
            str(obj.get("reason") or "Error"),
            str(obj.get("message") or "watch"),
        )
    return {"type": kind, "object": obj}


class KubeApi:
    """The API calls of the cluster mode, typed: JSON objects in and out."""

    def __init__(
        self,
        client: Any,
        objects: Any,
        host: str,
        qps: float = 50,
        burst: int = 100,
        *,
        credentials: Credentials | None = None,
        kubeconfig: Path | None = None,
        user_agent: str = "",
    ) -> None:
        self._client = client
        self._objects = objects  # the single-object watches' client
        self.host = host
        self.limiter = RateLimiter(qps, burst)
        self._watching: set[str] = set()  # the pods' and Services' watches: one each at a time
        self.credentials = credentials
        self._kubeconfig = kubeconfig
        self._user_agent = user_agent
        self._generation = credentials.generation if credentials is not None else 0
        self._rebuilding: asyncio.Lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        kubeconfig: Path,
        node_name: str,
        credentials: Credentials | None = None,
        *,
        qps: float = 50,
        burst: int = 100,
    ) -> KubeApi:
        """Load the configuration (in a thread: file reads) and the credentials (maybe an exec
        plugin's first run). `credentials`: the kubeconfig's, already read (tests set their
        periods); `qps`, `burst`: the client's bucket (--kube-api-qps, --kube-api-burst)."""
        if credentials is None:
            credentials = await asyncio.to_thread(read_credentials, kubeconfig)
        creds: Credentials = credentials
        try:
            await creds.start()
        except CredentialError as exc:
            raise ConfigError(str(exc)) from None
        cfg = await asyncio.to_thread(_load_configuration, kubeconfig, creds)
        agent = f"pykubelet/{__version__} (linux) node/{node_name}"
        client, objects = await asyncio.to_thread(_build_client, cfg, agent)
        return cls(
            client,
            objects,
            str(cfg.host),
            qps,
            burst,
            credentials=creds,
            kubeconfig=kubeconfig,
            user_agent=agent,
        )

    async def reload(self, kubeconfig: Path, node_name: str) -> None:
        """Rebuild the client from the kubeconfig (a rotated client certificate): new requests
        and watches use the new credentials; those on the old connections fail and are retried."""
        self._kubeconfig = kubeconfig
        self._user_agent = f"pykubelet/{__version__} (linux) node/{node_name}"
        await self._rebuild()

    async def _rebuild(self) -> None:
        assert self._kubeconfig is not None and self.credentials is not None
        async with self._rebuilding:
            creds = self.credentials
            # The kubeconfig itself may have changed: another user's credential is started.
            fresh = await asyncio.to_thread(read_credentials, self._kubeconfig)
            if fresh.source() != creds.source():
                fresh.adopt_periods(creds)
                try:
                    await fresh.start()
                except CredentialError as exc:
                    raise ConfigError(str(exc)) from None
                log.info("the credentials of %s changed", fresh.where)
                await asyncio.to_thread(creds.close)
                self.credentials = creds = fresh
            generation = creds.generation
            cfg = await asyncio.to_thread(_load_configuration, self._kubeconfig, creds)
            client, objects = await asyncio.to_thread(_build_client, cfg, self._user_agent)
            old_client, old_objects = self._client, self._objects
            self._client, self._objects = client, objects
            self._generation = generation
        try:
            await old_client.close()
            await old_objects.close()
        except Exception:
            log.debug("closing the old API client failed", exc_info=True)

    async def _authenticate(self) -> str | None:
        """The credentials brought up to date (the client rebuilt if their files changed); the
        bearer token set on the configuration, returned."""
        creds = self.credentials
        if creds is None:
            return None
        token = await creds.token()
        if creds.generation != self._generation:
            try:
                await self._rebuild()
            except ConfigError as exc:
                # Half-written files, say: the old client goes on, the next change retries.
                log.error("rebuilding the API client: %s", exc)
                self._generation = creds.generation
            if self.credentials is not creds and self.credentials is not None:
                token = await self.credentials.token()
        api_key = self._client.configuration.api_key
        if token:
            api_key["BearerToken"] = f"Bearer {token}"
        else:
            api_key.pop("BearerToken", None)
        return token

    async def close(self) -> None:
        try:
            await self._client.close()
            await self._objects.close()
        except Exception:
            log.debug("closing the API client failed", exc_info=True)
        if self.credentials is not None:
            await asyncio.to_thread(self.credentials.close)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float = REQUEST_TIMEOUT,
        limiter: RateLimiter | None = None,
    ) -> Obj:
        """One request; `limiter`: a bucket of its own instead of the client's (events)."""
        await (limiter or self.limiter).acquire()
        for attempt in (1, 2):
            token = await self._authenticate()
            status, raw = await self._send(
                method, path, list(query), body, content_type, request_timeout
            )
            # A 401 is answered before anything is done: sent again once with credentials
            # fetched anew (an exec plugin re-run, a token file re-read, rotated certificates).
            if status != 401 or attempt == 2 or self.credentials is None:
                break
            if not await self.credentials.unauthorized(token):
                break
        if status >= 400:
            raise _status_error(status, raw)
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            raise ApiError(status, "BadResponse", "the answer is not JSON") from None
        return data if isinstance(data, dict) else {}

    async def _send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]],
        body: Any,
        content_type: str,
        request_timeout: float,
    ) -> tuple[int, bytes]:
        client = self._client
        headers = self._headers(client, content_type)
        try:
            resp = await client.rest_client.request(
                method,
                self._url(client, path, query),
                headers=headers,
                body=body,
                _request_timeout=request_timeout,
            )
            raw: bytes = await resp.read()
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc) from None
        return int(resp.status), raw

    @staticmethod
    def _url(client: Any, path: str, query: list[tuple[str, Any]]) -> str:
        url = str(client.configuration.host) + path
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    @staticmethod
    def _headers(client: Any, content_type: str | None = None) -> dict[str, str]:
        """The client's own (User-Agent) and the bearer token `_authenticate` set on it."""
        headers = {**client.default_headers, "Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        token = client.configuration.api_key.get("BearerToken")
        if token:
            headers["Authorization"] = token
        return headers

    async def get(self, path: str) -> Obj:
        return await self.request("GET", path)

    async def create(self, path: str, body: Obj, limiter: RateLimiter | None = None) -> Obj:
        return await self.request("POST", path, body=body, limiter=limiter)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body=body)

    async def patch(
        self, path: str, body: Obj, kind: str = "strategic", limiter: RateLimiter | None = None
    ) -> Obj:
        content_type = {
            "strategic": "application/strategic-merge-patch+json",
            "merge": "application/merge-patch+json",
        }[kind]
        return await self.request(
            "PATCH", path, body=body, content_type=content_type, limiter=limiter
        )

    async def delete(self, path: str, grace: int | None = None, uid: str | None = None) -> Obj:
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        query: list[tuple[str, Any]] = []
        if grace is not None:
            options["gracePeriodSeconds"] = grace
            query.append(("gracePeriodSeconds", grace))
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        return await self.request("DELETE", path, query=query, body=options)

    async def list_pods(self, field_selector: str, limit: int, cont: str | None) -> Obj:
        query: list[tuple[str, Any]] = [("fieldSelector", field_selector), ("limit", limit)]
        if cont:
            query.append(("continue", cont))
        return await self.request("GET", "/api/v1/pods", query=query, request_timeout=60.0)

    async def list_services(self, limit: int, cont: str | None) -> Obj:
        """A page of the Services of all namespaces."""
        query: list[tuple[str, Any]] = [("limit", limit)]
        if cont:
            query.append(("continue", cont))
        return await self.request("GET", "/api/v1/services", query=query, request_timeout=60.0)

    async def list_namespaced(
        self, resource: str, namespace: str, field_selector: str, limit: int, cont: str | None
    ) -> Obj:
        """A page of a core resource's objects in one namespace (`resource`: "configmaps")."""
        query: list[tuple[str, Any]] = [("fieldSelector", field_selector), ("limit", limit)]
        if cont:
            query.append(("continue", cont))
        return await self.request(
            "GET", f"/api/v1/namespaces/{namespace}/{resource}", query=query, request_timeout=60.0
        )

    def watch_namespaced(
        self,
        resource: str,
        namespace: str,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
        idle_timeout: float = WATCH_IDLE_TIMEOUT,
    ) -> AsyncGenerator[Obj, None]:
        """The watch events of a core resource in one namespace, as `_watch`'s; any number at
        once (the single-object watches of ConfigMaps and Secrets), on their own pool."""
        return self._watch(
            self._objects,
            f"/api/v1/namespaces/{namespace}/{resource}",
            [("fieldSelector", field_selector)],
            resource_version,
            timeout_seconds,
            idle_timeout,
        )

    def watch_pods(
        self,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
        idle_timeout: float = WATCH_IDLE_TIMEOUT,
    ) -> AsyncGenerator[Obj, None]:
        """The pods' watch events (see `_watch`); one such watch at a time."""
        query = [("fieldSelector", field_selector)]
        return self._watch_one(
            "pods",
            self._watch(
                self._client, "/api/v1/pods", query, resource_version, timeout_seconds, idle_timeout
            ),
        )

    def watch_services(
        self,
        resource_version: str,
        timeout_seconds: int,
        idle_timeout: float = WATCH_IDLE_TIMEOUT,
    ) -> AsyncGenerator[Obj, None]:
        """The watch events of the Services of all namespaces (see `_watch`); one at a time."""
        path = "/api/v1/services"
        return self._watch_one(
            "services",
            self._watch(self._client, path, [], resource_version, timeout_seconds, idle_timeout),
        )

    async def _watch_one(
        self, kind: str, events: AsyncGenerator[Obj, None]
    ) -> AsyncGenerator[Obj, None]:
        """`events`, the only watch of `kind` while it runs; closed with it (its connection
        released at once, not when collected)."""
        assert kind not in self._watching, f"one {kind} watch at a time"
        self._watching.add(kind)
        try:
            async for event in events:
                yield event
        finally:
            self._watching.discard(kind)
            await events.aclose()

    async def _watch(
        self,
        client: Any,
        path: str,
        query: list[tuple[str, Any]],
        resource_version: str,
        timeout_seconds: int,
        idle_timeout: float,
    ) -> AsyncGenerator[Obj, None]:
        """The watch events (`type`, `object` as a dict) of `path` through `client`; ends when
        the server ends the stream.

        Raises ApiError: the server's status when it refuses the watch, 410 (from an ERROR
        event) when the version is too old; 0 when the connection broke or was silent for
        `idle_timeout`; reason "TooLong" for an event over the client's line buffer, as
        resuming would hit it again: re-list.
        """
        await self.limiter.acquire()
        token = await self._authenticate()
        query = [
            *query,
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_seconds),
            ("watch", "true"),
        ]
        try:
            resp = await client.rest_client.request(
                "GET",
                self._url(client, path, query),
                headers=self._headers(client),
                # The client's own deadline for the whole stream: past the server's, so a
                # half-open connection is noticed without cutting a healthy one.
                _request_timeout=timeout_seconds + 30.0,
            )
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc) from None
        except RuntimeError as exc:  # "Session is closed": the client was rebuilt meanwhile
            raise ApiError(0, "Unreachable", str(exc)) from None
        raw: Any = resp.response  # the aiohttp response, its body not read yet
        try:
            status = int(resp.status)
            if status != 200:
                if status == 401 and self.credentials is not None:
                    await self.credentials.unauthorized(token)  # for the next try
                try:
                    body = await raw.read()
                except _TRANSPORT_ERRORS:
                    body = b""
                raise _status_error(status, body)
            while True:
                line = await _within_idle(raw.content.readline(), idle_timeout)
                if not line:
                    return
                yield _watch_event(status, line)
        finally:
            raw.close()
