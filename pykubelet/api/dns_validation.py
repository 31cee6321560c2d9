"""The API server's checks of a pod's DNS and host fields: dnsPolicy, dnsConfig, hostname,
subdomain and hostAliases (pkg/apis/core/validation: validateDNSPolicy, validatePodDNSConfig,
ValidateHostAliases), with its limits and its words, each error naming its field.
"""

from __future__ import annotations

import ipaddress

from pykubelet.api.errors import FieldError
from pykubelet.api.model import PodSpec
from pykubelet.api.validation import dns_label_error, dns_subdomain_error

DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
# The API server's limits (ExpandedDNSConfig, GA since 1.28); the kubelet cuts to the same.
MAX_DNS_NAMESERVERS = 3
MAX_DNS_SEARCH_PATHS = 32
MAX_DNS_SEARCH_LIST_CHARS = 2048
INVALID_IP = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"


def valid_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def validate_pod_dns(spec: PodSpec) -> list[FieldError]:
    errors: list[FieldError] = []
    policy = spec.dns_policy
    if policy and policy not in DNS_POLICIES:
        supported = ", ".join(f'"{p}"' for p in DNS_POLICIES)
        errors.append(
            FieldError(
                "spec.dnsPolicy",
                f'Unsupported value: "{policy}": supported values: {supported}',
            )
        )
    errors.extend(_dns_config_errors(spec))
    for name, value in (("hostname", spec.hostname), ("subdomain", spec.subdomain)):
        if value and (err := dns_label_error(value)):
            errors.append(FieldError(f"spec.{name}", err))
    for i, alias in enumerate(spec.host_aliases or []):
        where = f"spec.hostAliases[{i}]"
        if not valid_ip(alias.ip):
            errors.append(FieldError(f"{where}.ip", f"invalid value {alias.ip!r}: {INVALID_IP}"))
        for j, hostname in enumerate(alias.hostnames or []):
            if err := dns_subdomain_error(hostname):
                errors.append(FieldError(f"{where}.hostnames[{j}]", err))
    return errors


def _dns_config_errors(spec: PodSpec) -> list[FieldError]:
    config = spec.dns_config
    where = "spec.dnsConfig"
    if spec.dns_policy == "None":
        if config is None:
            return [
                FieldError(where, "required: must provide `dnsConfig` when `dnsPolicy` is None")
            ]
        if not config.nameservers:
            return [
                FieldError(
                    f"{where}.nameservers",
                    "required: must provide at least one DNS nameserver when `dnsPolicy` is None",
                )
            ]
    if config is None:
        return []
    errors: list[FieldError] = []
    nameservers = config.nameservers or []
    if len(nameservers) > MAX_DNS_NAMESERVERS:
        errors.append(
            FieldError(
                f"{where}.nameservers",
                f"must not have more than {MAX_DNS_NAMESERVERS} nameservers (has "
                f"{len(nameservers)})",
            )
        )
    for i, server in enumerate(nameservers):
        if not valid_ip(server):
            errors.append(
                FieldError(f"{where}.nameservers[{i}]", f"invalid value {server!r}: {INVALID_IP}")
            )
    searches = config.searches or []
    if len(searches) > MAX_DNS_SEARCH_PATHS:
        errors.append(
            FieldError(
                f"{where}.searches",
                f"must not have more than {MAX_DNS_SEARCH_PATHS} search paths (has "
                f"{len(searches)})",
            )
        )
    if len(" ".join(searches)) > MAX_DNS_SEARCH_LIST_CHARS:
        errors.append(
            FieldError(
                f"{where}.searches",
                f"must not have more than {MAX_DNS_SEARCH_LIST_CHARS} characters (including "
                "spaces) in the search list",
            )
        )
    for i, search in enumerate(searches):
        # A trailing dot is fine (an absolute name).
        if err := dns_subdomain_error(search.removesuffix(".")):
            errors.append(FieldError(f"{where}.searches[{i}]", err))
    for i, option in enumerate(config.options or []):
        if not option.name:
            errors.append(FieldError(f"{where}.options[{i}]", "required: must not be empty"))
    return errors
