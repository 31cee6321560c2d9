"""The pods of the Kubernetes documentation's task pages, adapted to run here, on each runtime.

Each manifest keeps what its page demonstrates (init containers, a volume two containers share,
exec/HTTP/TCP probes, lifecycle hooks, dependent variables, the downward API as env and as a
volume, a memory limit, restart policies, a security context), with busybox commands instead of
nginx or redis images, since no registry is reachable here. All of them run in one agent, and
each is checked by what a user sees: `/pods` and the container logs.

Mount paths are directories that exist on a Debian host (/mnt, /srv, /opt, /media, /var/tmp):
with the process runtime a missing mount point is created on the host.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

from tests.integration.agent import Agent, Backend, container_state, wait_for, write_pod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def doc_pods(forever: str, http_port: int, tcp_port: int) -> dict[str, str]:
    """name -> manifest. `forever` keeps a container running until it is stopped."""
    quoted = forever.replace('"', '\\"')  # inside a double-quoted YAML string
    return {
        # https://kubernetes.io/docs/concepts/workloads/pods/init-containers/ (and
        # .../configure-pod-initialization/): an init container prepares a volume for the app.
        "init-demo": f"""
spec:
  volumes: [{{name: workdir, emptyDir: {{}}}}]
  initContainers:
  - name: install
    image: busybox:test
    command: [sh, -c, "echo 'Installed by the init container' > /mnt/index.html"]
    volumeMounts: [{{name: workdir, mountPath: /mnt}}]
  - name: check
    image: busybox:test
    command: [sh, -c, "test -s /mnt/index.html"]
    volumeMounts: [{{name: workdir, mountPath: /mnt}}]
  containers:
  - name: main
    image: busybox:test
    command: [sh, -c, "cat /srv/index.html; {quoted}"]
    volumeMounts: [{{name: workdir, mountPath: /srv}}]
""",
        # .../configure-pod-container/configure-volume-storage/ and the two-container pod of
        # .../access-application-cluster/communicate-containers-same-pod-shared-volume/
        "two-containers": f"""
spec:
  volumes: [{{name: shared-data, emptyDir: {{}}}}]
  containers:
  - name: writer
    image: busybox:test
    command: [sh, -c, "echo Hello from the writer container > /opt/index.html; {quoted}"]
    volumeMounts: [{{name: shared-data, mountPath: /opt}}]
  - name: reader
    image: busybox:test
    command: [sh, -c, "while ! test -s /srv/index.html; do sleep 0.1; done; cat /srv/index.html; {quoted}"]
    volumeMounts: [{{name: shared-data, mountPath: /srv, readOnly: true}}]
""",
        # .../configure-liveness-readiness-startup-probes/ "liveness-exec"
        "liveness-exec": """
spec:
  volumes: [{name: tmp, emptyDir: {}}]
  containers:
  - name: liveness
    image: busybox:test
    command: [sh, -c, "touch /var/tmp/healthy; sleep 2; rm -f /var/tmp/healthy; sleep 600"]
    volumeMounts: [{name: tmp, mountPath: /var/tmp}]
    livenessProbe:
      exec: {command: [cat, /var/tmp/healthy]}
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 2  # sleep as a container's PID 1 ignores SIGTERM
""",
        # ... "liveness-http": a server whose /healthz starts failing after 3 seconds
        "liveness-http": f"""
spec:
  volumes: [{{name: www, emptyDir: {{}}}}]
  containers:
  - name: liveness
    image: busybox:test
    command:
    - sh
    - -c
    - "echo ok > /srv/healthz; (sleep 3; rm /srv/healthz) & exec busybox httpd -f -p {http_port} -h /srv"
    ports: [{{name: liveness-port, containerPort: {http_port}}}]
    volumeMounts: [{{name: www, mountPath: /srv}}]
    livenessProbe:
      httpGet: {{path: /healthz, port: liveness-port, httpHeaders: [{{name: Custom-Header, value: Awesome}}]}}
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 2
""",
        # ... "tcp-liveness-readiness": ready once something listens on the port
        "tcp-readiness": f"""
