"""The v1 Pod model: the subset of the Kubernetes API the agent understands.

Every model forbids unknown fields, so a typo or a field we do not implement is an error with its
path instead of being silently ignored. Field names are the API's camelCase names (aliases); the
Python attributes are snake_case.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=False,
    )

    def to_api(self, exclude: set[str] | None = None) -> dict[str, Any]:
        """The object as the API server would serialise it (camelCase, no nulls), without the
        fields named in `exclude` (by their Python names)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json", exclude=exclude)


class OwnerReference(ApiModel):
    model_config = ConfigDict(extra="allow")
    api_version: str
    kind: str
    name: str
    uid: str


class ObjectMeta(ApiModel):
    name: str = ""
    generate_name: str | None = None
    namespace: str = ""
    uid: str = ""
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None


class ObjectFieldSelector(ApiModel):
    api_version: str | None = None
    field_path: str


class ResourceFieldSelector(ApiModel):
    container_name: str | None = None
    resource: str
    divisor: str | int | float | None = None


class ConfigMapKeySelector(ApiModel):
    name: str = ""
    key: str
    optional: bool | None = None


class SecretKeySelector(ApiModel):
    name: str = ""
    key: str
    optional: bool | None = None


class EnvVarSource(ApiModel):
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    config_map_key_ref: ConfigMapKeySelector | None = None
    secret_key_ref: SecretKeySelector | None = None

    def sources(self) -> list[object]:
        found = (self.field_ref, self.resource_field_ref, self.config_map_key_ref)
        return [s for s in (*found, self.secret_key_ref) if s is not None]


class EnvVar(ApiModel):
    name: str
    value: str | None = None
    value_from: EnvVarSource | None = None


class LocalObjectReference(ApiModel):
    name: str = ""
    optional: bool | None = None


class ImagePullSecretReference(ApiModel):
    """An entry of spec.imagePullSecrets (a LocalObjectReference: a Secret of the pod's
    namespace); an empty name is allowed and ignored, as the API server and kubelet do."""

    name: str = ""


class EnvFromSource(ApiModel):
    prefix: str | None = None
    config_map_ref: LocalObjectReference | None = None
    secret_ref: LocalObjectReference | None = None


class VolumeMount(ApiModel):
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str | None = None


class Capabilities(ApiModel):
    """Linux capabilities added to or dropped from the runtime's default set (names as the
    API takes them: "NET_ADMIN", "CAP_NET_ADMIN" or "ALL")."""

    add: list[str] | None = None
    drop: list[str] | None = None


class SeccompProfile(ApiModel):
    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    # Relative to the kubelet's <root-dir>/seccomp; only with type Localhost.
    localhost_profile: str | None = None


class Sysctl(ApiModel):
    name: str
    value: str


class SecurityContext(ApiModel):
    """A container's securityContext: the fields pykubelet implements."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    read_only_root_filesystem: bool | None = None
    privileged: bool | None = None
    allow_privilege_escalation: bool | None = None
    capabilities: Capabilities | None = None
    seccomp_profile: SeccompProfile | None = None
    proc_mount: Literal["Default", "Unmasked"] | None = None


Protocol = Literal["TCP", "UDP", "SCTP"]


class ContainerPort(ApiModel):
    name: str | None = None
    container_port: int
    host_port: int | None = None
    host_ip: str | None = Field(default=None, alias="hostIP")
    protocol: Protocol = "TCP"


class ResourceRequirements(ApiModel):
    limits: dict[str, str | int | float] = Field(default_factory=dict)
    requests: dict[str, str | int | float] = Field(default_factory=dict)


class ExecAction(ApiModel):
    command: list[str] = Field(default_factory=list)


class HTTPHeader(ApiModel):
    name: str
    value: str


class HTTPGetAction(ApiModel):
    path: str = "/"
    port: int | str
    host: str | None = None
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    http_headers: list[HTTPHeader] = Field(default_factory=list)


class TCPSocketAction(ApiModel):
    port: int | str
    host: str | None = None


class GRPCAction(ApiModel):
    port: int
    service: str | None = None


class SleepAction(ApiModel):
    seconds: int


class Probe(ApiModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    tcp_socket: TCPSocketAction | None = None
    grpc: GRPCAction | None = None
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace_period_seconds: int | None = None

    def handler(self) -> ExecAction | HTTPGetAction | TCPSocketAction | GRPCAction | None:
        return self.exec or self.http_get or self.tcp_socket or self.grpc


class LifecycleHandler(ApiModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    sleep: SleepAction | None = None

    def handler(self) -> ExecAction | HTTPGetAction | SleepAction | None:
        return self.exec or self.http_get or self.sleep


class Lifecycle(ApiModel):
    post_start: LifecycleHandler | None = None
    pre_stop: LifecycleHandler | None = None


class Container(ApiModel):
    name: str = ""
    image: str = ""
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    working_dir: str | None = None
    env: list[EnvVar] = Field(default_factory=list)
    # New fields default to None, not []: to_api() of a manifest that does not use them, and
    # so its static UID and container hashes, stay what earlier versions computed.
    env_from: list[EnvFromSource] | None = None
    volume_mounts: list[VolumeMount] | None = None
    security_context: SecurityContext | None = None
    ports: list[ContainerPort] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    termination_message_path: str | None = None
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] | None = None
    # Only init containers may set it, and only to Always (a sidecar).
    restart_policy: Literal["Always"] | None = None
    stdin: bool | None = None
    stdin_once: bool | None = None
    tty: bool | None = None
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    lifecycle: Lifecycle | None = None

    def probes(self) -> dict[str, Probe]:
        found = {
            "liveness": self.liveness_probe,
            "readiness": self.readiness_probe,
            "startup": self.startup_probe,
        }
        return {kind: probe for kind, probe in found.items() if probe is not None}


class EphemeralContainer(Container):
    """A debugging container added to a running pod (`kubectl debug`): the container's fields
    (the API server allows only some of them) and the container whose processes it targets."""

    target_container_name: str | None = None
    # Why pykubelet cannot run it (a field it does not support), set by the decoder: the pod
    # runs on and this container's status says why, instead of the whole pod being refused.
    _refusal: str | None = PrivateAttr(default=None)

    def refusal(self) -> str | None:
        return self._refusal

    def refuse(self, reason: str) -> None:
        self._refusal = reason


RestartPolicy = Literal["Always", "OnFailure", "Never"]


class PodSecurityContext(ApiModel):
    """The pod-wide securityContext: defaults for every container's own."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    supplemental_groups: list[int] | None = None
    fs_group: int | None = None
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = None
    seccomp_profile: SeccompProfile | None = None
    sysctls: list[Sysctl] | None = None


