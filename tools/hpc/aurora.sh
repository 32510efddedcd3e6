#!/usr/bin/env bash
#PBS -N hydragnn
#PBS -A CHANGE_ME
#PBS -q prod
#PBS -l select=2
#PBS -l walltime=01:00:00
#PBS -l filesystems=flare:home
# Train on Aurora (ALCF): 6 Intel Data Center GPU Max per node = 12 tiles, one rank per tile, XPU
# (oneCCL through torch's "xccl" backend). PBS Pro starts the job, Cray PALS' mpiexec the ranks.
#   qsub -v CONFIG=config.json tools/hpc/aurora.sh  (the config sets Parallelism.strategy: ddp)
#   HYDRAGNN_DRY_RUN=1 PBS_NODEFILE=hosts bash tools/hpc/aurora.sh config.json   prints the launch line
# Once, on a login node: ALCF's frameworks module (torch with XPU) and HydraGNN's wheels beside it
#   module load frameworks
#   python -m venv --system-site-packages $HOME/hydragnn-env && . $HOME/hydragnn-env/bin/activate
#   pip install --find-links dist hydra-train      (dist/: `nox -s wheels` in a checkout)
# Ranks read PMI_RANK / PMI_SIZE / PALS_LOCAL_RANKID (hydragnn.train.strategies.launch); PALS names
# no rendezvous host, so MASTER_ADDR is the job's first node.
set -euo pipefail
CONFIG=${1:-${CONFIG:?usage: qsub -v CONFIG=config.json aurora.sh}}
if [[ $# -gt 0 ]]; then shift; fi
NODEFILE=${PBS_NODEFILE:?PBS_NODEFILE is unset: the job host list that PBS sets}
NODES=$(sort -u "$NODEFILE" | wc -l)
TILES_PER_NODE=12
if [[ ${HYDRAGNN_DRY_RUN:-0} != 1 ]]; then
  cd "${PBS_O_WORKDIR:-.}"
  module load frameworks
  # shellcheck disable=SC1091
  . "${HYDRAGNN_ENV:-$HOME/hydragnn-env}/bin/activate"
fi
MASTER_ADDR=$(head -n 1 "$NODEFILE")
export MASTER_ADDR
export OMP_NUM_THREADS=8
export CCL_PROCESS_LAUNCHER=pmix CCL_ATL_TRANSPORT=mpi
launch=(mpiexec -n $((NODES * TILES_PER_NODE)) --ppn "$TILES_PER_NODE"
  --cpu-bind list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100
  gpu_tile_compact.sh hydragnn-train "$CONFIG" "$@")
if [[ ${HYDRAGNN_DRY_RUN:-0} == 1 ]]; then echo "MASTER_ADDR=$MASTER_ADDR ${launch[*]}"; exit 0; fi
"${launch[@]}"
