#!/usr/bin/env bash
# Prepares what a lent GPU machine (the `device` tool) lacks, in two folders that each fit the 64 MiB
# a call may carry: .whl/p1 (the first half of warp.so, xz-compressed) and .whl/p2 (the second half,
# the rest of the warp-lang wheel, nvalchemi-toolkit-ops, ase and this tree's four layers as wheels).
# The machine's image has torch 2.11 and no warp / nvalchemi / ase, and cannot download; warp-lang's
# wheel (149 MB) is too large for one call. See docs/notes/gpu_qualification.md. Then, two calls in a
# row (the machine stays warm 30 s between them), with carry [".whl/p1"] and [".whl/p2"]:
#   1) mkdir -p /tmp/keep && cp .whl/p1/* /tmp/keep/
#   2) bash tools/gpu/install_device_wheels.sh && PYTHON=python3 PYTHONPATH=/tmp/site \
#        bash tools/gpu/qualify.sh --accept torch=2.11 --out $OUT/qualify.json
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
rm -rf .whl/p1 .whl/p2 .whl/tmp && mkdir -p .whl/p1 .whl/p2 .whl/tmp
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl/tmp warp-lang==1.19.0 nvalchemi-toolkit-ops==0.5.0 ase==3.29.0
python3 -m pip wheel -q --no-deps -w .whl/p2 packages/hydra-data packages/hydra-models packages/hydra-infer packages/hydra-train
mv .whl/tmp/ase-*.whl .whl/tmp/nvalchemi_*.whl .whl/p2/
warp=$(ls .whl/tmp/warp_lang-*.whl)
python3 - "$warp" <<'PY'
import sys, zipfile
src = sys.argv[1]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(".whl/p2/warp_rest.zip", "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        name = item.filename
        if name in ("warp/bin/warp.so", "warp/bin/warp-clang.so") or name.startswith(("warp/examples/", "warp/tests/")):
            continue
        zout.writestr(item, zin.read(name))
    with zin.open("warp/bin/warp.so") as so, open(".whl/tmp/warp.so", "wb") as out:
        out.write(so.read())
PY
xz -T"${XZ_THREADS:-2}" -6 .whl/tmp/warp.so
split -b 42000000 .whl/tmp/warp.so.xz .whl/tmp/warp.so.xz.
mv .whl/tmp/warp.so.xz.aa .whl/p1/ && mv .whl/tmp/warp.so.xz.ab .whl/p2/
rm -rf .whl/tmp
du -sh .whl/p1 .whl/p2