spec:
  volumes: [{{name: www, emptyDir: {{}}}}]
  containers:
  - name: server
    image: busybox:test
    command: [sh, -c, "sleep 1; exec busybox httpd -f -p {tcp_port} -h /srv"]
    ports: [{{containerPort: {tcp_port}}}]
    volumeMounts: [{{name: www, mountPath: /srv}}]
    readinessProbe:
      tcpSocket: {{port: {tcp_port}}}
      periodSeconds: 1
    livenessProbe:
      tcpSocket: {{port: {tcp_port}}}
      initialDelaySeconds: 5
      periodSeconds: 2
""",
        # .../attach-handler-lifecycle-event/
        "lifecycle-demo": f"""
spec:
  volumes: [{{name: share, emptyDir: {{}}}}]
  containers:
  - name: lifecycle-demo-container
    image: busybox:test
    command: [sh, -c, "while ! test -s /srv/message; do sleep 0.1; done; cat /srv/message; {quoted}"]
    volumeMounts: [{{name: share, mountPath: /srv}}]
    lifecycle:
      postStart:
        exec: {{command: [sh, -c, "echo Hello from the postStart handler > /srv/message"]}}
      preStop:
        exec: {{command: [sh, -c, "echo stopping > /srv/stopped"]}}
""",
        # .../inject-data-application/define-interdependent-environment-variables/
        "dependent-envars-demo": f"""
spec:
  containers:
  - name: dependent-envars-demo
    image: busybox:test
    command: [sh, -c]
    args:
    - printf UNCHANGED_REFERENCE=$UNCHANGED_REFERENCE'\\n'; printf SERVICE_ADDRESS=$SERVICE_ADDRESS'\\n';printf ESCAPED_REFERENCE=$ESCAPED_REFERENCE'\\n'; {forever}
    env:
    - {{name: SERVICE_PORT, value: "80"}}
    - {{name: SERVICE_IP, value: "172.17.0.1"}}
    - {{name: UNCHANGED_REFERENCE, value: "$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)"}}
    - {{name: PROTOCOL, value: "https"}}
    - {{name: SERVICE_ADDRESS, value: "$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)"}}
    - {{name: ESCAPED_REFERENCE, value: "$$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)"}}
""",
        # .../inject-data-application/environment-variable-expose-pod-information/
        "dapi-envars": f"""
spec:
  containers:
  - name: test-container
    image: busybox:test
    command: [sh, -c, 'echo "$MY_NODE_NAME $MY_POD_NAME $MY_POD_NAMESPACE $MY_CPU_REQUEST $MY_MEM_LIMIT"; {forever}']
    resources:
      requests: {{cpu: 125m, memory: 32Mi}}
      limits: {{cpu: 250m, memory: 64Mi}}
    env:
    - name: MY_NODE_NAME
      valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
    - name: MY_POD_NAME
      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
    - name: MY_POD_NAMESPACE
      valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
    - name: MY_CPU_REQUEST
      valueFrom: {{resourceFieldRef: {{containerName: test-container, resource: requests.cpu, divisor: 1m}}}}
    - name: MY_MEM_LIMIT
      valueFrom: {{resourceFieldRef: {{containerName: test-container, resource: limits.memory, divisor: 1Mi}}}}
""",
        # .../inject-data-application/downward-api-volume-expose-pod-information/
        "kubernetes-downwardapi-volume-example": f"""
metadata:
  labels: {{zone: us-est-coast, cluster: test-cluster1, rack: rack-22}}
  annotations: {{build: two, builder: john-doe}}
spec:
  volumes:
  - name: podinfo
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: annotations, fieldRef: {{fieldPath: "metadata.annotations['builder']"}}}}
      - {{path: cpu_limit, resourceFieldRef: {{containerName: client-container, resource: limits.cpu, divisor: 1m}}}}
  containers:
  - name: client-container
    image: busybox:test
    command: [sh, -c, "cat /media/labels; echo; cat /media/annotations; echo; cat /media/cpu_limit; echo; {quoted}"]
    resources: {{limits: {{cpu: 500m}}}}
    volumeMounts: [{{name: podinfo, mountPath: /media}}]
""",
        # .../assign-memory-resource/ "memory-demo-2": more than its limit, OOMKilled. It
        # sleeps first, as Kubernetes' own OOM e2e test does (kubernetes#116082): containerd
        # 1.6's CRI plugin drops a TaskOOM event that comes before StartContainer has returned
        # (containerd#8180), and the container is then an Error for good, whatever the agent.
        "memory-demo-2": """
