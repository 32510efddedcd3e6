#!/usr/bin/env bash
# On the lent GPU machine, second call (see prepare_device_wheels.sh): installs .whl/p2 and the
# warp.so halves (/tmp/keep from the first call, .whl/p2) into /tmp/site; a no-op for warp when a
# warm machine already has it. Every run reinstalls the four layers together (pip --target
# --upgrade replaces the whole hydragnn folder, so they must go in at once).
set -euo pipefail
cd "$(dirname "$0")/../.."
pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site)
if [ ! -s /tmp/site/warp/bin/warp.so ]; then
  [ -f /tmp/keep/warp.so.xz.aa ] || { echo "the first half of warp.so is missing: run the first call again" >&2; exit 3; }
  "${pip[@]}" .whl/p2/*.whl
  python3 -m zipfile -e .whl/p2/warp_rest.zip /tmp/site
  mkdir -p /tmp/site/warp/bin
  cat /tmp/keep/warp.so.xz.aa .whl/p2/warp.so.xz.ab | xz -dc > /tmp/site/warp/bin/warp.so
else
  "${pip[@]}" .whl/p2/hydra_*.whl
fi
PYTHONPATH=/tmp/site python3 -c "import warp, nvalchemiops, ase, hydragnn.infer; print('device wheels ready')"
