"""Launching as HPC centres do: the rank layout read from srun, mpirun, jsrun and PMI variables,
and real runs under SLURM's ``srun`` (a one-node slurmd), Open MPI's ``mpirun`` and two ``torchrun``
agents meeting on loopback, which train the same model as ``torchrun --standalone``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from train_helpers import config

from hydragnn.train import ConfigError
from hydragnn.train.strategies.launch import LaunchEnv, detect_launch, export_torch_env, parse_slurm_nodelist

TIMEOUT_S = 300


# ----------------------------------------------------------------------------- the variables
def test_slurm_node_lists_expand_with_their_padding():
    assert parse_slurm_nodelist("frontier[00007-00009,00012],login2") == [
        "frontier00007", "frontier00008", "frontier00009", "frontier00012", "login2",
    ]  # fmt: skip
    assert parse_slurm_nodelist("nid001234") == ["nid001234"]
    with pytest.raises(ConfigError, match="cannot read the range"):
        parse_slurm_nodelist("cn[5-2]")


def test_an_srun_step_on_two_nodes():
    env = {
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "123456",
        "SLURM_STEP_NODELIST": "nid[001000-001001]", "SLURM_NTASKS": "8",
    }  # fmt: skip
    launch = detect_launch(env)
    assert launch is not None and launch.launcher == "slurm"
    assert (launch.rank, launch.world_size, launch.local_rank, launch.local_world_size) == (5, 8, 1, 4)
    assert launch.master_addr == "nid001000"
    assert launch.master_port == detect_launch({**env, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}).master_port
    other = detect_launch({**env, "SLURM_JOB_ID": "123457"})
    assert other.master_port != launch.master_port  # two jobs on one node meet on different ports
    # a batch script's own shell has job variables but no step: one process
    assert detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}) is None


def test_open_mpi_wins_over_the_allocation_it_runs_in():
    env = {
        "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
    }  # fmt: skip
    launch = detect_launch(env)
    assert (launch.launcher, launch.rank, launch.world_size, launch.master_addr) == ("openmpi", 1, 2, "127.0.0.1")
    several_nodes = {**env, "OMPI_COMM_WORLD_SIZE": "4"}
    with pytest.raises(ConfigError, match="set MASTER_ADDR"):
        detect_launch(several_nodes)
    assert detect_launch({**several_nodes, "MASTER_ADDR": "node7"}).master_addr == "node7"


def test_jsrun_and_pmi_launchers():
    lsf = {
        "JSM_NAMESPACE_RANK": "3", "JSM_NAMESPACE_SIZE": "12", "JSM_NAMESPACE_LOCAL_RANK": "3",
        "JSM_NAMESPACE_LOCAL_SIZE": "6", "LSB_MCPU_HOSTS": "batch3 1 a01n05 42 a01n06 42", "LSB_JOBID": "77",
    }  # fmt: skip
    launch = detect_launch(lsf)
    assert (launch.launcher, launch.rank, launch.world_size, launch.master_addr) == ("lsf", 3, 12, "a01n05")
    pals = {"PMI_RANK": "2", "PMI_SIZE": "24", "PALS_LOCAL_RANKID": "2", "PALS_LOCAL_SIZE": "12",
            "HYDRAGNN_MASTER_ADDR": "x1000c0s0b0n0", "PBS_JOBID": "42.aurora"}  # fmt: skip
    launch = detect_launch(pals)
    assert (launch.launcher, launch.local_world_size, launch.master_addr) == ("pmi", 12, "x1000c0s0b0n0")


def test_torchrun_is_read_as_it_is_and_bad_values_are_named():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234", "LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}  # fmt: skip
    assert detect_launch(env) == LaunchEnv("torchrun", 1, 2, 1, 2, "h", 1234)
    assert detect_launch({}) is None
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_RANK='x'"):
        detect_launch({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="rank 4 of 2"):
        detect_launch({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "2"})
    written: dict[str, str] = {}
    export_torch_env(LaunchEnv("slurm", 3, 4, 1, 2, "nid1", 20001), written)
    assert written == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "nid1", "MASTER_PORT": "20001"}  # fmt: skip


# ----------------------------------------------------------------------------- real launches
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("launch")
    cfg = config("mlip", n=16, epochs=1, Parallelism={"strategy": "ddp"})
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _env() -> dict[str, str]:
    drop = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "RANK", "WORLD_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) or k == "SLURM_CONF"}
    return {**env, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _train(cmd: list[str], args) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*cmd, "-m", "hydragnn.train.cli", *map(str, args)], capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False, env=_env(),
    )  # fmt: skip
    late_abort = "terminate called without an active exception" in proc.stderr  # FACTS: gloo at exit
    assert proc.returncode == 0 or late_abort, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def _weights(run_dir) -> dict[str, torch.Tensor]:
    from hydragnn.models import load_artifact

    return load_artifact(run_dir / "model.hydra").state_dict()


@pytest.fixture(scope="module")
def standalone(ddp_config, tmp_path_factory):
    run = tmp_path_factory.mktemp("standalone") / "run"
    _train([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"], (ddp_config, "--run-dir", run))  # fmt: skip
    return _weights(run)


def _launcher(exe: str, banner: str) -> str | None:
    """The first ``exe`` on PATH, beside this Python or in /usr/bin whose ``--version`` shows
    ``banner`` (an environment may hold several MPIs: MPICH's PyPI wheel puts its own ``mpirun``
    into the virtual environment, Debian's openmpi-bin into /usr/bin)."""
    folders = [*os.environ.get("PATH", "").split(os.pathsep), os.path.dirname(sys.executable), "/usr/bin"]
    for folder in dict.fromkeys(f for f in folders if f):
        path = os.path.join(folder, exe)
        if os.access(path, os.X_OK):
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
            if banner in out.stdout + out.stderr:
                return path
    return None


OPEN_MPI = _launcher("mpirun", "Open MPI")
MPICH = _launcher("mpiexec", "HYDRA")  # MPICH's Hydra process manager: ranks get PMI_RANK / PMI_SIZE


@pytest.mark.skipif(OPEN_MPI is None, reason="Open MPI's mpirun is not installed (.ci/run installs openmpi-bin)")
def test_mpirun_trains_the_same_model_as_torchrun(ddp_config, standalone, tmp_path):
    run = tmp_path / "run"
    proc = _train([OPEN_MPI, "-np", "2", "--oversubscribe", sys.executable], (ddp_config, "--run-dir", run))
    assert proc.stdout.count("run folder:") == 1  # rank 0 reports, rank 1 is quiet
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2
    weights = _weights(run)
    for key, value in standalone.items():
        assert torch.equal(weights[key], value), key


@pytest.mark.skipif(MPICH is None, reason="MPICH's mpiexec (Hydra) is not installed")
def test_mpich_mpiexec_trains_the_same_model_as_torchrun(ddp_config, standalone, tmp_path):
    """A PMI launcher for real: MPICH's Hydra (the same variables as Cray PALS on Aurora)."""
    run = tmp_path / "run"
    proc = _train([MPICH, "-n", "2", sys.executable], (ddp_config, "--run-dir", run))
    assert proc.stdout.count("run folder:") == 1
    weights = _weights(run)
    for key, value in standalone.items():
        assert torch.equal(weights[key], value), key


@pytest.mark.skipif(OPEN_MPI is None, reason="Open MPI's mpirun is not installed (.ci/run installs openmpi-bin)")
def test_mpirun_with_a_one_process_strategy_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config("mlip", n=16, epochs=1)))
    proc = subprocess.run(
        [OPEN_MPI, "-np", "2", "--oversubscribe", sys.executable, "-m", "hydragnn.train.cli", str(path), "--run-dir",
         str(tmp_path / "run")], capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=_env(),
    )  # fmt: skip
    assert proc.returncode != 0
    assert "'none' trains in one process, but openmpi started 2 ranks" in proc.stderr
    assert not (tmp_path / "run" / "model.hydra").exists()


