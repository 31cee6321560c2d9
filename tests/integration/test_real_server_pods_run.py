"""The corpus of pods as a real kube-apiserver 1.32 serves them (tests/data/real_pods/: `kubectl
run`, a Deployment, a DaemonSet, a Job, a StatefulSet, a Helm chart under the restricted
profile) runs on one node per runtime in cluster mode: every pod created at once through the
fixture API server, reported Running and Ready (the Job Succeeded) there, its service-account
token volume mounted where the pod's containers read it, and what a runtime cannot do refused
naming the field of the object as served (the StatefulSet's persistentVolumeClaim everywhere).

Each object is created as the file holds it (security contexts, the `kube-api-access-xxxxx`
volume and its mounts, tolerations, affinity, probes, env, ports, hostNetwork, volumes, ...)
without the fields the server sets on create (uid, resourceVersion, creationTimestamp, status).
What this machine cannot give is substituted, nothing else:
- `image`: busybox:test (nginx, podinfo, perl and node-exporter cannot be pulled here: there is
  no registry), so `command` too, since the images' programs are not in it. Every command first
  prints what the pod sees of its token volume (`namespace`, the first line of `ca.crt`, the
  token's length), the `kubernetes` Service's variables, its resolver's first nameserver and
  its cgroup's memory limit, then stays up, trapping SIGTERM as a server does (no
  terminationGracePeriodSeconds is patched);
- the probes are kept as served and made to pass: where nginx would serve `/` on 80 (the
  Deployment's readinessProbe) and podinfo `/healthz` on its `http` port 9898 (the chart's
  livenessProbe), `busybox httpd -f -vv` serves the path, and its log shows the kubelet's
  probe requests answered 200. podinfo's writable place stays its `data` emptyDir (its root
  file system is read-only, its user 65534, its group the pod's fsGroup). pykubelet probes a
  container as soon as it has started, so a first probe may come before httpd listens (a
  `Readiness/Liveness probe failed` event): the next, periodSeconds (10) later, passes;
- the DaemonSet's node-exporter (`args: [--path.rootfs=/host]` kept, `$0` to the shell) checks
  that its read-only hostPath `/` is the host's root, then sleeps (it does not listen on its
  hostPort 9100: the runtimes' tests run side by side on the host network);
- the Job's `perl -e 'print 1'` is `printf 1` (exit 0);
- `nodeName` node-2 (the Job's, the StatefulSet's) is node-1, the one node here; the DaemonSet's
  node affinity already names node-1.
The node has `--cluster-dns` and `--cluster-domain` as kubeadm sets a kubelet up, and
pykubelet's `--allowed-host-paths /` for node-exporter's hostPath (without it that pod is refused
with `HostPathNotAllowed` naming `spec.volumes[0].hostPath.path`).

On the process runtime the same objects run as host processes (the image recorded, never
pulled: the commands are the host's `/bin/sh`, `busybox`, `sleep`), on the node's network, each
container in a mount namespace of its own with its token volume (and node-exporter's `/host`)
bound in: four pods run; the chart's waits in CreateContainerConfigError naming
`securityContext.seccompProfile` (there is no seccomp filter for host processes); the
StatefulSet's is refused as on the others. There the Deployment's httpd listens on the host's
port 80 and serves a directory it makes in the host's /tmp and removes on SIGTERM, and the mount
point /host the runtime creates on the host is removed afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, Backend, wait_for
from tests.integration.test_cluster import KubeClient, apiserver  # noqa: F401

Obj = dict[str, Any]

CORPUS = Path(__file__).parent.parent / "data" / "real_pods"
NODE = "node-1"
IMAGE = "busybox:test"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _stay_up(cleanup: str = "") -> str:
    """A server's way to stay up as PID 1 of a container: SIGTERM ends it at once."""
    return f"trap '{cleanup}exit 0' TERM; while :; do sleep 1 & wait; done"


STAY_UP = _stay_up()
SHOW = (
    f"echo namespace $(cat {TOKEN_DIR}/namespace); "
    f"echo ca $(head -n 1 {TOKEN_DIR}/ca.crt); "
    f"echo token $(wc -c < {TOKEN_DIR}/token); "
    # The kubernetes Service's variables (cluster mode), the resolver dnsPolicy gave, and the
    # memory limit as the container's cgroup holds it.
    "echo service ${KUBERNETES_SERVICE_HOST:+host}:${KUBERNETES_SERVICE_PORT:-none}; "
    "echo dns $(grep ^nameserver /etc/resolv.conf | head -n 1); "
    "echo memory $(cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes "
    "2>/dev/null | head -n 1); "
)


