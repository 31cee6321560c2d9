"""The credentials of the kubeconfig's user, kept fresh while the agent runs, as client-go does.

- `exec` (client.authentication.k8s.io/v1 or v1beta1): the plugin is run, with
  KUBERNETES_EXEC_INFO set, and its ExecCredential's token (or client certificate and key) used
  until shortly before its `status.expirationTimestamp` (a fifth of its life or a minute before,
  whichever is sooner), then the plugin is run again; a credential without an expiry is kept
  until the API server answers 401 with it, which also re-runs the plugin.
- `tokenFile` (and the in-cluster service account token): re-read once a minute (client-go's
  cached file token source) and at once after a 401.
- `token`: used as it is.
- The files TLS reads (client-certificate, client-key, certificate-authority) and the kubeconfig
  itself are watched: a change seen (every `FILE_CHECK_PERIOD`, and at once after a 401) bumps
  `generation`, and the client is rebuilt from the files (a certificate rotated by a tool that
  rewrites them; client-go's dynamic client certificate does the same every five minutes).

Every bad field is refused with the kubeconfig, the user and the field named. Tokens and keys
never reach a log line; a plugin's certificate and key go to a private (0700) temporary
directory removed on `close()`. File reads run in threads; the plugin is an asyncio subprocess.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Obj = dict[str, Any]

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")
TOKEN_FILE_PERIOD = 60.0  # client-go re-reads a bearer token file every minute
FILE_CHECK_PERIOD = 60.0
EXEC_TIMEOUT = 60.0
EARLY_REFRESH = 60.0  # at most this long before expiry (less for short-lived credentials)
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class CredentialError(Exception):
    """A credential that cannot be had: the message names the kubeconfig, user and field."""


def _rfc3339(text: str) -> datetime.datetime:
    value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("no time zone")
    return value


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()  # follows a symlink: a swapped -current.pem is a change
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class ExecConfig:
    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    install_hint: str = ""


@dataclass
class Credentials:
    """What requests authenticate with; `token()` before each, `unauthorized()` after a 401."""

    where: str  # "kubeconfig <path>, user <name>", for messages
    token_value: str | None = None
    token_file: Path | None = None
    exec_config: ExecConfig | None = None
    watched: tuple[Path, ...] = ()  # files TLS or the configuration is read from
    token_file_period: float = TOKEN_FILE_PERIOD
    file_check_period: float = FILE_CHECK_PERIOD
    generation: int = 0  # bumped when the client must be rebuilt (new TLS material)
    exec_runs: int = 0
    # A plugin's client certificate and key, as files TLS can load.
    exec_cert: tuple[Path, Path] | None = None
    _token: str | None = None
    _due: float = 0.0  # loop time the token is to be fetched again (inf: never)
    _files: tuple[tuple[int, int, int, int] | None, ...] = ()
    _files_checked: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tmp: Path | None = None
    _exec_cert_data: tuple[str, str] | None = None

    def __repr__(self) -> str:  # never the token or the key
        return f"Credentials({self.where!r}, runs={self.exec_runs}, generation={self.generation})"

    def source(self) -> tuple[object, ...]:
        """Where the credential comes from: another one is a new credential."""
        return (self.token_value, self.token_file, self.exec_config, self.watched)

    def adopt_periods(self, old: Credentials) -> None:
        self.token_file_period = old.token_file_period
        self.file_check_period = old.file_check_period
        self.generation = old.generation

    async def start(self) -> None:
        """The first fetch (the plugin's first run) and the files' first look; raises
        CredentialError."""
        await self._fetch()
        self._files = await asyncio.to_thread(self._snapshot)
        self._files_checked = asyncio.get_running_loop().time()

    async def token(self) -> str | None:
        """The bearer token to send now, fetched again when due; checks the watched files."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self._due:
            async with self._lock:
                if loop.time() >= self._due:
                    try:
                        await self._fetch()
                    except CredentialError as exc:
                        # The old credential may still work: keep it, try again in a while.
                        log.error("refreshing the credentials of %s", exc)
                        self._due = loop.time() + 10.0
        if self.watched and now - self._files_checked >= self.file_check_period:
            await self._check_files()
        return self._token

    async def unauthorized(self, used: str | None) -> bool:
        """A 401 for a request sent with `used`: fetch again (unless another request already
        did) and look at the files now. True when the next try would send something else."""
        changed = await self._check_files()
        if self.token_file is None and self.exec_config is None:
            return changed
        async with self._lock:
            if self._token != used:
                return True
            try:
                await self._fetch()
            except CredentialError as exc:
                log.error("refreshing the credentials of %s after a 401", exc)
                return changed
            return changed or self._token != used

    def reset_files(self) -> None:
        """The client was rebuilt from the files as they are now (call off the loop)."""
        self._files = self._snapshot()

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # --- internals ---

    def _snapshot(self) -> tuple[tuple[int, int, int, int] | None, ...]:
        return tuple(_stat(p) for p in self.watched)

    async def _check_files(self) -> bool:
        if not self.watched:
            return False
        self._files_checked = asyncio.get_running_loop().time()
        now = await asyncio.to_thread(self._snapshot)
        if now == self._files:
            return False
        self._files = now
        self.generation += 1
        log.info("the credential files of %s changed: the client is rebuilt", self.where)
        return True

    async def _fetch(self) -> None:
        loop = asyncio.get_running_loop()
        if self.exec_config is not None:
            await self._run_plugin(self.exec_config)
        elif self.token_file is not None:
            self._token = await asyncio.to_thread(self._read_token_file, self.token_file)
            self._due = loop.time() + self.token_file_period
        else:
            self._token = self.token_value
            self._due = float("inf")

    def _read_token_file(self, path: Path) -> str:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise CredentialError(f"{self.where}: tokenFile {path}: {exc.strerror}") from None
        if not token:
            raise CredentialError(f"{self.where}: tokenFile {path}: the file is empty")
        return token

    async def _run_plugin(self, cfg: ExecConfig) -> None:
        loop = asyncio.get_running_loop()
        what = f"{self.where}: exec plugin {cfg.command}"
        info = {"apiVersion": cfg.api_version, "kind": "ExecCredential", "spec": {}}
        info["spec"] = {"interactive": False}
        env = {**os.environ, **dict(cfg.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            proc = await asyncio.create_subprocess_exec(
                cfg.command,
                *cfg.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            hint = f" ({cfg.install_hint.strip()})" if cfg.install_hint.strip() else ""
            raise CredentialError(f"{what}: cannot run it: {exc.strerror}{hint}") from None
        self.exec_runs += 1
        try:
            async with asyncio.timeout(EXEC_TIMEOUT):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise CredentialError(f"{what}: no answer within {EXEC_TIMEOUT:g}s") from None
        if proc.returncode != 0:
            tail = " ".join(err.decode(errors="replace").split())[-300:]
            raise CredentialError(f"{what}: exit code {proc.returncode}: {tail}")
        status = self._exec_status(what, cfg, out)
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if bool(cert) != bool(key):
            raise CredentialError(
                f"{what}: status.clientCertificateData and status.clientKeyData come together"
            )
        if not token and not cert:
            raise CredentialError(f"{what}: status: neither a token nor a certificate and key")
        for name, value in (("token", token), ("clientCertificateData", cert), ("clientKeyData",
                            key)):  # fmt: skip
            if value is not None and not isinstance(value, str):
                raise CredentialError(f"{what}: status.{name}: not a string")
        self._token = token or None
        if cert and (cert, key) != self._exec_cert_data:
            await asyncio.to_thread(self._write_exec_cert, str(cert), str(key))
            self._exec_cert_data = (str(cert), str(key))
            self.generation += 1
        self._due = loop.time() + self._lifetime(what, status.get("expirationTimestamp"))

    def _exec_status(self, what: str, cfg: ExecConfig, out: bytes) -> Obj:
        try:
            data = json.loads(out)
        except ValueError:
            raise CredentialError(f"{what}: its output is not JSON") from None
        if not isinstance(data, dict) or data.get("kind") != "ExecCredential":
            raise CredentialError(f"{what}: kind: not an ExecCredential")
        if data.get("apiVersion") != cfg.api_version:
            raise CredentialError(
                f"{what}: apiVersion: {data.get('apiVersion')!r}, the kubeconfig asks for "
                f"{cfg.api_version}"
            )
        status = data.get("status")
        if not isinstance(status, dict):
            raise CredentialError(f"{what}: status: Required value")
        return status

    def _lifetime(self, what: str, expiry: Any) -> float:
        """Seconds until the credential is fetched again."""
        if not expiry:
            return float("inf")  # until a 401
        try:
            at = _rfc3339(str(expiry))
        except ValueError:
            raise CredentialError(
                f"{what}: status.expirationTimestamp: {expiry!r} is not an RFC 3339 time"
            ) from None
        left = (at - datetime.datetime.now(datetime.UTC)).total_seconds()
        if left <= 0:
            log.warning("%s: the credential it gave has already expired (%s)", what, expiry)
            return 1.0
        return left - min(EARLY_REFRESH, left / 5)

    def _write_exec_cert(self, cert: str, key: str) -> None:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="pykubelet-exec-"))  # 0700
        paths = []
        for name, data in (("client.crt", cert), ("client.key", key)):
            path = self._tmp / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data.encode())
            finally:
                os.close(fd)
            paths.append(path)
        self.exec_cert = (paths[0], paths[1])


def _strings(where: str, name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CredentialError(f"{where}: {name}: not a list of strings")
    return tuple(value)


def _exec_config(where: str, raw: Any, base: Path) -> ExecConfig:
    if not isinstance(raw, dict):
        raise CredentialError(f"{where}: exec: not an object")
    version = raw.get("apiVersion")
    if version not in EXEC_API_VERSIONS:
        raise CredentialError(
            f"{where}: exec.apiVersion: {version!r} is not supported (supported: "
            f"{', '.join(EXEC_API_VERSIONS)})"
        )
    command = raw.get("command")
    if not isinstance(command, str) or not command:
        raise CredentialError(f"{where}: exec.command: Required value")
    # As client-go: a relative command with a path separator is relative to the kubeconfig.
    if os.sep in command and not os.path.isabs(command):
        command = str(base / command)
    mode = raw.get("interactiveMode")
    if version.endswith("/v1") and mode is None:
        raise CredentialError(f"{where}: exec.interactiveMode: Required value (for {version})")
    if mode is not None and mode not in INTERACTIVE_MODES:
        raise CredentialError(
            f"{where}: exec.interactiveMode: {mode!r} is not one of {', '.join(INTERACTIVE_MODES)}"
        )
    if mode == "Always":
        raise CredentialError(
            f"{where}: exec.interactiveMode: Always needs a terminal, and the agent has none"
        )
    env: list[tuple[str, str]] = []
    for i, item in enumerate(raw.get("env") or []):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise CredentialError(f"{where}: exec.env[{i}].name: Required value")
        env.append((item["name"], str(item.get("value", ""))))
    return ExecConfig(
        version,
        command,
        _strings(where, "exec.args", raw.get("args")),
        tuple(env),
        str(raw.get("installHint") or ""),
    )


def from_user(kubeconfig: Path, name: str, user: Obj, tls_files: list[Path]) -> Credentials:
    """The credentials of a kubeconfig's user; `tls_files` are the files TLS reads (absolute).
    Does no I/O."""
    where = f"kubeconfig {kubeconfig}, user {name!r}"
    base = kubeconfig.parent
    watched = [kubeconfig, *tls_files]
    creds = Credentials(where, watched=tuple(watched))
    if "exec" in user:
        creds.exec_config = _exec_config(where, user["exec"], base)
    elif user.get("token"):
        creds.token_value = str(user["token"])
    elif user.get("tokenFile"):
        path = Path(str(user["tokenFile"]))
        creds.token_file = path if path.is_absolute() else base / path
    elif user.get("username") or user.get("password"):
        raise CredentialError(f"{where}: username/password: basic authentication is not supported")
    return creds


def in_cluster() -> Credentials:
    """The pod's service account token, re-read as it is rotated."""
    return Credentials("the in-cluster service account", token_file=SERVICE_ACCOUNT_TOKEN)
