"""Image pull secrets → registry credentials for an image, as the kubelet's credential keyring
matches them (pkg/credentialprovider: keyring.go, config.go; secrets/secrets.go).

What it promises (pure, no I/O):
- Secrets of type `kubernetes.io/dockerconfigjson` (key `.dockerconfigjson`, `{"auths":
  {registry: entry}}`) and `kubernetes.io/dockercfg` (key `.dockercfg`, `{registry: entry}`)
  give credentials; other Secrets, and those whose key is missing or empty, give none. An entry's
  `auth` (base64 of "user:password", padded or not) replaces its username and password. JSON that
  does not parse is a `PullSecretError` naming the Secret (the kubelet fails the pull with it).
- A registry key ("https://registry.example.com:5000/v2/team") is stored as host plus path, a
  scheme and a leading /v1/ or /v2/ dropped. An image matches a key when the port is the same,
  the host has as many dot-separated parts with each matching the key's part as a Go
  filepath.Match glob (`*.example.com`), and the key's path is a prefix of the image's path.
  Keys are tried in reverse lexical order (the most specific path first), and the credentials of
  every matching key are returned in that order. An image of Docker Hub (no registry host, or
  docker.io / index.docker.io) with no matching key uses the `index.docker.io` key
  (`https://index.docker.io/v1/`).
- Image names are normalised as Docker's reference library does ("busybox" →
  "docker.io/library/busybox"), tag and digest dropped, before matching.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pykubelet.runtime.base import PullCredentials, RegistryAuth

SECRET_TYPE_DOCKER_CONFIG_JSON = "kubernetes.io/dockerconfigjson"
SECRET_TYPE_DOCKERCFG = "kubernetes.io/dockercfg"
DOCKER_CONFIG_JSON_KEY = ".dockerconfigjson"
DOCKERCFG_KEY = ".dockercfg"

DEFAULT_REGISTRY_HOST = "index.docker.io"
DOCKER_HUB_DOMAIN = "docker.io"


class PullSecretError(Exception):
    """A pull secret's docker config is not valid JSON of the expected shape."""


@dataclass(frozen=True)
class Credential:
    """One entry of a docker config."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class PullSecret:
    """A Secret as the keyring reads it: its name (for messages), type and decoded data."""

    name: str
    type: str
    data: Mapping[str, bytes]


def _decode_auth(value: str) -> tuple[str, str]:
    """config.go's decodeDockerConfigFieldAuth: standard base64, padded or not."""
    text = value.replace("\r", "").replace("\n", "")
    if not value.strip().endswith("="):
        if "=" in text:
            raise PullSecretError("auth is not base64: unexpected padding")
        text += "=" * (-len(text) % 4)
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PullSecretError(f"auth is not base64: {exc}") from None
    user, sep, password = decoded.decode("utf-8", "replace").partition(":")
    if not sep:
        raise PullSecretError(
            "unable to parse auth field, must be formatted as base64(username:password)"
        )
    return user, password


def _entry(registry: str, raw: object) -> Credential:
    if not isinstance(raw, dict):
        raise PullSecretError(f"registry {registry!r}: an entry must be an object")
    fields: dict[str, str] = {}
    for key in ("username", "password", "email", "auth"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise PullSecretError(f"registry {registry!r}: {key} must be a string")
        fields[key] = value
    if fields.get("auth"):
        user, password = _decode_auth(fields["auth"])
        return Credential(user, password)
    return Credential(fields.get("username", ""), fields.get("password", ""))


def parse_docker_config(data: bytes, *, auths_wrapper: bool) -> dict[str, Credential]:
    """The entries of a `.dockerconfigjson` (`auths_wrapper`) or `.dockercfg` document."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PullSecretError(f"not JSON: {exc}") from None
    if auths_wrapper:
        if not isinstance(doc, dict):
            raise PullSecretError("must be an object with auths")
        doc = doc.get("auths") or {}
    if not isinstance(doc, dict):
        raise PullSecretError("the registries must be an object")
    return {str(registry): _entry(str(registry), raw) for registry, raw in doc.items()}


def _split_url(text: str) -> tuple[str, str] | None:
    """A schemeless URL's host (with port) and path as Go's url.Parse("https://" + text) gives
    them, or None where it fails. Written out rather than urllib's: Go allows brackets inside a
    host ("registry.[a-e]xample.com", a glob) and Python's parser does not."""
    rest = text.partition("#")[0].partition("?")[0]
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    if any(c in host for c in " %") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in host):
        return None
    if host.startswith("["):
        end = host.find("]")
        after = host[end + 1 :] if end >= 0 else None
        if after is None or (after and not after.startswith(":")):
            return None
        port = after[1:]
    else:
        port = host.rpartition(":")[2] if ":" in host else ""
    if port and not port.isdigit():
        return None
    return host, slash + path


def _host_port(host: str) -> tuple[str, str]:
    """Go's net.SplitHostPort, the whole host and no port where it fails."""
    if host.startswith("["):
        end = host.find("]")
        if end > 0 and host[end + 1 : end + 2] == ":":
            return host[1:end], host[end + 2 :]
        return host, ""
    if host.count(":") == 1:
        name, _, port = host.partition(":")
        return name, port
    return host, ""