def _serve(parent: str, port: int, path: str) -> str:
    """busybox's httpd answering `path` with 200 on `port`, from a new directory in `parent`,
    in the background, its log (each request and its response code) in the container's."""
    return (
        f"www=$(mktemp -d -p {parent}) && echo ok > $www/{path.strip('/') or 'index.html'} && "
        f"{{ busybox httpd -f -vv -p {port} -h $www & }}; "
    )


# By file: the command that replaces the image's program (see the module's docstring).
COMMANDS = {
    "kubectl-run.yaml": SHOW + STAY_UP,
    # On the process runtime /tmp is the host's: the directory goes with the server.
    "deployment.yaml": _serve("/tmp", 80, "/") + SHOW + _stay_up('rm -rf "$www"; '),
    "restricted-chart.yaml": _serve("/data", 9898, "/healthz")
    + "echo pod $POD_NAME; echo user $(id -u) $(id -G); "
    + "touch /root-fs 2>/dev/null || echo root-read-only; "
    + "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
    + SHOW
    + STAY_UP,
    "daemonset.yaml": 'echo "args $0"; test -d "${0#--path.rootfs=}/proc/1" && '
    "echo host-root-mounted; "
    "echo host-mount $(grep ' /host ' /proc/mounts | head -n 1 | cut -d' ' -f4 | cut -d, -f1); "
    + SHOW
    + STAY_UP,
    "job.yaml": SHOW + "printf 1",
    "statefulset.yaml": STAY_UP,  # never run: refused for its persistentVolumeClaim
}
# What the node refuses, by file: the field of the object as served, in the pod's status.
REFUSED = {"statefulset.yaml": "spec.volumes[0].persistentVolumeClaim"}
SUCCEEDS = {"job.yaml"}
# What the process runtime cannot do, by file: the container waits naming the field.
NOT_ON_PROCESSES = {
    "restricted-chart.yaml": "securityContext.seccompProfile: RuntimeDefault is not supported"
}
# The corpus's memory limits, in bytes.
MEBI = {"64Mi": 64 << 20, "128Mi": 128 << 20, "256Mi": 256 << 20}
# /proc/self/status under the restricted profile.
PROFILE = {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}


def corpus_pod(name: str) -> Obj:
    """The corpus pod as a client would create it again: the server's own fields left out,
    the image and program substituted."""
    pod: Obj = yaml.safe_load((CORPUS / name).read_text())
    for server_set in ("uid", "resourceVersion", "creationTimestamp"):
        pod["metadata"].pop(server_set, None)
    pod.pop("status", None)
    pod["spec"]["nodeName"] = NODE
    (container,) = pod["spec"]["containers"]
    container["image"] = IMAGE
    container["command"] = ["/bin/sh", "-c", COMMANDS[name]]
    return pod


def _ready(pod: Obj | None) -> bool:
    if pod is None or pod.get("status", {}).get("phase") != "Running":
        return False
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
    return conditions.get("Ready") == "True"


def _waiting(pod: Obj | None) -> Obj:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    waiting: Obj = (statuses[0].get("state") or {}).get("waiting") or {}
    return waiting


