#!/usr/bin/env bash
#SBATCH -J hydragnn
#SBATCH -A CHANGE_ME
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -N 2
#SBATCH -t 01:00:00
#SBATCH --gpus-per-node=4
# Train on Perlmutter (NERSC): 4 NVIDIA A100 per node, one rank per GPU, CUDA (NCCL).
#   sbatch tools/hpc/perlmutter.sh config.json      (the config sets Parallelism.strategy: ddp)
#   HYDRAGNN_DRY_RUN=1 bash tools/hpc/perlmutter.sh config.json   prints the launch line only
# Once, on a login node: NERSC's python module, a virtual environment, torch's CUDA build
#   module load python cudatoolkit
#   python -m venv $HOME/hydragnn-env && . $HOME/hydragnn-env/bin/activate
#   pip install torch                              (the CUDA 12 build from PyPI)
#   pip install --find-links dist hydra-train      (dist/: `nox -s wheels` in a checkout)
# Ranks read SLURM_PROCID / SLURM_LOCALID / SLURM_STEP_NODELIST (hydragnn.train.strategies.launch).
set -euo pipefail
CONFIG=${1:?usage: sbatch perlmutter.sh config.json [hydragnn-train options]}
shift
NODES=${SLURM_JOB_NUM_NODES:-2}
GPUS_PER_NODE=4
if [[ ${HYDRAGNN_DRY_RUN:-0} != 1 ]]; then
  module load python cudatoolkit
  # shellcheck disable=SC1091
  . "${HYDRAGNN_ENV:-$HOME/hydragnn-env}/bin/activate"
fi
export OMP_NUM_THREADS=16                     # 64 cores per node over 4 ranks
export NCCL_NET_GDR_LEVEL=PHB                 # GPU-direct over the Slingshot NICs
launch=(srun -N "$NODES" -n $((NODES * GPUS_PER_NODE)) --ntasks-per-node="$GPUS_PER_NODE" -c 32
  --gpus-per-task=1 --gpu-bind=none hydragnn-train "$CONFIG" "$@")
if [[ ${HYDRAGNN_DRY_RUN:-0} == 1 ]]; then echo "${launch[*]}"; exit 0; fi
"${launch[@]}"
