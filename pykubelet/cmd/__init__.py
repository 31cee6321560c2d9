"""What the command line runs: flags and the --config file, the pykubelet get/logs/describe
client, log formats.

Every command imports aiohttp; it is imported first, here, without the system's CA bundle in
its default contexts, which no command verifies with (common/tlsdefaults.py).
"""

from pykubelet.common.tlsdefaults import import_aiohttp

import_aiohttp()