def _glob_regex(pattern: str) -> re.Pattern[str] | None:
    """Go's filepath.Match pattern as a regex (None: a bad pattern, which matches nothing)."""
    out: list[str] = []
    i, n = 0, len(pattern)

    def char_at(j: int) -> tuple[str, int] | None:
        if j >= n:
            return None
        if pattern[j] == "\\":
            return (pattern[j + 1], j + 2) if j + 1 < n else None
        if pattern[j] in "-]":
            return None
        return pattern[j], j + 1

    while i < n:
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "\\":
            if i + 1 >= n:
                return None
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "[":
            i += 1
            negate = i < n and pattern[i] == "^"
            if negate:
                i += 1
            ranges: list[str] = []
            while True:
                if i < n and pattern[i] == "]" and ranges:
                    i += 1
                    break
                lo = char_at(i)
                if lo is None:
                    return None
                low, i = lo
                high = low
                if i < n and pattern[i] == "-":
                    hi = char_at(i + 1)
                    if hi is None:
                        return None
                    high, i = hi
                if low > high:
                    return None
                ranges.append(f"{re.escape(low)}-{re.escape(high)}")
            out.append("[" + ("^" if negate else "") + "".join(ranges) + "]")
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_match(pattern: str, name: str) -> bool:
    """Whether `name` matches `pattern` as Go's filepath.Match says (a bad pattern: no)."""
    regex = _glob_regex(pattern)
    return regex is not None and regex.fullmatch(name) is not None


def urls_match(glob: str, target: str) -> bool:
    """keyring.go's urlsMatchStr: same port, as many host parts each matching its glob, and
    the glob's path a prefix of the target's."""
    g, t = _split_url(glob), _split_url(target)
    if g is None or t is None:
        return False
    (g_host, g_port), (t_host, t_port) = _host_port(g[0]), _host_port(t[0])
    if g_port != t_port:
        return False
    g_parts, t_parts = g_host.split("."), t_host.split(".")
    if len(g_parts) != len(t_parts) or not t[1].startswith(g[1]):
        return False
    return all(glob_match(gp, tp) for gp, tp in zip(g_parts, t_parts, strict=True))


def registry_key(location: str) -> str | None:
    """The index key of a docker config's registry: host plus path without a scheme or a
    leading /v1/ or /v2/ (None: it does not parse, and the entry is ignored)."""
    value = location
    for scheme in ("https://", "http://"):
        if value.startswith(scheme):
            value = value[len(scheme) :]
            break
    parts = _split_url(value)
    if parts is None:
        return None
    host, path = parts
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return host + path if path and path != "/" else host


def is_default_registry_match(image: str) -> bool:
    """keyring.go's isDefaultRegistryMatch: the image is pulled from Docker Hub."""
    first, sep, _ = image.partition("/")
    if not first:
        return False
    if not sep or first in (DOCKER_HUB_DOMAIN, DEFAULT_REGISTRY_HOST):
        return True
    return not any(c in first for c in ".:")


def repository(image: str) -> str:
    """The image's normalised repository name, without tag or digest (Docker's
    ParseNormalizedNamed(...).Name(): "busybox" → "docker.io/library/busybox")."""
    name = image.partition("@")[0]
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name = name[:colon]
    first, sep, rest = name.partition("/")
    if not sep or (
        not any(c in first for c in ".:") and first != "localhost" and first.lower() == first
    ):
        domain, path = DOCKER_HUB_DOMAIN, name
    else:
        domain, path = first, rest
    if domain == DEFAULT_REGISTRY_HOST:
        domain = DOCKER_HUB_DOMAIN
    if domain == DOCKER_HUB_DOMAIN and "/" not in path:
        path = "library/" + path
    return f"{domain}/{path}"


class Keyring:
    """The credentials of some docker configs, indexed by registry key (BasicDockerKeyring)."""

    def __init__(self) -> None:
        self._creds: dict[str, list[Credential]] = {}
        self._index: list[str] = []

    def add(self, config: Mapping[str, Credential]) -> None:
        for location, credential in config.items():
            key = registry_key(location)
            if key is None:
                continue
            self._creds.setdefault(key, []).append(credential)
        self._index = sorted(self._creds, reverse=True)

    def lookup(self, repo: str) -> list[tuple[str, Credential]]:
        """The (key, credential) pairs for a normalised repository, the most specific first."""
        found = [(key, c) for key in self._index if urls_match(key, repo) for c in self._creds[key]]
        if found:
            return found
        if is_default_registry_match(repo) and DEFAULT_REGISTRY_HOST in self._creds:
            return [(DEFAULT_REGISTRY_HOST, c) for c in self._creds[DEFAULT_REGISTRY_HOST]]
        return []


def keyring_from_secrets(secrets: Iterable[PullSecret]) -> Keyring:
    """MakeDockerKeyring: the docker-config Secrets' credentials, in the pod's order."""
    keyring = Keyring()
    for secret in secrets:
        if secret.type == SECRET_TYPE_DOCKER_CONFIG_JSON and secret.data.get(
            DOCKER_CONFIG_JSON_KEY
        ):
            raw, wrapped, key = secret.data[DOCKER_CONFIG_JSON_KEY], True, DOCKER_CONFIG_JSON_KEY
        elif secret.type == SECRET_TYPE_DOCKERCFG and secret.data.get(DOCKERCFG_KEY):
            raw, wrapped, key = secret.data[DOCKERCFG_KEY], False, DOCKERCFG_KEY
        else:
            continue
        try:
            keyring.add(parse_docker_config(raw, auths_wrapper=wrapped))
        except PullSecretError as exc:
            raise PullSecretError(f'image pull secret "{secret.name}": {key}: {exc}') from None
    return keyring


def pull_credentials(image: str, secrets: Iterable[PullSecret]) -> PullCredentials:
    """What a pull of `image` gets from the pod's pull secrets (read at this sync)."""
    try:
        keyring = keyring_from_secrets(secrets)
    except PullSecretError as exc:
        return PullCredentials(error=str(exc))
    repo = repository(image)
    registry = repo.partition("/")[0]
    auths = tuple(
        RegistryAuth(c.username, c.password, server_address=registry)
        for _, c in keyring.lookup(repo)
    )
    return PullCredentials(auths=auths)
