"""The service variables, held to the kubelet's rules (pkg/kubelet/envvars FromServices and
kubelet_pods.go getServiceEnvVarMap / makeEnvironmentVariables)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pykubelet.api.decode import decode_pod
from pykubelet.cluster.services import service_from_object
from pykubelet.pod.envvars import (
    SERVICES_NOT_SYNCED,
    ApiObjects,
    NoServices,
    Service,
    ServicePort,
    ServicesNotSynced,
    container_env,
    env_var_name,
    pod_service_env,
    service_env,
    service_variables,
)

KUBERNETES = Service("default", "kubernetes", "10.96.0.1", (ServicePort(443, "https"),))
KUBERNETES_VARS = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
    "KUBERNETES_PORT_443_TCP_PORT": "443",
    "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
}


def test_from_services_as_the_kubelet() -> None:
    """The cases of the kubelet's TestFromServices: an unnamed single port, two named ports of
    one number (UDP first: it is the docker-links `_PORT`), an unnamed first port and a named
    second one, and Services without a ClusterIP giving nothing."""
    services = [
        Service("ns", "foo-bar", "1.2.3.4", (ServicePort(8080, "", "TCP"),)),
        Service(
            "ns",
            "abc-123",
            "5.6.7.8",
            (ServicePort(8081, "u-d-p", "UDP"), ServicePort(8081, "t-c-p", "TCP")),
        ),
        Service("ns", "q-u-u-x", "9.8.7.6", (ServicePort(8082, ""), ServicePort(8083, "8083"))),
        Service("ns", "svrc-clusterip-none", "None", (ServicePort(8082),)),
        Service("ns", "svrc-clusterip-empty", "", (ServicePort(8082),)),
    ]
    assert list(service_variables(services).items()) == [
        ("FOO_BAR_SERVICE_HOST", "1.2.3.4"),
        ("FOO_BAR_SERVICE_PORT", "8080"),
        ("FOO_BAR_PORT", "tcp://1.2.3.4:8080"),
        ("FOO_BAR_PORT_8080_TCP", "tcp://1.2.3.4:8080"),
        ("FOO_BAR_PORT_8080_TCP_PROTO", "tcp"),
        ("FOO_BAR_PORT_8080_TCP_PORT", "8080"),
        ("FOO_BAR_PORT_8080_TCP_ADDR", "1.2.3.4"),
        ("ABC_123_SERVICE_HOST", "5.6.7.8"),
        ("ABC_123_SERVICE_PORT", "8081"),
        ("ABC_123_SERVICE_PORT_U_D_P", "8081"),
        ("ABC_123_SERVICE_PORT_T_C_P", "8081"),
        ("ABC_123_PORT", "udp://5.6.7.8:8081"),
        ("ABC_123_PORT_8081_UDP", "udp://5.6.7.8:8081"),
        ("ABC_123_PORT_8081_UDP_PROTO", "udp"),
        ("ABC_123_PORT_8081_UDP_PORT", "8081"),
        ("ABC_123_PORT_8081_UDP_ADDR", "5.6.7.8"),
        ("ABC_123_PORT_8081_TCP", "tcp://5.6.7.8:8081"),
        ("ABC_123_PORT_8081_TCP_PROTO", "tcp"),
        ("ABC_123_PORT_8081_TCP_PORT", "8081"),
        ("ABC_123_PORT_8081_TCP_ADDR", "5.6.7.8"),
        ("Q_U_U_X_SERVICE_HOST", "9.8.7.6"),
        ("Q_U_U_X_SERVICE_PORT", "8082"),
        ("Q_U_U_X_SERVICE_PORT_8083", "8083"),
        ("Q_U_U_X_PORT", "tcp://9.8.7.6:8082"),
        ("Q_U_U_X_PORT_8082_TCP", "tcp://9.8.7.6:8082"),
        ("Q_U_U_X_PORT_8082_TCP_PROTO", "tcp"),
        ("Q_U_U_X_PORT_8082_TCP_PORT", "8082"),
        ("Q_U_U_X_PORT_8082_TCP_ADDR", "9.8.7.6"),
        ("Q_U_U_X_PORT_8083_TCP", "tcp://9.8.7.6:8083"),
        ("Q_U_U_X_PORT_8083_TCP_PROTO", "tcp"),
        ("Q_U_U_X_PORT_8083_TCP_PORT", "8083"),
        ("Q_U_U_X_PORT_8083_TCP_ADDR", "9.8.7.6"),
    ]


def test_the_kubernetes_service_and_other_protocols_and_families() -> None:
    assert service_variables([KUBERNETES]) == KUBERNETES_VARS
    sctp = Service("ns", "dns", "fd00::a", (ServicePort(53, "dns", "SCTP"),))
    assert service_variables([sctp]) == {
        "DNS_SERVICE_HOST": "fd00::a",
        "DNS_SERVICE_PORT": "53",
        "DNS_SERVICE_PORT_DNS": "53",
        "DNS_PORT": "sctp://[fd00::a]:53",  # Go's net.JoinHostPort brackets an IPv6 address
        "DNS_PORT_53_SCTP": "sctp://[fd00::a]:53",
        "DNS_PORT_53_SCTP_PROTO": "sctp",
        "DNS_PORT_53_SCTP_PORT": "53",
        "DNS_PORT_53_SCTP_ADDR": "fd00::a",
    }
    # An empty protocol is TCP; a Service with a ClusterIP but no port (never served) gives none.
    assert (
        service_variables([Service("n", "a", "1.1.1.1", (ServicePort(1, "", ""),))])[
            "A_PORT_1_TCP_PROTO"
        ]
        == "tcp"
    )
    assert service_variables([Service("n", "a", "1.1.1.1")]) == {}
    assert env_var_name("my-db-1") == "MY_DB_1"


def services() -> list[Service]:
    return [
        KUBERNETES,
        Service("default", "web", "10.96.0.20", (ServicePort(80),)),
        Service(
            "shop", "cart", "10.96.0.30", (ServicePort(80, "http"), ServicePort(53, "dns", "UDP"))
        ),
        Service("shop", "db", "10.96.0.31", (ServicePort(5432),)),
        Service("shop", "headless", "None", (ServicePort(80),)),
        Service("shop", "pending", "", (ServicePort(80),)),
        Service("other", "secret-svc", "10.96.0.40", (ServicePort(80),)),
    ]


def names(env: dict[str, str]) -> set[str]:
    return {name.split("_")[0] for name in env}


def test_a_pod_sees_its_namespace_and_the_master_service() -> None:
    env = service_env(services(), "shop", True)
    assert names(env) == {"KUBERNETES", "CART", "DB"}  # not headless, pending, other's, web
    assert {k: v for k, v in env.items() if k.startswith("KUBERNETES")} == KUBERNETES_VARS
    assert env["CART_SERVICE_PORT"] == "80" and env["CART_SERVICE_PORT_DNS"] == "53"
    assert env["CART_PORT_53_UDP"] == "udp://10.96.0.30:53"
    # A pod of `default` sees the master service once, and default's other Services.
    assert names(service_env(services(), "default", True)) == {"KUBERNETES", "WEB"}


def test_enable_service_links_false_keeps_only_the_master_service() -> None:
    assert service_env(services(), "shop", False) == KUBERNETES_VARS
    assert service_env(services(), "default", False) == KUBERNETES_VARS
    # Without the master service (an API server that has none): nothing at all.
    assert service_env(services()[1:], "shop", False) == {}


def test_a_kubernetes_service_of_the_pods_namespace_replaces_the_masters() -> None:
    own = Service("shop", "kubernetes", "10.96.0.99", (ServicePort(8443),))
    for order in ([KUBERNETES, own], [own, KUBERNETES]):
        assert service_env(order, "shop", True)["KUBERNETES_SERVICE_HOST"] == "10.96.0.99"
        assert service_env(order, "shop", False)["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"


POD = b"""apiVersion: v1
kind: Pod
metadata: {name: p, namespace: shop, uid: u1}
spec:
  containers:
  - name: c
    image: i
    envFrom:
    - configMapRef: {name: settings}
    env:
    - {name: DB_URL, value: "postgres://$(DB_SERVICE_HOST):$(DB_SERVICE_PORT)/app"}
    - {name: CART_SERVICE_HOST, value: cart.example}
    - {name: CART, value: "$(CART_SERVICE_HOST)"}
    - {name: FROM_CM, value: "$(DB_PORT)"}
