"""Converting a file ASE reads into a prepared container: time per 1,000 structures, cache hit time.

Writes ``--structures`` EMT Cu-Au cells (32 atoms, ``REF_*`` labels) to an extxyz file, then
times, each in a fresh process so that nothing is warm but Warp's kernel cache on disk (and
after ``sync``, so that no child waits on the writes of the one before):

* ``ase.io.read`` of the whole file (the floor: parsing alone),
* with ``--mace-python``, mace-torch's own preparation of the same file in that Python:
  ``load_from_xyz`` and ``AtomicData.from_config`` of every configuration at the same cutoff
  (graphs in memory; nothing is written),
* the first :func:`hydragnn.data.convert_source` (parse, label, prepare, neighbour lists at the
  cutoff, write the ``.pt`` container) as it was before issue 33 (a ``Data`` per frame, one
  neighbour search and one ``.pt`` file per structure: ``EDGE_CHUNK`` 1, ``CHUNK_SAMPLES`` 1),
  then with batched searches and chunk files but still a ``Data`` per frame, and as shipped
  (frames packed column by column, one search and one chunk file per ``EDGE_CHUNK`` frames),
  each into its own cache,
* the second call (a cache hit: fingerprint check and opening the container),
* reading every sample back from the cache (one file per structure, and chunk files).

``--molecules`` converts small molecules instead (ASE's G2 set of H, C, N, O molecules, rattled,
labelled by ASE's EMT, non-periodic), the other case conversion must serve.

Usage::

    python tools/bench/conversion.py [--structures 1000] [--cutoff 5.0] [--format pt] [--molecules]
        [--mace-python mace/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from hydragnn.data import AseSource, convert_source
import ase.io
import hydragnn.data.io.conversion_samples as conversion_samples
import hydragnn.data.containers.pt_directory as pt_directory
path, cutoff, fmt, what, cache, chunk, pt_chunk, pack = sys.argv[1:9]
cutoff = float(cutoff)
t_import = time.perf_counter() - t0
if what == "parse":
    t0 = time.perf_counter(); frames = ase.io.read(path, index=":"); seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "import_s": t_import, "n": len(frames)})); sys.exit()
if chunk != "default":
    conversion_samples.EDGE_CHUNK = int(chunk)
if pt_chunk != "default":
    pt_directory.CHUNK_SAMPLES = int(pt_chunk)
if pack == "no":
    conversion_samples.pack_frames = lambda *args: None  # a Data per frame, as before the packed chunks
source = AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress")
t0 = time.perf_counter()
converted = convert_source(source, cutoff=cutoff, container_format=fmt, cache_dir=cache)
seconds = time.perf_counter() - t0
t0 = time.perf_counter()
edges = sum(int(converted.dataset[i].edge_index.shape[1]) for i in range(len(converted.dataset)))
read_s = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "cached": converted.cached, "n": len(converted.dataset), "edges": edges,
                  "read_all_s": read_s, "import_s": t_import}))
"""

MACE_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from mace.data import AtomicData
from mace.data.utils import KeySpecification, load_from_xyz
from mace.tools import AtomicNumberTable
t_import = time.perf_counter() - t0
path, cutoff = sys.argv[1], float(sys.argv[2])
t0 = time.perf_counter()
_, configs = load_from_xyz(path, KeySpecification.from_defaults())
table = AtomicNumberTable(sorted({int(z) for c in configs for z in c.atomic_numbers}))
graphs = [AtomicData.from_config(c, z_table=table, cutoff=cutoff) for c in configs]
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "n": len(graphs), "edges": sum(int(g.edge_index.shape[1]) for g in graphs),
                  "import_s": t_import}))
