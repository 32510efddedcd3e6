#!/usr/bin/env bash
# GPU qualification of hydra-infer's CUDA-graph engine: at most 8 minutes, a JSON report on stdout.
#   bash tools/gpu/qualify.sh [--dry-run] [--out report.json]
# Run it with the project's environment active (pip install -e packages/* or `nox -s tests --install-only`,
# then `. .nox/tests/bin/activate`), or set PYTHON to that interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec timeout --kill-after=10 480 "${PYTHON:-python}" tools/gpu/qualify.py --budget-s 420 "$@"