spec:
  restartPolicy: Never
  containers:
  - name: memory-demo-2-ctr
    image: busybox:test
    command: [sh, -c, "sleep 1; exec dd if=/dev/zero of=/dev/null bs=200M count=1"]
    resources:
      requests: {memory: 16Mi}
      limits: {memory: 32Mi}
""",
        # The restart policies of .../workloads/pods/pod-lifecycle/: OnFailure retries until
        # it succeeds (the count survives in an emptyDir), Never fails the pod.
        "on-failure": """
spec:
  restartPolicy: OnFailure
  volumes: [{name: state, emptyDir: {}}]
  containers:
  - name: job
    image: busybox:test
    command: [sh, -c, "echo x >> /srv/tries; n=$(wc -l < /srv/tries); echo try $n; test $n -ge 2"]
    volumeMounts: [{name: state, mountPath: /srv}]
""",
        "never": """
spec:
  restartPolicy: Never
  containers:
  - name: job
    image: busybox:test
    command: [sh, -c, "echo failing; exit 3"]
""",
        # .../configure-pod-container/security-context/ "security-context-demo"
        "security-context-demo": f"""
spec:
  securityContext: {{runAsUser: 1000, runAsGroup: 3000, supplementalGroups: [4000]}}
  volumes: [{{name: sec-ctx-vol, emptyDir: {{}}}}]
  containers:
  - name: sec-ctx-demo
    image: busybox:test
    command: [sh, -c, "echo hello > /opt/testfile && echo $(id -u) $(id -g) $(id -G) && {quoted}"]
    volumeMounts: [{{name: sec-ctx-vol, mountPath: /opt}}]
    securityContext: {{runAsNonRoot: true}}
""",
    }


def write_all(directory: Path, pods: dict[str, str]) -> None:
    for name, body in pods.items():
        text = f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n" + body.lstrip("\n")
        if "\nmetadata:\n  labels" in body:  # merge the page's own metadata into ours
            text = "apiVersion: v1\nkind: Pod\n" + body.lstrip("\n").replace(
                "metadata:\n", f"metadata:\n  name: {name}\n", 1
            )
        # The pages' pods leave the grace period at 30 s, and some shells (PID 1 in a
        # container) ignore SIGTERM: a short one keeps the agent's stop at the end quick.
        if "\n  terminationGracePeriodSeconds:" not in text:
            text = re.sub(
                r"^spec:\n",
                "spec:\n  terminationGracePeriodSeconds: 3\n",
                text,
                count=1,
                flags=re.M,
            )
        write_pod(directory, name, text)


def status_of(agent: Agent, name: str, container: str) -> dict[str, Any]:
    pod = agent.pod(name)
    assert pod is not None, f"{name} not listed"
    for key in ("containerStatuses", "initContainerStatuses"):
        for st in pod["status"].get(key) or []:
            if st["name"] == container:
                return st  # type: ignore[no-any-return]
    raise AssertionError(f"{name}: no status for {container}")


def log_of(agent: Agent, name: str, container: str) -> str:
    return wait_for(f"{name}/{container} log", lambda: agent.logs(name, container).strip())  # type: ignore[no-any-return]


GRPC_SERVER = """
import time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(2))
servicer = health.HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
server.add_insecure_port("0.0.0.0:%d")
server.start()
print("serving", flush=True)
time.sleep(3)
servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
time.sleep(600)
"""


def grpc_pod(port: int) -> str:
    """.../configure-liveness-readiness-startup-probes/ "grpc-liveness" (etcd there): a health
    server that stops serving after 3 s. The images here have no gRPC server, so this one is
    Python's (with grpcio), run by the process runtime only."""
    return f"""
spec:
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.5.1-0
    command: [{sys.executable}, -c, {json.dumps(GRPC_SERVER % port)}]
    ports: [{{containerPort: {port}}}]
    livenessProbe:
      grpc: {{port: {port}}}
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 1
"""