"""


def _mace(python: str, path: Path, cutoff: float) -> dict:
    os.sync()
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # e3nn 0.4 loads its constants with pickle
    out = subprocess.run(
        [python, "-c", MACE_CHILD, str(path), str(cutoff)], capture_output=True, text=True, check=False, env=env
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(*args: str) -> dict:
    os.sync()  # the files earlier children wrote go to disk now, not during this child's timing
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cells(n: int, seed: int) -> list:
    from hydragnn.data.emt import generate_cuau_atoms

    return generate_cuau_atoms(n, seed=seed)


def _molecules(n: int) -> list:
    """``n`` rattled H/C/N/O molecules of ASE's G2 set (3-12 atoms), with EMT energies and forces."""
    import numpy as np
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.collections import g2

    names = sorted(
        k for k in g2.names if set(g2[k].get_chemical_symbols()) <= {"H", "C", "N", "O"} and 3 <= len(g2[k]) <= 12
    )
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        atoms = g2[names[i % len(names)]].copy()
        atoms.rattle(0.05, seed=int(rng.integers(1 << 30)))
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        out.append(atoms)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--structures", type=int, default=1000)
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--format", default="pt", choices=["pt", "adios"])
    parser.add_argument("--molecules", action="store_true", help="small G2 molecules instead of 32-atom cells")
    parser.add_argument("--mace-python", help="a Python with mace-torch: its preparation of the same file")
    args = parser.parse_args(argv)

    from hydragnn.data.emt import write_extxyz

    structures = _molecules(args.structures) if args.molecules else _cells(args.structures, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_extxyz(Path(tmp) / "set.xyz", structures)
        warm = write_extxyz(Path(tmp) / "warm.xyz", _cells(2, seed=1))

        def child(
            what: str,
            file: Path = path,
            cache: str = "cache",
            chunk: str = "default",
            pt_chunk: str = "default",
            pack: str = "yes",
        ) -> dict:
            folder = str(Path(tmp) / cache)
            return _child(str(file), str(args.cutoff), args.format, what, folder, chunk, pt_chunk, pack)

        child("convert", warm, "warm")  # Warp compiles its kernels once per machine
        parse = child("parse")
        mace = _mace(args.mace_python, path, args.cutoff) if args.mace_python else None
        one_by_one = child("convert", cache="one_by_one", chunk="1", pt_chunk="1", pack="no")
        file_each = child("convert", cache="file_each", pt_chunk="1")
        file_each_read = child("convert", cache="file_each", pt_chunk="1")
        per_frame = child("convert", cache="per_frame", pack="no")
        first = child("convert")
        second = child("convert")
        assert not first["cached"] and second["cached"] and not one_by_one["cached"] and file_each_read["cached"]
        assert one_by_one["edges"] == first["edges"] == file_each["edges"] == per_frame["edges"]
        per_k = 1000 / args.structures
        atoms = sum(len(a) for a in structures)
        what = "molecules (G2, H/C/N/O)" if args.molecules else "cells"
        print(
            f"{args.structures} {what}, {atoms} atoms, cutoff {args.cutoff} Å, {first['edges']} edges, "
            f"{args.format} container"
        )
        print("| step | seconds | per 1,000 structures | / ase.io.read |")
        print("|---|---|---|---|")
        rows = [("ase.io.read alone", parse["seconds"])]
        if mace is not None:
            rows.append(("mace-torch load_from_xyz + AtomicData.from_config (in memory)", mace["seconds"]))
        rows += [
            ("first convert_source before issue 33: a Data, a search and a file per structure", one_by_one["seconds"]),
            ("first convert_source, a Data per frame, batched search, chunk files", per_frame["seconds"]),
            ("first convert_source, packed chunks, a file per structure", file_each["seconds"]),
            ("first convert_source (shipped: packed chunks, one search and one file each)", first["seconds"]),
            ("second convert_source (cache hit)", second["seconds"]),
            ("read every sample from the cache, one file per structure", file_each_read["read_all_s"]),
            ("read every sample from the cache (shipped: chunk files)", second["read_all_s"]),
        ]
        for name, seconds in rows:
            print(f"| {name} | {seconds:.3f} | {seconds * per_k:.3f} | {seconds / parse['seconds']:.2f} |")
        print(f"(importing hydragnn.data: {second['import_s']:.2f} s per process)")
        if mace is not None:
            print(
                f"(mace-torch: {mace['edges']} edges, hydragnn: {first['edges']}; importing mace: {mace['import_s']:.2f} s)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
