"""Coverage-guided fuzzing (atheris, libFuzzer) of manifest decoding and validation.

    python tests/fuzz/fuzz_decode.py [libFuzzer flags] [CORPUS_DIR...]

Any input must end as a Pod, a list of Pods or a ManifestError naming what is wrong: any other
exception is a crash, which libFuzzer reports with the input that caused it. Also run, bounded,
by tests/unit/test_fuzz.py; seeds: tests/corpus/ and the examples.
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports(include=["pykubelet"]):
    from pykubelet.api.decode import decode_pod, decode_pods
    from pykubelet.api.errors import ManifestError
    from pykubelet.api.static import apply_static_defaults


def test_one_input(data: bytes) -> None:
    for name in ("fuzz.yaml", "fuzz.json"):
        try:
            pod = decode_pod(data, name)
        except ManifestError as e:
            assert str(e).startswith(name), e  # every error names the file
            continue
        with contextlib.suppress(ManifestError):
            apply_static_defaults(pod, "node-1", "file", name)
    with contextlib.suppress(ManifestError):
        decode_pods(data, "http://fuzz/pods")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