def test_the_documentations_pods(start_agent, manifests: Path, backend: Backend) -> None:  # type: ignore[no-untyped-def]
    http_port, tcp_port = free_port(), free_port()
    pods = doc_pods(backend.forever(), http_port, tcp_port)
    if backend.name == "process":
        pods["grpc-liveness"] = grpc_pod(free_port())
    write_all(manifests, pods)
    agent = start_agent(*backend.flags)

    # Init containers ran in order, each to exit 0, and left the volume ready for the app.
    assert log_of(agent, "init-demo", "main") == "Installed by the init container"
    # The status of the sync that started main may come a moment after main's first output.
    init = wait_for(
        "init-demo Initialized",
        lambda: (
            (p := agent.pod("init-demo"))
            and {c["type"]: c["status"] for c in p["status"]["conditions"]}.get("Initialized")
            == "True"
            and p
        ),
    )
    assert [
        s["state"]["terminated"]["exitCode"] for s in init["status"]["initContainerStatuses"]
    ] == [0, 0]

    # Two containers share an emptyDir.
    assert log_of(agent, "two-containers", "reader") == "Hello from the writer container"

    # The exec and HTTP liveness probes fail after a few seconds: the kubelet restarts them.
    for name in ("liveness-exec", "liveness-http"):
        wait_for(
            f"{name} restarted by its liveness probe",
            lambda n=name: status_of(agent, n, "liveness")["restartCount"] >= 1,
            timeout=30,
        )
    assert any(
        e["reason"] == "Unhealthy" and "liveness-exec" in e["involvedObject"]["name"]
        for e in agent.events()
    )
    if backend.name == "process":
        # The gRPC health check: SERVING, then NOT_SERVING restarts the container.
        assert log_of(agent, "grpc-liveness", "etcd") == "serving"
        wait_for(
            "grpc-liveness restarted by its liveness probe",
            lambda: status_of(agent, "grpc-liveness", "etcd")["restartCount"] >= 1,
            timeout=30,
        )

    # TCP readiness: ready once the server listens.
    wait_for("tcp-readiness ready", lambda: status_of(agent, "tcp-readiness", "server")["ready"])

    # The postStart hook ran in the container (its file is in the container's volume).
    assert (
        log_of(agent, "lifecycle-demo", "lifecycle-demo-container")
        == "Hello from the postStart handler"
    )

    # $(VAR) expands from the variables defined before it, and $$ escapes.
    assert log_of(agent, "dependent-envars-demo", "dependent-envars-demo").splitlines() == [
        "UNCHANGED_REFERENCE=$(PROTOCOL)://172.17.0.1:80",
        "SERVICE_ADDRESS=https://172.17.0.1:80",
        "ESCAPED_REFERENCE=$(PROTOCOL)://172.17.0.1:80",
    ]

    # The downward API, as variables and as files.
    node, name, namespace, cpu, memory = log_of(agent, "dapi-envars", "test-container").split()
    assert name.startswith("dapi-envars-") and namespace == "default" and node
    assert (cpu, memory) == ("125", "64")
    assert log_of(agent, "kubernetes-downwardapi-volume-example", "client-container").split(
        "\n"
    ) == ['cluster="test-cluster1"', 'rack="rack-22"', 'zone="us-est-coast"', "john-doe", "500"]

    # More memory than the limit: OOMKilled, and with Never the pod fails.
    pod = wait_for(
        "memory-demo-2 failed",
        lambda: (p := agent.pod("memory-demo-2")) and p["status"]["phase"] == "Failed" and p,
        timeout=30,
    )
    terminated = container_state(pod)["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)

    # Restart policies: OnFailure until it succeeds; Never fails at once.
    done = wait_for(
        "on-failure succeeded",
        lambda: (p := agent.pod("on-failure")) and p["status"]["phase"] == "Succeeded" and p,
        timeout=40,
    )
    assert container_state(done)["restartCount"] == 1
    assert agent.logs("on-failure", "job").strip() == "try 2"
    never = wait_for(
        "never failed",
        lambda: (p := agent.pod("never")) and p["status"]["phase"] == "Failed" and p,
    )
    assert container_state(never)["state"]["terminated"]["exitCode"] == 3
    assert container_state(never)["restartCount"] == 0

    # runAsUser, runAsGroup and supplementalGroups; the emptyDir is writable by that user.
    ids = log_of(agent, "security-context-demo", "sec-ctx-demo").split()
    assert ids[:2] == ["1000", "3000"] and "4000" in ids[2:]
