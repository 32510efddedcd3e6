"""The facility job scripts under tools/hpc: valid bash, and each dry run prints the launch line it
would execute for the job's node count (SLURM's srun on Frontier and Perlmutter, PALS' mpiexec on
Aurora), passing the config and the options after it through."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

HPC = pathlib.Path(__file__).resolve().parents[2] / "tools" / "hpc"


def _dry(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
    return subprocess.run(
        ["bash", str(HPC / script), *args], capture_output=True, text=True, timeout=30, check=False,
        env={**clean, "HYDRAGNN_DRY_RUN": "1", **env},
    )  # fmt: skip


@pytest.mark.parametrize("script", sorted(p.name for p in HPC.glob("*.sh")))
def test_scripts_are_valid_bash(script):
    proc = subprocess.run(["bash", "-n", str(HPC / script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("script", "ranks_per_node", "expected"),
    [
        ("frontier.sh", 8, "-c 7 --gpus-per-task=1 --gpu-bind=closest hydragnn-train cfg.json --resume"),
        ("perlmutter.sh", 4, "-c 32 --gpus-per-task=1 --gpu-bind=none hydragnn-train cfg.json --resume"),
    ],
)
def test_slurm_scripts_launch_one_rank_per_gpu(script, ranks_per_node, expected):
    proc = _dry(script, "cfg.json", "--resume", SLURM_JOB_NUM_NODES="3")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"srun -N 3 -n {3 * ranks_per_node} --ntasks-per-node={ranks_per_node} ")
    assert line.endswith(expected)
    assert _dry(script).returncode != 0 and "usage" in _dry(script).stderr


def test_aurora_launches_twelve_tiles_per_node_with_the_first_node_as_rendezvous(tmp_path):
    hosts = tmp_path / "nodefile"
    hosts.write_text("x4102c5s0b0n0\nx4102c5s0b0n0\nx4102c5s1b0n0\n")
    proc = _dry("aurora.sh", "cfg.json", PBS_NODEFILE=str(hosts))
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("MASTER_ADDR=x4102c5s0b0n0 mpiexec -n 24 --ppn 12 ")
    assert line.endswith("gpu_tile_compact.sh hydragnn-train cfg.json")
    missing = _dry("aurora.sh", "cfg.json")
    assert missing.returncode != 0 and "PBS_NODEFILE is unset" in missing.stderr