def test_two_torchrun_agents_meet_on_loopback(ddp_config, standalone, tmp_path):
    """Two nodes as a cluster starts them: one agent per node, c10d rendezvous at node 0's address."""
    run = tmp_path / "run"
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes", "-m", "hydragnn.train.cli", str(ddp_config),
           "--run-dir", str(run)]  # fmt: skip
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
              for _ in range(2)]  # fmt: skip
    outputs = [agent.communicate(timeout=TIMEOUT_S) for agent in agents]
    for agent, (out, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0 or "terminate called without an active exception" in err, out[-2000:] + err[-3000:]
    assert sum(out.count("run folder:") for out, _ in outputs) == 1
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2
    weights = _weights(run)
    for key, value in standalone.items():
        assert torch.equal(weights[key], value), key


LOCAL_SLURM = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "hpc", "local_slurm.sh")
CAN_SLURM = shutil.which("slurmd") is not None and shutil.which("munged") is not None and os.geteuid() == 0


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory):
    """A real one-node SLURM cluster (slurmctld + slurmd, tools/hpc/local_slurm.sh), stopped after."""
    folder = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", LOCAL_SLURM, "start", str(folder)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield str(folder / "slurm.conf")
    subprocess.run(["bash", LOCAL_SLURM, "stop", str(folder)], capture_output=True, timeout=60, check=False)


@pytest.mark.skipif(not CAN_SLURM, reason="needs root and Debian's slurm-wlm and munge (.ci/run installs them)")
def test_srun_trains_the_same_model_as_torchrun(ddp_config, standalone, slurm_conf, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    run = tmp_path / "run"
    proc = _train(["srun", "-n", "2", "--overcommit", sys.executable], (ddp_config, "--run-dir", run))
    assert proc.stdout.count("run folder:") == 1
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2
    weights = _weights(run)
    for key, value in standalone.items():
        assert torch.equal(weights[key], value), key