class KeyToPath(ApiModel):
    key: str
    path: str
    mode: int | None = None


class EmptyDirVolumeSource(ApiModel):
    medium: Literal["", "Memory"] = ""
    size_limit: str | int | float | None = None


HostPathType = Literal[
    "", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
    "BlockDevice",
]  # fmt: skip


class HostPathVolumeSource(ApiModel):
    path: str
    type: HostPathType | None = None


class ConfigMapVolumeSource(ApiModel):
    name: str = ""
    items: list[KeyToPath] | None = None
    default_mode: int | None = None
    optional: bool | None = None


class SecretVolumeSource(ApiModel):
    secret_name: str = ""
    items: list[KeyToPath] | None = None
    default_mode: int | None = None
    optional: bool | None = None


class DownwardAPIVolumeFile(ApiModel):
    path: str
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    mode: int | None = None


class DownwardAPIVolumeSource(ApiModel):
    items: list[DownwardAPIVolumeFile] = Field(default_factory=list)
    default_mode: int | None = None


class ConfigMapProjection(ApiModel):
    name: str = ""
    items: list[KeyToPath] | None = None
    optional: bool | None = None


class SecretProjection(ApiModel):
    name: str = ""
    items: list[KeyToPath] | None = None
    optional: bool | None = None


class DownwardAPIProjection(ApiModel):
    items: list[DownwardAPIVolumeFile] = Field(default_factory=list)


class ServiceAccountTokenProjection(ApiModel):
    audience: str | None = None
    expiration_seconds: int | None = None  # the API's default: 3600
    path: str


class ClusterTrustBundleProjection(ApiModel):
    # Accepted to be refused by validation with its reason, not as an unknown field.
    model_config = ConfigDict(extra="allow")


class VolumeProjection(ApiModel):
    config_map: ConfigMapProjection | None = None
    secret: SecretProjection | None = None
    downward_api: DownwardAPIProjection | None = Field(default=None, alias="downwardAPI")
    service_account_token: ServiceAccountTokenProjection | None = None
    cluster_trust_bundle: ClusterTrustBundleProjection | None = None

    def sources(self) -> list[ApiModel]:
        found = (
            self.config_map,
            self.secret,
            self.downward_api,
            self.service_account_token,
            self.cluster_trust_bundle,
        )
        return [s for s in found if s is not None]


class ProjectedVolumeSource(ApiModel):
    sources: list[VolumeProjection] = Field(default_factory=list)
    default_mode: int | None = None


class Volume(ApiModel):
    name: str
    empty_dir: EmptyDirVolumeSource | None = None
    host_path: HostPathVolumeSource | None = None
    config_map: ConfigMapVolumeSource | None = None
    secret: SecretVolumeSource | None = None
    downward_api: DownwardAPIVolumeSource | None = Field(default=None, alias="downwardAPI")
    projected: ProjectedVolumeSource | None = None

    def sources(self) -> list[ApiModel]:
        found = (
            self.empty_dir,
            self.host_path,
            self.config_map,
            self.secret,
            self.downward_api,
            self.projected,
        )
        return [s for s in found if s is not None]


