"""Random identifiers (container and sandbox IDs, event names) made without a system call.

`uuid.uuid4()` reads os.urandom, a system call that releases the GIL: on the event loop, with the
thread pool writing state files, getting the GIL back cost about 150 µs per ID in the
1,000-manifest burst (10 % of the loop). These IDs only need to be unique, not secret: a
Mersenne Twister seeded from os.urandom once (at import) gives 128 bits without leaving Python.
"""

from __future__ import annotations

import random

_random = random.Random()  # seeded from os.urandom


def random_hex(nbytes: int = 16) -> str:
    """`nbytes` random bytes as lowercase hex (32 characters by default, as uuid4().hex)."""
    return f"{_random.getrandbits(8 * nbytes):0{2 * nbytes}x}"
