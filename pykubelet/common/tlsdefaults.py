"""aiohttp imported without parsing the system's CA bundle for its two default TLS contexts.

aiohttp builds a verifying and a non-verifying client context when it is imported, and each
loads OpenSSL's default CA file: every certificate of the bundle parsed and kept, twice (1.9 MiB
of the agent's 56 at rest). Nothing of ours verifies with them: each HTTPS client the agent or
the command line makes passes its own context (the http source's, the API server's through the
kubernetes client, the node client's), and the probes' does not verify.

What it promises: `import_aiohttp` imports aiohttp with OpenSSL's default CA file (SSL_CERT_FILE)
pointed at an empty file, then puts the environment back as it was. The default CA directory is
left alone: it is read lazily, one certificate per issuer looked up, so a client that does use
aiohttp's default context still verifies against the directory's CAs (on Debian, every CA of
the bundle), and one whose CA is only in the bundle file fails verification, never passes it.
If aiohttp is already imported it does nothing. Call it before any thread starts: it changes
the process's environment for the length of the import.
"""

from __future__ import annotations

import os
import sys

CA_FILE_VARIABLE = "SSL_CERT_FILE"  # OpenSSL's X509_get_default_cert_file_env()


def import_aiohttp() -> None:
    if "aiohttp" in sys.modules:
        return
    saved = os.environ.get(CA_FILE_VARIABLE)
    os.environ[CA_FILE_VARIABLE] = os.devnull
    try:
        import aiohttp  # noqa: F401
    finally:
        if saved is None:
            del os.environ[CA_FILE_VARIABLE]
        else:
            os.environ[CA_FILE_VARIABLE] = saved
