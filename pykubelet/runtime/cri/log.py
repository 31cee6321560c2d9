"""The CRI container log format, as containerd and CRI-O write it for the kubelet.

The decoding and the backwards tail live in `pykubelet.runtime.logfiles`, shared by the
file-based runtimes; these names stay importable from here for the CRI runtime. A log file is
read with `read_cri_log` (and followed from `read_cri_tail`), never whole.
"""

from __future__ import annotations

from pykubelet.runtime.logfiles import (
    CriLogDecoder,
    cri_tail_offset,
    decode_records,
    read_cri_log,
    read_cri_tail,
    tail_start,
)

__all__ = [
    "CriLogDecoder",
    "cri_tail_offset",
    "decode_records",
    "read_cri_log",
    "read_cri_tail",
    "tail_start",
]
