"""Standalone probe of an ADIOS2 dataset, run in a short-lived child process (``python adios_probe.py PATH``).

It does what opening and reading the dataset makes the ADIOS2 C++ library do (open the ``.bp``
directory, read the ``hydragnn`` attribute, inquire every variable, read every array in full, in
chunks), so that a file which crashes or hangs the library does so here and not in the caller.
It imports only ``adios2``, ``numpy`` and the standard library (no torch: it starts in well
under a second). Prints ``ok`` and exits 0 when everything was read.
"""

from __future__ import annotations

import json
import sys

import numpy as np

CHUNK = 1 << 24  # elements per read
NUMPY = {
    "int8_t": np.int8, "int16_t": np.int16, "int32_t": np.int32, "int64_t": np.int64,
    "uint8_t": np.uint8, "uint16_t": np.uint16, "uint32_t": np.uint32, "uint64_t": np.uint64,
    "float": np.float32, "double": np.float64, "float complex": np.complex64, "double complex": np.complex128,
    "char": np.int8,
}  # fmt: skip


def probe(path: str) -> None:
    import adios2

    # pyright resolves adios2.Adios / adios2.Stream to the package itself (adios2's circular star imports)
    adios = adios2.Adios()  # pyright: ignore[reportCallIssue]
    io = adios.declare_io("hydragnn-adios-probe")
    stream = adios2.Stream(io, path, "rra")  # pyright: ignore[reportCallIssue]
    try:
        attribute = io.inquire_attribute("hydragnn")
        if attribute is None:
            raise SystemExit("no 'hydragnn' attribute")
        text = attribute.data_string()
        header = json.loads(text[0] if isinstance(text, list) else text)
        keys = header.get("keys") if isinstance(header, dict) else None
        if not isinstance(keys, list):
            raise SystemExit("no key list in the header")
        names = ["crc32"] + [f"k{j}/{part}" for j in range(len(keys)) for part in ("offsets", "shapes", "data")]
        for name in names:
            var = io.inquire_variable(name)
            if var is None:
                continue
            shape = [int(s) for s in var.shape()]
            if len(shape) != 1 or shape[0] < 0:
                raise SystemExit(f"variable {name} has shape {shape}")
            if var.type() not in NUMPY:
                raise SystemExit(f"variable {name} has type {var.type()!r}")
            dtype = NUMPY[var.type()]
            for start in range(0, shape[0], CHUNK):
                count = min(CHUNK, shape[0] - start)
                out = np.empty(count, dtype=dtype)
                var.set_selection([[start], [count]])
                stream.engine.get(var, out, adios2.Mode.Sync)
    finally:
        stream.close()


if __name__ == "__main__":
    probe(sys.argv[1])
    print("ok")
