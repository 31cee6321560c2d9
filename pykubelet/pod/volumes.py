"""Pod volumes: each one prepared on the host before the containers start, then bound into them.

A pod's volumes live where the kubelet keeps them, under `--root-dir`:

    <root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>/
    <root>/pods/<uid>/volumes/kubernetes.io~configmap/<name>/
    <root>/pods/<uid>/volumes/kubernetes.io~secret/<name>/
    <root>/pods/<uid>/volumes/kubernetes.io~downward-api/<name>/
    <root>/pods/<uid>/volumes/kubernetes.io~projected/<name>/

A hostPath is the host's own path, checked against its `type`. ConfigMap, Secret and downward
API volumes are written as the kubelet's atomic writer does: the files sit in a timestamped
directory that a `..data` symlink names, and each top-level entry is a symlink through `..data`,
so a container never sees half an update. A projected volume is one such directory holding the
files of its sources (ConfigMaps, Secrets, downward API items and service-account tokens from
`pod/tokens.py`, which refreshes them: each sync rewrites what changed). A runtime only binds
these paths (`Mount`); which backend runs the pod does not matter here.

emptyDir with `medium: Memory`, Secret and projected volumes are tmpfs mounts when the agent is
root (a Secret or a token never touches the disk, as with the kubelet); without root, Memory is
refused and Secrets and projected volumes are plain files in a 0700 directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pykubelet.api.model import (
    Container,
    DownwardAPIVolumeFile,
    KeyToPath,
    Pod,
    ProjectedVolumeSource,
    Volume,
)
from pykubelet.api.quantity import parse_quantity, to_bytes
from pykubelet.common import lockedio
from pykubelet.pod.atomicwriter import DATA_LINK, write_files
from pykubelet.pod.envvars import Allocatable, ApiObjects, EnvError, field_ref_value, resource_value
from pykubelet.pod.network import ETC_HOSTS_FILE, RESOLV_CONF_FILE
from pykubelet.pod.ownership import set_volume_ownership
from pykubelet.pod.tokens import (
    DEFAULT_EXPIRATION_SECONDS,
    IssuedToken,
    TokenError,
    TokenManager,
    TokenRequest,
)
from pykubelet.runtime.base import Mount

log = logging.getLogger(__name__)

EMPTY_DIR = "kubernetes.io~empty-dir"
CONFIG_MAP = "kubernetes.io~configmap"
SECRET = "kubernetes.io~secret"
DOWNWARD_API = "kubernetes.io~downward-api"
PROJECTED = "kubernetes.io~projected"
DEFAULT_MODE = 0o644  # the API's defaultMode (420)
SUBPATH_MODE = 0o750  # what the kubelet gives a subPath directory it creates

_MNT_DETACH = 2


class VolumeError(Exception):
    """A volume cannot be set up: the pod's containers wait (event FailedMount)."""


