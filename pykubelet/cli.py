"""The `pykubelet` command: kubelet flag names, Go-style durations, one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pykubelet import __version__
from pykubelet.options import RUNTIMES, Options, default_node_name, parse_duration

log = logging.getLogger("pykubelet")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line a script can show, not argparse's usage dump.
        self.exit(2, f"pykubelet: error: {message} (see pykubelet --help)\n")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: must be 0-65535")
    return value


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no"}:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}: use true or false")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pykubelet",
        description="Run Kubernetes pods on this machine from manifest files, the way the "
        "kubelet does.",
    )
    p.add_argument(
        "--node-name",
        "--hostname-override",
        dest="node_name",
        default=None,
        help="this node's name; static pods are named <pod>-<node> (default: the hostname)",
    )
    p.add_argument(
        "--pod-manifest-path",
        type=Path,
        help="a manifest file, or a directory of them (*.yaml, *.yml, *.json): static pods",
    )
    p.add_argument(
        "--file-check-frequency",
        type=_duration,
        default=20.0,
        metavar="DURATION",
        help="how often to re-list the manifest path besides inotify (default 20s)",
    )
    p.add_argument(
        "--root-dir",
        type=Path,
        default=Path("/var/lib/pykubelet"),
        help="where pod state and container logs are kept (default /var/lib/pykubelet)",
    )
    p.add_argument(
        "--container-runtime",
        default="process",
        choices=RUNTIMES,
        help="the backend that runs containers (default process: host processes)",
    )
    p.add_argument(
        "--address", default="127.0.0.1", help="address of the read-only API (default 127.0.0.1)"
    )
    p.add_argument(
        "--read-only-port",
        type=_port,
        default=10255,
        help="port of the read-only API; 0 picks a free one and logs it (default 10255)",
    )
    p.add_argument(
        "--sync-frequency",
        type=_duration,
        default=60.0,
        metavar="DURATION",
        help="how often a running pod is re-synced (default 1m)",
    )
    p.add_argument("--node-ip", default=None, help="the IP reported as hostIP (default: detected)")
    p.add_argument(
        "--keep-pods-on-exit",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="leave pods running when the agent stops (a restarted agent adopts them); "
        "by default SIGTERM/SIGINT stop every pod cleanly first",
    )
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=0, help="log verbosity (0-10)")
    p.add_argument("--version", action="version", version=f"pykubelet {__version__}")
    return p


def parse_options(argv: Sequence[str]) -> Options:
    parser = build_parser()
    ns = parser.parse_args(argv)
    opts = Options(
        node_name=ns.node_name or default_node_name(),
        pod_manifest_path=ns.pod_manifest_path,
        file_check_frequency=ns.file_check_frequency,
        root_dir=ns.root_dir,
        container_runtime=ns.container_runtime,
        address=ns.address,
        read_only_port=ns.read_only_port,
        sync_frequency=ns.sync_frequency,
        node_ip=ns.node_ip,
        keep_pods_on_exit=ns.keep_pods_on_exit,
        verbosity=ns.verbosity,
    )
    problems = opts.validate()
    if problems:
        parser.error(problems[0])
    return opts


def _setup_logging(verbosity: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbosity >= 4 else logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def raise_open_file_limit() -> None:
    """Each running container holds a pidfd: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def detect_host_ip() -> str:
    """The first non-loopback IPv4 address of the hostname, else 127.0.0.1."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return "127.0.0.1"
    for *_, sockaddr in infos:
        ip = str(sockaddr[0])
        if not ip.startswith("127."):
            return ip
    return "127.0.0.1"


async def run_agent(opts: Options) -> int:
    from pykubelet.kubelet import Kubelet
    from pykubelet.runtime.process import ProcessRuntime

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host_ip = opts.node_ip if opts.node_ip else await asyncio.to_thread(detect_host_ip)
    try:
        opts.root_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        log.error("--root-dir %s: %s", opts.root_dir, exc.strerror)
        return 1
    runtime = ProcessRuntime(opts.root_dir, node_ip=host_ip)
    kubelet = Kubelet(opts, runtime, host_ip)
    log.info(
        "pykubelet %s starting: node %s, runtime %s", __version__, opts.node_name, runtime.name
    )
    try:
        await kubelet.run(stop)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    log.info("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["version"]:
        print(f"pykubelet {__version__}")
        return 0
    opts = parse_options(args)
    _setup_logging(opts.verbosity)
    raise_open_file_limit()
    return asyncio.run(run_agent(opts))


if __name__ == "__main__":
    raise SystemExit(main())
