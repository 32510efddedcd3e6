"""Converting a file ASE reads into a prepared container: time per 1,000 structures, cache hit time.

Writes ``--structures`` EMT Cu-Au cells (32 atoms, ``REF_*`` labels) to an extxyz file, then
times, each in a fresh process so that nothing is warm but Warp's kernel cache on disk:

* ``ase.io.read`` of the whole file (the floor: parsing alone),
* the first :func:`hydragnn.data.convert_source` (parse, label, prepare, neighbour lists at the
  cutoff, write the ``.pt`` container),
* the second call (a cache hit: fingerprint check and opening the container),
* reading every sample back from the cache.

Usage::

    python tools/bench/conversion.py [--structures 1000] [--cutoff 5.0] [--format pt]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from hydragnn.data import AseSource, convert_source
import ase.io
path, cutoff, fmt, what = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
t_import = time.perf_counter() - t0
if what == "parse":
    t0 = time.perf_counter(); frames = ase.io.read(path, index=":"); seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "import_s": t_import, "n": len(frames)})); sys.exit()
source = AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress")
t0 = time.perf_counter()
converted = convert_source(source, cutoff=cutoff, container_format=fmt)
seconds = time.perf_counter() - t0
t0 = time.perf_counter()
edges = sum(int(converted.dataset[i].edge_index.shape[1]) for i in range(len(converted.dataset)))
read_s = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "cached": converted.cached, "n": len(converted.dataset), "edges": edges,
                  "read_all_s": read_s, "import_s": t_import}))
"""


def _child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--structures", type=int, default=1000)
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--format", default="pt", choices=["pt", "adios"])
    args = parser.parse_args(argv)

    from hydragnn.data.reference import generate_cuau_atoms, write_extxyz

    with tempfile.TemporaryDirectory() as tmp:
        path = write_extxyz(Path(tmp) / "set.xyz", generate_cuau_atoms(args.structures, seed=0))
        warm = write_extxyz(Path(tmp) / "warm.xyz", generate_cuau_atoms(2, seed=1))
        _child(str(warm), str(args.cutoff), args.format, "convert")  # Warp compiles its kernels once per machine
        parse = _child(str(path), str(args.cutoff), args.format, "parse")
        first = _child(str(path), str(args.cutoff), args.format, "convert")
        second = _child(str(path), str(args.cutoff), args.format, "convert")
        assert not first["cached"] and second["cached"]
        per_k = 1000 / args.structures
        print(f"{args.structures} structures of 32 atoms, cutoff {args.cutoff} Å, {first['edges']} edges, {args.format} container")
        print("| step | seconds | per 1,000 structures |")
        print("|---|---|---|")
        print(f"| ase.io.read alone | {parse['seconds']:.2f} | {parse['seconds'] * per_k:.2f} |")
        print(f"| first convert_source (convert) | {first['seconds']:.2f} | {first['seconds'] * per_k:.2f} |")
        print(f"| second convert_source (cache hit) | {second['seconds']:.3f} | {second['seconds'] * per_k:.3f} |")
        print(f"| read every sample from the cache | {second['read_all_s']:.2f} | {second['read_all_s'] * per_k:.2f} |")
        print(f"(importing hydragnn.data: {second['import_s']:.2f} s per process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