class ObjectLookup(Protocol):
    """Reads ConfigMaps and Secrets of the pod's namespace and requests service-account tokens
    (the API server, in cluster mode)."""

    async def config_map(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        """The object's data (text) and binaryData (bytes), or None if there is none."""
        ...

    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The decoded data, or None if there is no such Secret."""
        ...

    async def typed_secret(self, namespace: str, name: str) -> tuple[str, dict[str, bytes]] | None:
        """The Secret's type and decoded data (image pull secrets), or None if there is none."""
        ...

    async def request_token(self, request: TokenRequest) -> IssuedToken:
        """A token from the TokenRequest API, bound to the pod."""
        ...


class ObjectRegistry(Protocol):
    """Hears which pods are desired, to know which ConfigMaps and Secrets they will read (the
    kubelet's RegisterPod/UnregisterPod of its secret and configmap managers)."""

    def register_pod(self, pod: Pod) -> None:
        """The pod entered the desired pods, or changed."""
        ...

    def unregister_pod(self, uid: str) -> None:
        """The pod left the desired pods."""
        ...


class NoApiServer:
    """Without --kubeconfig there are no ConfigMaps or Secrets to read."""

    async def config_map(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        raise EnvError(f'configmap "{name}": no API server (pykubelet runs without --kubeconfig)')

    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        raise EnvError(f'secret "{name}": no API server (pykubelet runs without --kubeconfig)')

    async def typed_secret(self, namespace: str, name: str) -> tuple[str, dict[str, bytes]] | None:
        return ("", await self.secret(namespace, name) or {})

    async def request_token(self, request: TokenRequest) -> IssuedToken:
        raise EnvError(
            f'token for service account "{request.service_account}": no API server '
            "(pykubelet runs without --kubeconfig)"
        )


def referenced_objects(pod: Pod) -> tuple[set[str], set[str]]:
    """The names of the ConfigMaps and Secrets the pod's volumes and environment use."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    for volume in pod.spec.volumes or []:
        if volume.config_map is not None:
            config_maps.add(volume.config_map.name)
        if volume.secret is not None:
            secrets.add(volume.secret.secret_name)
        for projection in volume.projected.sources if volume.projected is not None else []:
            if projection.config_map is not None:
                config_maps.add(projection.config_map.name)
            if projection.secret is not None:
                secrets.add(projection.secret.name)
    for container in pod.all_containers():
        for var in container.env:
            source = var.value_from
            if source is not None and source.config_map_key_ref is not None:
                config_maps.add(source.config_map_key_ref.name)
            if source is not None and source.secret_key_ref is not None:
                secrets.add(source.secret_key_ref.name)
        for env_from in container.env_from or []:
            if env_from.config_map_ref is not None:
                config_maps.add(env_from.config_map_ref.name)
            if env_from.secret_ref is not None:
                secrets.add(env_from.secret_ref.name)
    return config_maps, secrets


async def fetch_objects(pod: Pod, lookup: ObjectLookup) -> ApiObjects:
    """Every ConfigMap and Secret the pod refers to, read once per sync."""
    config_maps, secrets = referenced_objects(pod)
    namespace = pod.metadata.namespace
    objects = ApiObjects()
    for name in sorted(config_maps):
        objects.config_maps[name] = await lookup.config_map(namespace, name)
    for name in sorted(secrets):
        objects.secrets[name] = await lookup.secret(namespace, name)
    return objects


def host_path_allowed(path: str, allowed: Iterable[str]) -> bool:
    """Whether `path` is one of the allowed prefixes or below one (whole path components)."""
    clean = os.path.normpath(path)
    for prefix in allowed:
        root = os.path.normpath(prefix)
        if clean == root or clean.startswith(root.rstrip("/") + "/"):
            return True
    return False


@dataclass(frozen=True)
class Exceeded:
    volume: str
    used: int
    limit: str


class VolumeManager:
    """Sets up, measures and tears down the volumes of the pods on this node."""

    def __init__(
        self,
        root_dir: Path,
        node: Allocatable,
        allowed_host_paths: Iterable[str] = (),
        tokens: TokenManager | None = None,
    ) -> None:
        self._dir = root_dir / "pods"
        self._tokens = tokens
        self._node = node
        self._allowed = [os.path.normpath(p) for p in allowed_host_paths]
        self._root = os.geteuid() == 0
        self._written: dict[Path, str] = {}  # a volume's directory -> the payload it holds
        self._owned: set[Path] = set()  # volumes given to their pod's fsGroup
        self._dir_made = False  # the pods' directory, made once (a pod with no volume needs
        # nothing else, and its sync no thread hop)

    def pod_dir(self, uid: str) -> Path:
        return self._dir / uid

    async def setup(self, pod: Pod, objects: ApiObjects) -> dict[str, str]:
        """Prepare every volume of the pod; returns each volume's path on the host."""
        if not pod.spec.volumes and self._dir_made:
            return {}
        tokens = await self._pod_tokens(pod)
        return await asyncio.to_thread(self._setup, pod, objects, tokens)

    async def _pod_tokens(self, pod: Pod) -> dict[tuple[str, int], bytes]:
        """The service-account token of each projection that asks for one, by (volume name,
        source index): fresh ones from the cache, the others from the API server."""
        tokens: dict[tuple[str, int], bytes] = {}
        for volume in pod.spec.volumes or []:
            for j, source in enumerate(volume.projected.sources if volume.projected else []):
                wanted = source.service_account_token
                if wanted is None:
                    continue
                where = f'MountVolume.SetUp failed for volume "{volume.name}"'
                if self._tokens is None:
                    raise VolumeError(f"{where}: no API server to request a token from")
                request = TokenRequest(
                    namespace=pod.metadata.namespace,
                    service_account=pod.spec.service_account_name
                    or pod.spec.service_account
                    or "default",
                    audience=wanted.audience or None,
                    expiration_seconds=wanted.expiration_seconds or DEFAULT_EXPIRATION_SECONDS,
                    pod_name=pod.metadata.name,
                    pod_uid=pod.uid,
                )
                try:
                    tokens[(volume.name, j)] = (await self._tokens.token(request)).encode()
                except (TokenError, EnvError) as e:
                    raise VolumeError(f"{where}: {e}") from e
        return tokens

    async def container_mounts(
        self, pod: Pod, container: Container, paths: dict[str, str]
    ) -> list[Mount]:
        """The container's volumeMounts as host paths, subPaths made and checked."""
        if not container.volume_mounts:
            return []
        if any(spec.sub_path for spec in container.volume_mounts):
            return await asyncio.to_thread(self._mounts, pod, container, paths)
        # Without a subPath nothing touches the disk: no thread hop (each is a wake of a
        # thread and of the loop again, about 50 us of the loop's time here).
        return self._mounts(pod, container, paths)

    async def teardown(self, uid: str) -> None:
        """Unmount what we mounted for the pod and delete its volumes."""
        if self._tokens is not None:
            self._tokens.forget_pod(uid)
        await asyncio.to_thread(self._teardown, uid)

    async def pod_uids(self) -> list[str]:
        """The pods that have volumes on this node (also those of an earlier agent)."""
        return await asyncio.to_thread(self._pod_uids)

    async def over_limit(self, pod: Pod) -> list[Exceeded]:
        """The emptyDir volumes that use more than their sizeLimit (the kubelet evicts)."""
        return await asyncio.to_thread(self._over_limit, pod)

    # --- in a thread ----------------------------------------------------------------------------

    def _setup(
        self, pod: Pod, objects: ApiObjects, tokens: dict[tuple[str, int], bytes]
    ) -> dict[str, str]:
        # Private, as everything under --root-dir: containers reach their volumes by the binds.
        # The quick calls of the setup keep the interpreter lock (pod/atomicwriter.py).
        lockedio.makedirs(str(self._dir), 0o700)
        self._dir_made = True
        paths: dict[str, str] = {}
        for volume in pod.spec.volumes or []:
            try:
                written = self._volume_dir_of(pod, volume)
                before = self._written.get(written) if written is not None else None
                paths[volume.name] = self._setup_one(pod, volume, objects, tokens)
                self._fs_group(pod, volume, Path(paths[volume.name]), before)
            except OSError as e:
                raise VolumeError(
                    f'MountVolume.SetUp failed for volume "{volume.name}": {_os_reason(e)}'
                ) from e
            except (EnvError, VolumeError) as e:
                raise VolumeError(
                    f'MountVolume.SetUp failed for volume "{volume.name}": {e}'
                ) from e
        return paths

    def _volume_dir_of(self, pod: Pod, volume: Volume) -> Path | None:
        for plugin, source in (
            (CONFIG_MAP, volume.config_map),
            (SECRET, volume.secret),
            (DOWNWARD_API, volume.downward_api),
            (PROJECTED, volume.projected),
        ):
            if source is not None:
                return self._volume_dir(pod, plugin, volume.name)
        return None

    def _fs_group(self, pod: Pod, volume: Volume, path: Path, before: str | None) -> None:
        """The pod's fsGroup on a volume it owns (never a hostPath), as the kubelet's
        SetVolumeOwnership: an emptyDir when first set up (with its fsGroupChangePolicy), the
        others (read-only for containers) whenever their content is written."""
        ctx = pod.spec.security_context
        if ctx is None or ctx.fs_group is None or volume.host_path is not None:
            return
        if volume.empty_dir is not None:
            if path in self._owned:
                return
            set_volume_ownership(
                str(path),
                ctx.fs_group,
                read_only=False,
                on_root_mismatch=ctx.fs_group_change_policy == "OnRootMismatch",
            )
        else:
            if path in self._owned and self._written.get(path) is before:
                return
            set_volume_ownership(str(path), ctx.fs_group, read_only=True, on_root_mismatch=False)
        self._owned.add(path)

    def _volume_dir(self, pod: Pod, plugin: str, name: str) -> Path:
        return self.pod_dir(pod.uid) / "volumes" / plugin / name

    def _setup_one(
        self,
        pod: Pod,
        volume: Volume,
        objects: ApiObjects,
        tokens: dict[tuple[str, int], bytes],
    ) -> str:
        if volume.host_path is not None:
            return self._host_path(volume.host_path.path, volume.host_path.type or "")
        if volume.empty_dir is not None:
            path = self._volume_dir(pod, EMPTY_DIR, volume.name)
            if volume.empty_dir.medium == "Memory":
                limit = volume.empty_dir.size_limit
                self._tmpfs(path, 0o777, to_bytes(limit) if limit is not None else None)
            elif not path.is_dir():
                path.mkdir(parents=True, exist_ok=True)
            # As the kubelet: any user of any container may write to an emptyDir (the setgid
            # bit of an fsGroup is kept).
            mode = path.stat().st_mode
            if stat.S_IMODE(mode) & 0o777 != 0o777:
                os.chmod(path, stat.S_IMODE(mode) | 0o777)
            return str(path)
        if volume.config_map is not None:
            source = volume.config_map
            path = self._volume_dir(pod, CONFIG_MAP, volume.name)
            data = objects.config_maps.get(source.name)
            if data is None and not source.optional:
                raise VolumeError(f'configmap "{source.name}" not found')
            files = _key_files(
                {k: v.encode() if isinstance(v, str) else v for k, v in (data or {}).items()},
                source.items,
                source.default_mode,
                source.optional,
                f"configmap {source.name}",
            )
            self._write_atomically(path, files, private=False, group=_fs_group_of(pod))
            return str(path)
        if volume.secret is not None:
            secret = volume.secret
            path = self._volume_dir(pod, SECRET, volume.name)
            found = objects.secrets.get(secret.secret_name)
            if found is None and not secret.optional:
                raise VolumeError(f'secret "{secret.secret_name}" not found')
            files = _key_files(
                found or {},
                secret.items,
                secret.default_mode,
                secret.optional,
                f"secret {secret.secret_name}",
            )
            if self._root:
                self._tmpfs(path, 0o755, None)
            self._write_atomically(path, files, private=not self._root, group=_fs_group_of(pod))
            return str(path)
        if volume.downward_api is not None:
            path = self._volume_dir(pod, DOWNWARD_API, volume.name)
            downward = {
                item.path: (
                    self._downward_value(pod, item),
                    item.mode if item.mode is not None else volume.downward_api.default_mode,
                )
                for item in volume.downward_api.items
            }
            self._write_atomically(
                path, _with_default_mode(downward), private=False, group=_fs_group_of(pod)
            )
            return str(path)
        if volume.projected is not None:
            path = self._volume_dir(pod, PROJECTED, volume.name)
            files = self._projected_files(pod, volume.name, volume.projected, objects, tokens)
            if self._root:
                self._tmpfs(path, 0o755, None)  # tokens and Secrets stay off the disk
            self._write_atomically(path, files, private=not self._root, group=_fs_group_of(pod))
            return str(path)
        raise VolumeError("no volume source")  # validation makes this unreachable

    def _projected_files(
        self,
        pod: Pod,
        name: str,
        projected: ProjectedVolumeSource,
        objects: ApiObjects,
        tokens: dict[tuple[str, int], bytes],
    ) -> dict[str, tuple[bytes, int]]:
        """The files of every source, each with its own mode or the volume's defaultMode."""
        default_mode = DEFAULT_MODE if projected.default_mode is None else projected.default_mode
        files: dict[str, tuple[bytes, int]] = {}
        for j, source in enumerate(projected.sources):
            if source.config_map is not None:
                cm = source.config_map
                data = objects.config_maps.get(cm.name)
                if data is None and not cm.optional:
                    raise VolumeError(f'configmap "{cm.name}" not found')
                files.update(
                    _key_files(
                        {
                            k: v.encode() if isinstance(v, str) else v
                            for k, v in (data or {}).items()
                        },
                        cm.items,
                        default_mode,
                        cm.optional,
                        f"configmap {cm.name}",
                    )
                )
            elif source.secret is not None:
                secret = source.secret
                found = objects.secrets.get(secret.name)
                if found is None and not secret.optional:
                    raise VolumeError(f'secret "{secret.name}" not found')
                files.update(
                    _key_files(
                        found or {},
                        secret.items,
                        default_mode,
                        secret.optional,
                        f"secret {secret.name}",
                    )
                )
            elif source.downward_api is not None:
                for item in source.downward_api.items:
                    mode = default_mode if item.mode is None else item.mode
                    files[item.path] = (self._downward_value(pod, item), mode)
            elif source.service_account_token is not None:
                files[source.service_account_token.path] = (tokens[(name, j)], default_mode)
        return files

    def _downward_value(self, pod: Pod, item: DownwardAPIVolumeFile) -> bytes:
        if item.resource_field_ref is not None:
            ref = item.resource_field_ref
            return resource_value(pod, ref.container_name or "", ref, self._node).encode()
        assert item.field_ref is not None  # validation: exactly one of the two
        field_path = item.field_ref.field_path
        if field_path in ("metadata.labels", "metadata.annotations"):
            values = (
                pod.metadata.labels if field_path == "metadata.labels" else pod.metadata.annotations
            )
            # One `key="value"` a line, sorted, the value quoted as Go's %q does.
            return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(values.items())).encode()
        return field_ref_value(pod, field_path, "", "").encode()

    def _host_path(self, path: str, kind: str) -> str:
        if self._allowed:
            real = os.path.realpath(path)
            if not host_path_allowed(real, self._allowed):
                raise VolumeError(
                    f"hostPath {path} resolves to {real}, outside --allowed-host-paths"
                )
        if kind == "DirectoryOrCreate" and not os.path.exists(path):
            os.makedirs(path, 0o755, exist_ok=True)
        elif kind == "FileOrCreate" and not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.close(fd)
        checks = {
            "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
            "Directory": (stat.S_ISDIR, "a directory"),
            "FileOrCreate": (stat.S_ISREG, "a file"),
            "File": (stat.S_ISREG, "a file"),
            "Socket": (stat.S_ISSOCK, "a socket file"),
            "CharDevice": (stat.S_ISCHR, "a character device"),
            "BlockDevice": (stat.S_ISBLK, "a block device"),
        }
        if kind in checks:
            test, what = checks[kind]
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                raise VolumeError(f"hostPath type check failed: {path} does not exist") from None
            if not test(mode):
                raise VolumeError(f"hostPath type check failed: {path} is not {what}")
        # What was checked is what gets bound, not a name a link may have moved meanwhile.
        return os.path.realpath(path) if self._allowed else path

    def _tmpfs(self, path: Path, mode: int, size: int | None) -> None:
        if lockedio.is_mount(str(path)):
            return  # mounted already (also by an agent before this one)
        if not self._root:
            raise VolumeError("a memory-backed volume needs root: pykubelet mounts a tmpfs")
        path.mkdir(parents=True, exist_ok=True)  # on the disk: a new inode lets the lock go
        options = f"mode={mode:o}" + (f",size={size}" if size is not None else "")
        _mount(b"tmpfs", str(path).encode(), b"tmpfs", options.encode())

    def _write_atomically(
        self,
        path: Path,
        files: dict[str, tuple[bytes, int]],
        *,
        private: bool,
        group: int | None = None,
    ) -> None:
        """`files` written to `path` as the kubelet's atomic writer does (pod/atomicwriter.py),
        unless it holds them already."""
        payload = json.dumps(
            {k: [v.hex(), m] for k, (v, m) in sorted(files.items())}, separators=(",", ":")
        )
        if self._written.get(path) == payload and lockedio.exists(str(path / DATA_LINK)):
            return
        write_files(str(path), files, private=private, group=group)
        self._written[path] = payload

    def _mounts(self, pod: Pod, container: Container, paths: dict[str, str]) -> list[Mount]:
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: list[Mount] = []
        for spec in container.volume_mounts or []:
            volume = volumes[spec.name]  # validation: every mount names a volume
            source = paths[spec.name]
            # As the kubelet: ConfigMap, Secret and downward API volumes are always read-only.
            read_only = spec.read_only or (volume.host_path is None and volume.empty_dir is None)
            if spec.sub_path:
                # As the kubelet: a missing subPath is made in an emptyDir or hostPath, never
                # in the files of a ConfigMap, Secret or downward API volume.
                creatable = volume.host_path is not None or volume.empty_dir is not None
                source = self._sub_path(source, spec.sub_path, spec.name, creatable)
            mounts.append(Mount(source, spec.mount_path, read_only))
        return mounts

    def _sub_path(self, volume_path: str, sub_path: str, volume: str, creatable: bool) -> str:
        """The subPath's real location, checked one component at a time before anything is
        created: a link a container planted in the volume must not make the agent (root) create
        or bind anything outside of it (the kubelet's CVE-2017-1002101)."""
        base = os.path.realpath(volume_path)
        current = base
        for part in sub_path.split("/"):
            if part in ("", "."):
                continue
            candidate = os.path.join(current, part)
            if not os.path.lexists(candidate):
                if not creatable:
                    raise VolumeError(f'subPath "{sub_path}" does not exist in volume "{volume}"')
                with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                    os.mkdir(candidate, SUBPATH_MODE)
            real = os.path.realpath(candidate)
            if real != base and not real.startswith(base.rstrip("/") + "/"):
                raise VolumeError(
                    f'subPath "{sub_path}" of volume "{volume}" resolves to {real}, '
                    "outside the volume"
                )
            current = real
        return current

    def _teardown(self, uid: str) -> None:
        pod_dir = self.pod_dir(uid)
        volumes = pod_dir / "volumes"
        if volumes.is_dir():
            for plugin in os.scandir(volumes):
                for entry in os.scandir(plugin.path):
                    path = Path(entry.path)
                    if os.path.ismount(path):
                        _unmount(str(path).encode())
                    self._written.pop(path, None)
                    self._owned.discard(path)
        shutil.rmtree(pod_dir, ignore_errors=True)

    def _pod_uids(self) -> list[str]:
        try:
            entries = list(os.scandir(self._dir))
        except FileNotFoundError:
            return []
        # Only what the agent made: a directory holding "volumes", or a pod's etc-hosts or
        # resolv.conf (pod/network.py).
        made = ("volumes", ETC_HOSTS_FILE, RESOLV_CONF_FILE)
        return sorted(
            e.name
            for e in entries
            if e.is_dir(follow_symlinks=False)
            and any(os.path.lexists(os.path.join(e.path, name)) for name in made)
        )

    def _over_limit(self, pod: Pod) -> list[Exceeded]:
        found: list[Exceeded] = []
        for volume in pod.spec.volumes or []:
            empty = volume.empty_dir
            if empty is None or empty.size_limit is None:
                continue
            limit = parse_quantity(empty.size_limit)
            used = _disk_usage(self._volume_dir(pod, EMPTY_DIR, volume.name))
            if used > limit:
                found.append(Exceeded(volume.name, used, str(empty.size_limit)))
        return found


def _fs_group_of(pod: Pod) -> int | None:
    ctx = pod.spec.security_context
    return ctx.fs_group if ctx is not None else None


def _with_default_mode(
    files: dict[str, tuple[bytes, int | None]],
) -> dict[str, tuple[bytes, int]]:
    return {k: (v, DEFAULT_MODE if m is None else m) for k, (v, m) in files.items()}


def _key_files(
    data: dict[str, bytes],
    items: list[KeyToPath] | None,
    default_mode: int | None,
    optional: bool | None,
    what: str,
) -> dict[str, tuple[bytes, int]]:
    mode = DEFAULT_MODE if default_mode is None else default_mode
    if items is None:
        return {key: (value, mode) for key, value in data.items()}
    files: dict[str, tuple[bytes, int]] = {}
    for item in items:
        if item.key not in data:
            if optional:
                continue
            raise VolumeError(f"{what} references non-existent key: {item.key}")
        files[item.path] = (data[item.key], mode if item.mode is None else item.mode)
    return files


def _disk_usage(path: Path) -> int:
    """Bytes of disk the tree uses (blocks, as du counts them), not following links."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                stack.append(Path(entry.path))
    return total


def _os_reason(e: OSError) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return f"{(e.strerror or str(e)).lower()}{where}"


_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        # The C library the interpreter has loaded: find_library would run ldconfig (a fork
        # in the first pods' volume threads, each racing to look it up).
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _mount(source: bytes, target: bytes, fstype: bytes, options: bytes) -> None:
    if _c().mount(source, target, fstype, 0, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype.decode()}: {os.strerror(err)}", target.decode())


def _unmount(target: bytes) -> None:
    if _c().umount2(target, _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
            log.warning("cannot unmount %s: %s", target.decode(), os.strerror(err))
