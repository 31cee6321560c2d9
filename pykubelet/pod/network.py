"""A pod's hostname, resolver and hosts file, as data for its runtime and as files in its
directory (the decisions are pod/dns.py's; this is the I/O around them).

What this module promises:

- `sandbox_config` is what the kubelet puts in a PodSandboxConfig: the kernel hostname (None on
  the node's network) and the DNSConfig of pod/dns.py, recording the kubelet's events
  (MissingClusterDNS on the node and the pod, DNSConfigForming on the pod); it also writes the
  pod's resolv.conf (`<root>/pods/<uid>/resolv.conf`, that DNSConfig as containerd writes it)
  for the backends that bind it themselves, unless the pod sees the node's own file;
- `container_files` is what the kubelet adds to each container (makeMounts): the kubelet's
  `etc-hosts` in the pod's directory, rewritten at each start, bound at /etc/hosts unless the
  container mounts something there, and the path of the pod's resolv.conf (None: the node's).
  On the node's network the hosts file is the node's own after its header and before the
  hostAliases; on a runtime whose pods are all there, bound only when the pod has hostAliases
  (the node's own file is the same but for the header).

A runtime whose pods all share the node's network (the process runtime) is told so:
`all_host_network`, and then each pod is treated as a hostNetwork pod is (ClusterFirst falls
back to Default, ClusterFirstWithHostNet gives the cluster's DNS), as Kubernetes does for pods
on the node's network.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pykubelet.api.model import Pod
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.pod.dns import (
    ETC_HOSTS,
    ETC_RESOLV_CONF,
    ClusterSettings,
    DnsError,
    PodDNS,
    ResolvConf,
    hostname_and_domain,
    kernel_hostname,
    managed_hosts,
    node_hosts,
    parse_resolv_conf,
    pod_dns,
)
from pykubelet.runtime.base import Mount, SandboxConfig

log = logging.getLogger(__name__)

ETC_HOSTS_FILE = "etc-hosts"  # the kubelet's name, in the pod's directory
# How long the node's resolv.conf, once read, serves the sandboxes made after it (the kubelet
# reads it per sandbox; a second keeps a burst to one read and an edit visible at once).
NODE_RESOLVER_TTL = 1.0
RESOLV_CONF_FILE = "resolv.conf"


class PodNetwork:
    def __init__(
        self,
        settings: ClusterSettings,
        recorder: EventRecorder,
        node_name: str,
        pod_dir: Callable[[str], Path],
        *,
        all_host_network: bool = False,
        node_hosts_file: str = ETC_HOSTS,
    ) -> None:
        self._settings = settings
        self._recorder = recorder
        self._node = ObjectRef.node(node_name)
        self._pod_dir = pod_dir
        self._all_host_network = all_host_network
        self._node_hosts_file = node_hosts_file
        # uid -> the pod's resolv.conf written with its sandbox, or None where the pod sees the
        # node's own: each container start binds what its sandbox got (as containerd's file,
        # written once at RunPodSandbox) without a thread hop to look for it again.
        self._resolv_conf: dict[str, str | None] = {}
        self._node_read: tuple[float, ResolvConf | None] | None = None  # (when, what)
        self._node_reading: asyncio.Future[ResolvConf | None] | None = None

    def host_network(self, pod: Pod) -> bool:
        return self._all_host_network or bool(pod.spec.host_network)

    async def sandbox_config(self, pod: Pod) -> SandboxConfig:
        """The pod's sandbox hostname and DNS; DnsError saying why they cannot be formed."""
        node = await self._node_resolver()
        dns = pod_dns(pod, self._settings, node, host_network=self.host_network(pod))
        if dns.nodes_own or not dns.config:
            # No file of its own (the process runtime's pods, hostNetwork pods): no thread hop,
            # but for one that an earlier sandbox of the pod had.
            if self._resolv_conf.get(pod.uid) is not None:
                await asyncio.to_thread(self._write_resolv_conf, pod.uid, dns)
            self._resolv_conf[pod.uid] = None
        else:
            self._resolv_conf[pod.uid] = await asyncio.to_thread(
                self._write_resolv_conf, pod.uid, dns
            )
        ref = ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, pod.uid)
        for event in dns.events:
            self._recorder.record(
                "Warning", event.reason, event.message, self._node if event.on_node else ref
            )
        hostname = None
        if not self.host_network(pod):
            name, domain = hostname_and_domain(pod, self._settings.cluster_domain)
            hostname = kernel_hostname(name, domain, bool(pod.spec.set_hostname_as_fqdn))
        return SandboxConfig(hostname=hostname, dns=dns.config)

    async def _node_resolver(self) -> ResolvConf | None:
        """The node's resolver (--resolv-conf), read again once it is NODE_RESOLVER_TTL old: a
        burst of sandboxes shares one read instead of a thread hop each."""
        if (
            self._node_read is not None
            and time.monotonic() - self._node_read[0] < NODE_RESOLVER_TTL
        ):
            return self._node_read[1]
        if self._node_reading is None:
            self._node_reading = asyncio.ensure_future(asyncio.to_thread(self._read_node_resolver))
            self._node_reading.add_done_callback(self._node_resolver_read)
        # Shielded: one waiter cancelled (a kill cancels a sync) leaves the read to the others.
        return await asyncio.shield(self._node_reading)

    def _node_resolver_read(self, reading: asyncio.Future[ResolvConf | None]) -> None:
        self._node_reading = None
        if not reading.cancelled() and reading.exception() is None:  # a DnsError: read again
            self._node_read = (time.monotonic(), reading.result())

    def forget(self, uid: str) -> None:
        """The pod is gone: what was kept of its sandbox goes too."""
        self._resolv_conf.pop(uid, None)

    async def container_files(
        self, pod: Pod, pod_ip: str | None, mounts: list[Mount]
    ) -> tuple[list[Mount], str | None]:
        """(the mounts to add, the pod's resolv.conf or None) for one container start."""
        targets = {m.container_path.rstrip("/") for m in mounts}
        extra: list[Mount] = []
        if ETC_HOSTS not in targets:
            hosts = await self._hosts_file(pod, pod_ip)
            if hosts is not None:
                extra.append(Mount(hosts, ETC_HOSTS))
        resolv = None
        if ETC_RESOLV_CONF not in targets:
            resolv = await self._resolv_conf_path(pod)
        return extra, resolv

    # --- resolv.conf ----------------------------------------------------------------------------

    def _dns(self, pod: Pod) -> PodDNS:
        node = self._read_node_resolver()
        return pod_dns(pod, self._settings, node, host_network=self.host_network(pod))

    def _read_node_resolver(self) -> ResolvConf | None:
        path = self._settings.resolv_conf
        if not path:
            return None
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(10 << 20)  # the kubelet reads at most 10 MiB
        except OSError as e:
            raise DnsError(f"cannot read --resolv-conf {path}: {e.strerror}") from None
        parsed, problems = parse_resolv_conf(text)
        if problems:
            raise DnsError(f"--resolv-conf {path}: " + "; ".join(problems))
        return parsed

    def _write_resolv_conf(self, uid: str, dns: PodDNS) -> str | None:
        """The pod's own resolv.conf written, or removed where it sees the node's; its path."""
        path = self._pod_dir(uid) / RESOLV_CONF_FILE
        if dns.nodes_own or not dns.config:
            path.unlink(missing_ok=True)
            return None
        _write_in_place(path, dns.config.resolv_conf())
        return str(path)

    async def _resolv_conf_path(self, pod: Pod) -> str | None:
        if pod.uid in self._resolv_conf:
            return self._resolv_conf[pod.uid]
        # A sandbox this agent did not make (adopted after a restart): its file looked for, and
        # written again if it is gone, in one hop.
        path = await asyncio.to_thread(self._existing_resolv_conf, pod)
        self._resolv_conf[pod.uid] = path
        return path

    def _existing_resolv_conf(self, pod: Pod) -> str | None:
        path = self._pod_dir(pod.uid) / RESOLV_CONF_FILE
        if path.is_file():
            return str(path)
        return self._write_resolv_conf(pod.uid, self._dns(pod))

    # --- /etc/hosts -----------------------------------------------------------------------------

    async def _hosts_file(self, pod: Pod, pod_ip: str | None) -> str | None:
        aliases = list(pod.spec.host_aliases or [])
        path = self._pod_dir(pod.uid) / ETC_HOSTS_FILE
        if self.host_network(pod):
            if not aliases and self._all_host_network:
                # Its processes see the node's own file: the same but for the header.
                return None
            content = node_hosts(
                await asyncio.to_thread(_read_text, self._node_hosts_file), aliases
            )
        else:
            if not pod_ip:
                return None  # the kubelet mounts it only for a pod with an IP
            name, domain = hostname_and_domain(pod, self._settings.cluster_domain)
            content = managed_hosts([pod_ip], name, domain, aliases)
        await asyncio.to_thread(_write_in_place, path, content)
        return str(path)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise DnsError(f"cannot read the node's {path}: {e.strerror}") from None


def _write_in_place(path: Path, content: str) -> None:
    """Written in place, as the kubelet writes etc-hosts: a running container's bind of the
    file sees the new content (a rename would leave it on the old file)."""
    data = content.encode()
    # Private, as everything under --root-dir (the pods' directory is volumes.py's too).
    os.makedirs(path.parent.parent, 0o700, exist_ok=True)
    os.makedirs(path.parent, 0o750, exist_ok=True)
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