def _phase(pod: Obj | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase", ""))


def test_the_corpus_runs_on_one_node(
    apiserver: ApiServer,  # noqa: F811
    tmp_path: Path,
    backend: Backend,
    start_agent: Callable[..., Agent],
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    client = KubeClient(kubeconfig)
    files = sorted(p.name for p in CORPUS.glob("*.yaml"))
    assert set(files) == set(COMMANDS), "a corpus pod without its substitution here"
    served: dict[str, Obj] = {}
    for name in files:
        body = corpus_pod(name)
        served[name] = client.create_pod(body, body["metadata"]["namespace"])
        # The object as served: the fixture adds no second token volume, drops nothing.
        assert served[name]["spec"]["volumes"] == body["spec"]["volumes"], name
        assert served[name]["spec"]["tolerations"] == body["spec"]["tolerations"], name
    # The process runtime binds node-exporter's /host on a mount point it creates on the host.
    made_host = backend.engine is None and not Path("/host").exists()
    agent = start_agent(
        *backend.flags,
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        NODE,
        "--cluster-dns",
        "10.96.0.10",
        "--cluster-domain",
        "cluster.local",
        "--allowed-host-paths",
        "/",
    )
    try:
        _check_the_corpus(apiserver, client, agent, served, backend)
    finally:
        if made_host:
            agent.stop()
            with contextlib.suppress(OSError):
                Path("/host").rmdir()


def _check_the_corpus(
    apiserver: ApiServer,  # noqa: F811
    client: KubeClient,
    agent: Agent,
    served: dict[str, Obj],
    backend: Backend,
) -> None:
    # What the runtime refuses to start, by file: the field it names, in the waiting reason.
    waits = {} if backend.engine is not None else NOT_ON_PROCESSES
    files = sorted(served)

    def current(name: str) -> Obj | None:
        meta = served[name]["metadata"]
        return client.pod(meta["name"], meta["namespace"])

    def outcome(name: str) -> bool:
        pod = current(name)
        if name in REFUSED:
            return _phase(pod) == "Failed"
        if name in waits:
            return _waiting(pod).get("reason") == "CreateContainerConfigError"
        if name in SUCCEEDS:
            return _phase(pod) == "Succeeded"
        return _ready(pod)

    def all_settled() -> bool:
        phases = {n: _phase(current(n)) for n in files if not outcome(n)}
        assert not phases, phases
        return True

    wait_for(
        "every corpus pod Ready (the Job Succeeded, the StatefulSet's refused)",
        all_settled,
        timeout=60,
    )

    def log(name: str) -> str:
        meta = served[name]["metadata"]
        container = served[name]["spec"]["containers"][0]["name"]
        status, body = agent.get(f"/containerLogs/{meta['namespace']}/{meta['name']}/{container}")
        return body.decode() if status == 200 else ""

    issued = {
        c["kubernetes.io"]["pod"]["uid"]
        for c in apiserver.issued_tokens()
        if c["kubernetes.io"].get("pod")
    }
    for name in files:
        pod = current(name)
        assert pod is not None
        meta = pod["metadata"]
        if name in REFUSED:
            message = pod["status"]["message"]
            assert REFUSED[name] in message and "not supported" in message, message
            continue
        if name in waits:
            message = _waiting(pod)["message"]
            assert waits[name] in message, message
            continue
        out = wait_for(f"{name}: its output", lambda n=name: "token" in log(n) and log(n))
        # The token volume as the containers see it: the pod's namespace, the cluster's CA, a
        # token the API server issued bound to this pod.
        assert f"namespace {meta['namespace']}\n" in out, (name, out)
        assert "ca -----BEGIN CERTIFICATE-----\n" in out, (name, out)
        assert "token 0\n" not in out, (name, out)
        assert "service host:443\n" in out, (name, out)
        assert meta["uid"] in issued, name
        # ClusterFirst, ClusterFirstWithHostNet: the cluster's DNS; on the process runtime
        # (the node's network) ClusterFirst is Default, as for a hostNetwork pod.
        host_network = backend.engine is None or pod["spec"].get("hostNetwork")
        cluster_dns = pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet" or not host_network
        assert ("dns nameserver 10.96.0.10\n" in out) == cluster_dns, (name, out)
        limit = pod["spec"]["containers"][0]["resources"].get("limits", {}).get("memory")
        if limit is not None and backend.engine is not None:
            assert f"memory {MEBI[limit]}\n" in out, (name, out)
        (state,) = pod["status"]["containerStatuses"]
        assert state["restartCount"] == 0, (name, state)
        if name in SUCCEEDS:
            assert state["state"]["terminated"]["exitCode"] == 0, state
            assert out.endswith("1"), out
        else:
            assert state["ready"] and "running" in state["state"], state

    events = [
        e
        for e in client.events("default")
        if e["reason"] == "FailedValidation"
        and e["involvedObject"].get("name") == served["statefulset.yaml"]["metadata"]["name"]
    ]
    assert events and "spec.volumes[0].persistentVolumeClaim" in events[0]["message"], events

    # The probes as served, answered: nginx's readinessProbe on /, podinfo's livenessProbe on
    # /healthz through its named port.
    deployment = log("deployment.yaml")
    assert "url:/\n" in deployment and "response:200" in deployment, deployment
    daemon = log("daemonset.yaml")
    assert "args --path.rootfs=/host\nhost-root-mounted\nhost-mount ro\n" in daemon, daemon
    if "restricted-chart.yaml" in waits:
        return
    chart = wait_for(
        "podinfo's liveness probe answered",
        lambda: "url:/healthz" in log("restricted-chart.yaml") and log("restricted-chart.yaml"),
    )
    assert "response:200" in chart, chart
    assert f"pod {served['restricted-chart.yaml']['metadata']['name']}\n" in chart, chart
    # runAsUser; the image's group (busybox:test names no user: 0), the fsGroup supplemental.
    assert "user 65534 0 65534\n" in chart, chart
    # The restricted profile, enforced: readOnlyRootFilesystem, capabilities drop ALL,
    # allowPrivilegeEscalation false, seccompProfile RuntimeDefault.
    assert "root-read-only\n" in chart, chart
    profile = [line.split() for line in chart.splitlines() if line.split(":")[0] in PROFILE]
    assert dict((k.rstrip(":"), v) for k, v in profile) == PROFILE, chart