"""


def test_container_env_explicit_wins_and_expansion_sees_the_services() -> None:
    pod = decode_pod(POD, "p.yaml")
    objects = ApiObjects(config_maps={"settings": {"DB_PORT": "from-the-configmap"}})
    svc = service_env(services(), "shop", True)
    env = container_env(pod, pod.spec.containers[0], "h", "p", objects, services=svc)
    values = dict(env)
    assert len(values) == len(env)  # no name twice
    assert values["DB_URL"] == "postgres://10.96.0.31:5432/app"
    assert values["CART_SERVICE_HOST"] == "cart.example"  # the container's own wins
    assert values["CART"] == "cart.example"  # and expansion sees the container's first
    assert values["DB_PORT"] == "from-the-configmap"  # envFrom wins too
    assert values["FROM_CM"] == "from-the-configmap"
    assert values["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    # The container's variables first, in order, then the remaining service variables.
    own = ["DB_PORT", "DB_URL", "CART_SERVICE_HOST", "CART", "FROM_CM"]
    assert [name for name, _ in env[: len(own)]] == own
    assert {name for name, _ in env[len(own) :]} == set(svc) - set(own)


class Lister:
    def __init__(self, items: Iterable[Service], problem: str | None) -> None:
        self.items = list(items)
        self.problem = problem

    def services(self) -> Iterable[Service]:
        return self.items

    def not_synced(self) -> str | None:
        return self.problem


def test_an_api_pod_waits_for_the_services_a_static_pod_does_not() -> None:
    pod = decode_pod(POD, "p.yaml")
    waiting = Lister([], "the services list failed: 403 Forbidden: services is forbidden")
    with pytest.raises(ServicesNotSynced) as err:
        pod_service_env(pod, waiting, wait=True)
    reason = "the services list failed: 403 Forbidden: services is forbidden"
    assert str(err.value) == f"{SERVICES_NOT_SYNCED} ({reason})"
    assert pod_service_env(pod, waiting, wait=False) == {}
    synced = Lister(services(), None)
    assert names(pod_service_env(pod, synced, wait=True)) == {"KUBERNETES", "CART", "DB"}
    pod.spec.enable_service_links = False
    assert pod_service_env(pod, synced, wait=True) == KUBERNETES_VARS
    # Stand-alone: no Services, never waiting, as a kubelet without a kubeconfig.
    assert pod_service_env(pod, NoServices(), wait=True) == {}


def test_services_as_the_api_serves_them() -> None:
    obj = {
        "metadata": {"name": "cart", "namespace": "shop", "resourceVersion": "7"},
        "spec": {
            "clusterIP": "10.96.0.30",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
            ],
        },
    }
    assert service_from_object(obj) == Service(
        "shop", "cart", "10.96.0.30", (ServicePort(80, "http"), ServicePort(53, "dns", "UDP"))
    )
    assert service_from_object({"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}}) == (
        Service("", "h", "None")
    )
    assert (
        service_from_object({"metadata": {"name": "x"}, "spec": {"ports": [{"port": "80"}]}})
        is None
    )