class PodOS(ApiModel):
    name: str


class PodReadinessGate(ApiModel):
    condition_type: str


class PodDNSConfigOption(ApiModel):
    name: str = ""
    value: str | None = None


class PodDNSConfig(ApiModel):
    nameservers: list[str] | None = None
    searches: list[str] | None = None
    options: list[PodDNSConfigOption] | None = None


class HostAlias(ApiModel):
    ip: str = ""
    hostnames: list[str] | None = None


class PodSpec(ApiModel):
    containers: list[Container] = Field(default_factory=list)
    init_containers: list[Container] = Field(default_factory=list)
    # Only the API server adds them (the pods/ephemeralcontainers subresource); None, not [],
    # so that to_api() of a pod without them stays what it was.
    ephemeral_containers: list[EphemeralContainer] | None = None
    restart_policy: RestartPolicy = "Always"
    termination_grace_period_seconds: int = 30
    active_deadline_seconds: int | None = None
    node_name: str = ""
    host_network: bool | None = None
    dns_policy: str | None = None
    scheduler_name: str | None = None
    service_account_name: str | None = None
    service_account: str | None = None
    # The API server's ServiceAccount admission reads it (whether to add the token volume); the
    # kubelet mounts what the spec holds either way.
    automount_service_account_token: bool | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    enable_service_links: bool | None = None
    hostname: str | None = None
    subdomain: str | None = None
    set_hostname_as_fqdn: bool | None = Field(default=None, alias="setHostnameAsFQDN")
    dns_config: PodDNSConfig | None = None
    host_aliases: list[HostAlias] | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None
    security_context: PodSecurityContext | None = None
    volumes: list[Volume] | None = None
    readiness_gates: list[PodReadinessGate] | None = None
    # The scheduler's: kept as served, ignored by the node (as by the kubelet).
    preemption_policy: str | None = None
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: list[dict[str, Any]] | None = None
    scheduling_gates: list[dict[str, Any]] | None = None
    os: PodOS | None = None
    image_pull_secrets: list[ImagePullSecretReference] | None = None


# --- status -------------------------------------------------------------------------------------


class StatusModel(ApiModel):
    # Status is written by agents, not users: tolerate fields from newer API servers.
    model_config = ConfigDict(extra="ignore")


class ContainerStateWaiting(StatusModel):
    reason: str | None = None
    message: str | None = None


class ContainerStateRunning(StatusModel):
    started_at: datetime | None = None


class ContainerStateTerminated(StatusModel):
    exit_code: int
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    container_id: str | None = Field(default=None, alias="containerID")


class ContainerState(StatusModel):
    waiting: ContainerStateWaiting | None = None
    running: ContainerStateRunning | None = None
    terminated: ContainerStateTerminated | None = None


class ContainerStatus(StatusModel):
    name: str
    state: ContainerState = Field(default_factory=ContainerState)
    last_state: ContainerState = Field(default_factory=ContainerState)
    ready: bool = False
    started: bool | None = None
    restart_count: int = 0
    image: str = ""
    image_id: str = Field(default="", alias="imageID")
    container_id: str | None = Field(default=None, alias="containerID")


class PodCondition(StatusModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    last_probe_time: datetime | None = None
    last_transition_time: datetime | None = None
    reason: str | None = None
    message: str | None = None


class PodIP(StatusModel):
    ip: str


class PodStatus(StatusModel):
    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"] | None = None
    conditions: list[PodCondition] = Field(default_factory=list)
    message: str | None = None
    reason: str | None = None
    host_ip: str | None = Field(default=None, alias="hostIP")
    pod_ip: str | None = Field(default=None, alias="podIP")
    pod_ips: list[PodIP] | None = Field(default=None, alias="podIPs")
    host_ips: list[PodIP] | None = Field(default=None, alias="hostIPs")
    start_time: datetime | None = None
    init_container_statuses: list[ContainerStatus] | None = None
    container_statuses: list[ContainerStatus] | None = None
    ephemeral_container_statuses: list[ContainerStatus] | None = None
    qos_class: str | None = None


class Pod(ApiModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["Pod"] = "Pod"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def full_name(self) -> str:
        """`name_namespace`, the kubelet's key for "the same pod" across UIDs."""
        return f"{self.metadata.name}_{self.metadata.namespace}"

    @property
    def key(self) -> str:
        """`namespace/name`, as users and kubectl write it."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def all_containers(self) -> list[Container]:
        """Init, regular and ephemeral containers (the kubelet's AllContainers)."""
        return [*self.spec.init_containers, *self.spec.containers, *self.ephemeral_containers()]

    def ephemeral_containers(self) -> list[EphemeralContainer]:
        return list(self.spec.ephemeral_containers or [])
