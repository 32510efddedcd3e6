"""Who started this process: torchrun, SLURM's srun, Open MPI's mpirun, LSF's jsrun, or an MPICH /
PALS launcher (mpiexec on Aurora), read from the variables each one sets.

torch.distributed's ``env://`` rendezvous reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, which only torchrun sets. :func:`detect_launch` reads the launcher's own
variables instead and :func:`export_torch_env` writes the torchrun ones from them (plus
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``), so the same config trains under any of them.
Nothing here imports torch.

The first launcher whose variables are present wins, in this order: torchrun (``RANK`` and
``WORLD_SIZE`` with ``MASTER_ADDR``), Open MPI (``OMPI_COMM_WORLD_*``; before SLURM, because an
``mpirun`` inside an allocation also sees the allocation's ``SLURM_*``), SLURM (an ``srun`` step:
``SLURM_PROCID`` with ``SLURM_STEP_NUM_TASKS``; a batch script's own shell, which has no step,
is one process), LSF ``jsrun`` (``JSM_NAMESPACE_*``), PMI (``PMI_RANK`` / ``PMI_SIZE``: MPICH,
Cray PALS).

The rendezvous address: ``MASTER_ADDR`` or ``HYDRAGNN_MASTER_ADDR`` when set; else the first
host of the step's node list (SLURM), of ``LSB_MCPU_HOSTS`` past the launch node (LSF); else, when
every rank is on this node, ``127.0.0.1``. Several nodes without any of these is an error that
says what to set. The port: ``MASTER_PORT`` or ``HYDRAGNN_MASTER_PORT``, else one derived from the
job's id (``SLURM_JOB_ID``, ``LSB_JOBID``, ``PBS_JOBID``, Open MPI's job namespace), so two jobs
sharing a node do not meet on one port, else 29500.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["LaunchEnv", "detect_launch", "export_torch_env", "parse_slurm_nodelist"]

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    """One process's place in a launch: ``launcher`` (``torchrun``, ``slurm``, ``openmpi``,
    ``lsf``, ``pmi``), its global ``rank`` of ``world_size``, its ``local_rank`` of
    ``local_world_size`` on this node, and the rendezvous ``master_addr``:``master_port``."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def parse_slurm_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list: ``"cn[01-03,07],gpu5"`` -> ``["cn01", "cn02", "cn03", "cn07", "gpu5"]``
    (ranges keep their zero padding).

    Raises:
        ConfigError: a list that is not SLURM's syntax.
    """
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?(?:,|$)", nodelist.strip()):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            bounds = part.split("-")
            if len(bounds) == 1 and bounds[0].isdigit():
                hosts.append(prefix + bounds[0])
            elif len(bounds) == 2 and all(b.isdigit() for b in bounds) and int(bounds[0]) <= int(bounds[1]):
                width = len(bounds[0])
                hosts.extend(f"{prefix}{i:0{width}d}" for i in range(int(bounds[0]), int(bounds[1]) + 1))
            else:
                raise ConfigError(f"SLURM node list {nodelist!r}: cannot read the range {part!r}")
    if not hosts:
        raise ConfigError(f"SLURM node list {nodelist!r}: no host in it")
    return hosts


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not value.isdigit():
        raise ConfigError(f"environment variable {name}={value!r}: expected a non-negative integer")
    return int(value)


def _port(env: Mapping[str, str]) -> int:
    for name in ("MASTER_PORT", "HYDRAGNN_MASTER_PORT"):
        if env.get(name):
            port = _int(env, name)
            if not 0 < port < 65536:
                raise ConfigError(f"environment variable {name}={port}: not a TCP port")
            return port
    for name in ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        job = env.get(name)
        if job:
            digest = int.from_bytes(hashlib.sha256(job.encode()).digest()[:4], "big")
            return 20000 + digest % 30000
    return DEFAULT_PORT


def _address(env: Mapping[str, str], launcher: str, world: int, local_world: int) -> str:
    for name in ("MASTER_ADDR", "HYDRAGNN_MASTER_ADDR"):
        if env.get(name):
            return env[name]
    if launcher == "slurm":
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if nodes:
            return parse_slurm_nodelist(nodes)[0]
    if launcher == "lsf" and env.get("LSB_MCPU_HOSTS"):
        # "launchnode 1 compute1 42 compute2 42": host / slot pairs, the first the launch node
        fields = env["LSB_MCPU_HOSTS"].split()
        if len(fields) >= 4:
            return fields[2]
    if world == local_world:
        return "127.0.0.1"
    raise ConfigError(
        f"{launcher}: {world} ranks over several nodes, and no rendezvous address: set MASTER_ADDR to the first "
        "node's host name for every rank (for example `mpirun -x MASTER_ADDR=$(hostname) ...`)"
    )


def _torchrun(env: Mapping[str, str]) -> tuple[str, int, int, int, int] | None:
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
        local = _int(env, "LOCAL_RANK") if env.get("LOCAL_RANK") else 0
        return "torchrun", _int(env, "RANK"), world, local, local_world
    return None


def _openmpi(env: Mapping[str, str]) -> tuple[str, int, int, int, int] | None:
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else 1
        return "openmpi", _int(env, "OMPI_COMM_WORLD_RANK"), world, local, local_world
    return None


def _slurm(env: Mapping[str, str]) -> tuple[str, int, int, int, int] | None:
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None  # not inside an srun step (a batch script's shell is one process)
    world = _int(env, "SLURM_STEP_NUM_TASKS")
    local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    # SLURM_STEP_TASKS_PER_NODE "2(x3),1": 2 tasks on each of the first 3 nodes, 1 on the fourth
    counts: list[int] = []
    for m in re.finditer(r"(\d+)(?:\(x(\d+)\))?", env.get("SLURM_STEP_TASKS_PER_NODE", "")):
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    nodes = _int(env, "SLURM_STEP_NUM_NODES") if "SLURM_STEP_NUM_NODES" in env else 1
    local_world = counts[node] if node < len(counts) else (world if nodes == 1 else 1)
    return "slurm", _int(env, "SLURM_PROCID"), world, local, local_world


def _lsf(env: Mapping[str, str]) -> tuple[str, int, int, int, int] | None:
    if "JSM_NAMESPACE_RANK" in env and "JSM_NAMESPACE_SIZE" in env:
        local = _int(env, "JSM_NAMESPACE_LOCAL_RANK") if "JSM_NAMESPACE_LOCAL_RANK" in env else 0
        local_world = _int(env, "JSM_NAMESPACE_LOCAL_SIZE") if "JSM_NAMESPACE_LOCAL_SIZE" in env else 1
        return "lsf", _int(env, "JSM_NAMESPACE_RANK"), _int(env, "JSM_NAMESPACE_SIZE"), local, local_world
    return None


def _pmi(env: Mapping[str, str]) -> tuple[str, int, int, int, int] | None:
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        local_name = next((n for n in ("PALS_LOCAL_RANKID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK") if n in env), None)
        size_name = next((n for n in ("PALS_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE") if n in env), None)
        local = _int(env, local_name) if local_name else 0
        local_world = _int(env, size_name) if size_name else 1
        return "pmi", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"), local, local_world
    return None


_LAUNCHERS = (_torchrun, _openmpi, _slurm, _lsf, _pmi)


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """This process's :class:`LaunchEnv`, or ``None`` when no launcher started it (one process).

    Raises:
        ConfigError: a launcher's variables that contradict each other (a rank outside the
            world) or several nodes without a rendezvous address.
    """
    env = os.environ if env is None else env
    for read in _LAUNCHERS:
        found = read(env)
        if found is None:
            continue
        launcher, rank, world, local, local_world = found
        if not (0 <= rank < world) or not (0 <= local < max(local_world, 1)):
            raise ConfigError(
                f"{launcher}: rank {rank} of {world} (local {local} of {local_world}) is not a place in the launch"
            )
        addr = env["MASTER_ADDR"] if launcher == "torchrun" else _address(env, launcher, world, local_world)
        return LaunchEnv(launcher, rank, world, local, local_world, addr, _port(env))
    return None


def export_torch_env(launch: LaunchEnv, env: MutableMapping[str, str] | None = None) -> None:
    """Write ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` of ``launch`` (what ``init_process_group("env://")`` and the thread
    defaults read)."""
    env = os.environ if env is None else env
    env.update(
        {
            "RANK": str(launch.rank),
            "WORLD_SIZE": str(launch.world_size),
            "LOCAL_RANK": str(launch.local_rank),
            "LOCAL_WORLD_SIZE": str(launch.local_world_size),
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
        }
    )
