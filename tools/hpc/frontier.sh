#!/usr/bin/env bash
#SBATCH -J hydragnn
#SBATCH -A CHANGE_ME
#SBATCH -p batch
#SBATCH -N 2
#SBATCH -t 01:00:00
#SBATCH -S 0
# Train on Frontier (OLCF): HPE Cray EX, 4 AMD MI250X per node = 8 GCDs, one rank per GCD, ROCm.
#   sbatch tools/hpc/frontier.sh config.json        (the config sets Parallelism.strategy: ddp)
#   HYDRAGNN_DRY_RUN=1 bash tools/hpc/frontier.sh config.json   prints the launch line only
# Once, on a login node: a virtual environment with torch's ROCm build and HydraGNN's wheels
#   module load PrgEnv-gnu rocm/6.2.4 craype-accel-amd-gfx90a cray-python
#   python -m venv $HOME/hydragnn-env && . $HOME/hydragnn-env/bin/activate
#   pip install torch --index-url https://download.pytorch.org/whl/rocm6.2
#   pip install --find-links dist hydra-train        (dist/: `nox -s wheels` in a checkout)
# Ranks read SLURM_PROCID / SLURM_LOCALID / SLURM_STEP_NODELIST (hydragnn.train.strategies.launch):
# no torchrun, no MASTER_ADDR to set.
set -euo pipefail
CONFIG=${1:?usage: sbatch frontier.sh config.json [hydragnn-train options]}
shift
NODES=${SLURM_JOB_NUM_NODES:-2}
GCDS_PER_NODE=8
if [[ ${HYDRAGNN_DRY_RUN:-0} != 1 ]]; then
  module load PrgEnv-gnu rocm/6.2.4 craype-accel-amd-gfx90a cray-python
  # shellcheck disable=SC1091
  . "${HYDRAGNN_ENV:-$HOME/hydragnn-env}/bin/activate"
fi
export OMP_NUM_THREADS=7                      # 56 usable cores per node over 8 ranks
export MIOPEN_USER_DB_PATH=/tmp/miopen-${USER:-hydragnn} MIOPEN_CUSTOM_CACHE_DIR=/tmp/miopen-${USER:-hydragnn}
export NCCL_SOCKET_IFNAME=hsn0 FI_CXI_ATS=0   # RCCL over the Slingshot interfaces
launch=(srun -N "$NODES" -n $((NODES * GCDS_PER_NODE)) --ntasks-per-node="$GCDS_PER_NODE" -c 7
  --gpus-per-task=1 --gpu-bind=closest hydragnn-train "$CONFIG" "$@")
if [[ ${HYDRAGNN_DRY_RUN:-0} == 1 ]]; then echo "${launch[*]}"; exit 0; fi
"${launch[@]}"
