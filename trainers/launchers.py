"""The node's place in a multi-node job, read from the cluster launcher that started it.

SLURM, SkyPilot, Kubeflow (Trainer's TrainJob and the older PyTorchJob) and dstack each tell every node its
rank, the node count and the head's address, each in its own variables. `deploy_8gpu.sh` runs this before
anything else (with the system's python3: the standard library only, the kit may not be installed yet) and
takes the topology from it, so a user of one of those launchers passes no multi-node flag at all.

Flags are the user's own word: `--rdzv-endpoint` re-aims the head (another interface, another port) and
`--gpus` picks how many of the node's GPUs to use. A flag that names another node count or rank than the
launcher's is refused: that node would wait at the rendezvous for a job that does not exist. So is an
environment that contradicts itself (a rank past the node count, an address list of the wrong length), or two
launchers that disagree. Each refusal is one line, exit 2.

    python3 -m trainers.launchers [--nnodes N] [--node-rank R] [--rdzv-endpoint H:P]

prints `key=value` lines (launcher, nnodes, node_rank, rdzv_endpoint, gpus_per_node, job_id, summary) for the
deploy to read; nothing at all for a plain one-box run.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

DEFAULT_PORT = 29500  # torchrun's own default; launchers that open a port for the job (Kubeflow) name theirs
_HOST = re.compile(r"^[A-Za-z0-9._-]+$")


class LauncherError(ValueError):
    """The launcher's environment, or the flags beside it, cannot describe one job."""


@dataclass(frozen=True)
class Topology:
    launcher: str  # "slurm", "skypilot", "kubeflow", "pytorchjob", "dstack"
    nnodes: int
    node_rank: int
    head: str  # the rank-0 node's address, where the rendezvous store listens
    port: int
    gpus_per_node: int | None = None  # None: the launcher does not say (then every visible GPU is used)
    job_id: str = ""  # the launcher's own id for this job: it names the rendezvous

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else ""
        return (f"{self.launcher}: node {self.node_rank} of {self.nnodes}, head {self.head}:{self.port}{gpus}"
                + (f", job {self.job_id}" if self.job_id else ""))


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = env[name].strip()
    if not value.isdigit() or int(value) < minimum:
        raise LauncherError(f"{name}='{env[name]}' is not a whole number >= {minimum}")
    return int(value)


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    """A count the launcher may give as a word (Kubeflow's PET_NPROC_PER_NODE=auto): None unless a number > 0."""
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _host(name: str, value: str) -> str:
    value = value.strip()
    if not _HOST.match(value):
        raise LauncherError(f"{name}='{value}' is not a host name or an IPv4 address")
    return value


def _rank_in_range(launcher: str, rank_var: str, rank: int, nnodes: int) -> None:
    if rank >= nnodes:
        raise LauncherError(f"{launcher}: {rank_var}={rank} is not a node of a {nnodes}-node job (0..{nnodes - 1})")


def _nodes_and_rank(launcher: str, env: Mapping[str, str], count_var: str, rank_var: str,
                    rank_default: int | None = None) -> tuple[int, int]:
    """The node count and this node's rank from the launcher's two variables, the rank checked against the count."""
    nnodes = _int(env, count_var, 1)
    rank = _int(env, rank_var) if rank_var in env or rank_default is None else rank_default
    _rank_in_range(launcher, rank_var, rank, nnodes)
    return nnodes, rank


def _address_list(launcher: str, name: str, env: Mapping[str, str], nnodes: int) -> list[str]:
    addresses = [_host(name, line) for line in env[name].splitlines() if line.strip()]
    if len(addresses) != nnodes:
        raise LauncherError(f"{launcher}: {name} lists {len(addresses)} address(es) for a {nnodes}-node job")
    return addresses


def scontrol_hostnames(nodelist: str) -> list[str]:
    """SLURM's own expansion of a compressed node list (node[01-04,07]): `scontrol show hostnames`."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except FileNotFoundError:
        raise LauncherError("SLURM_JOB_NODELIST is set but scontrol is not on PATH to expand it; "
                            "pass --rdzv-endpoint HOST:PORT (the first node's address)") from None
    except subprocess.CalledProcessError as err:
        said = (err.stderr or "").strip().splitlines()
        raise LauncherError(f"scontrol show hostnames '{nodelist}' failed: {said[-1] if said else err}; "
                            "pass --rdzv-endpoint HOST:PORT (the first node's address)") from None
    except subprocess.TimeoutExpired:
        raise LauncherError(f"scontrol show hostnames '{nodelist}' did not answer in 30 s") from None
    return out.split()


def slurm(env: Mapping[str, str], hostnames: Callable[[str], list[str]] | None) -> Topology | None:
    if "SLURM_JOB_NODELIST" not in env or "SLURM_NNODES" not in env:
        return None
    nnodes, rank = _nodes_and_rank("slurm", env, "SLURM_NNODES", "SLURM_NODEID", rank_default=0)
    if "SLURM_NTASKS" in env and _int(env, "SLURM_NTASKS", 1) > nnodes:
        # srun --ntasks-per-node=8 out of habit: eight deploys per node, each starting its own torchrun
        raise LauncherError(f"slurm: SLURM_NTASKS={env['SLURM_NTASKS']} on {nnodes} node(s): the deploy runs once per "
                            "node and starts a worker per GPU itself; use srun --ntasks-per-node=1")
    head = ""
    if hostnames is not None:
        nodes = hostnames(env["SLURM_JOB_NODELIST"])
        if len(nodes) != nnodes:
            raise LauncherError(f"slurm: SLURM_JOB_NODELIST='{env['SLURM_JOB_NODELIST']}' names {len(nodes)} node(s), "
                                f"SLURM_NNODES={nnodes}")
        head = _host("SLURM_JOB_NODELIST", nodes[0])
    return Topology("slurm", nnodes, rank, head, DEFAULT_PORT, _optional_int(env, "SLURM_GPUS_ON_NODE"),
                    env.get("SLURM_JOB_ID", ""))


def skypilot(env: Mapping[str, str]) -> Topology | None:
    if "SKYPILOT_NODE_RANK" not in env or "SKYPILOT_NODE_IPS" not in env:
        return None
    rank = _int(env, "SKYPILOT_NODE_RANK")
    addresses = [line.strip() for line in env["SKYPILOT_NODE_IPS"].splitlines() if line.strip()]
    nnodes = _int(env, "SKYPILOT_NUM_NODES", 1) if "SKYPILOT_NUM_NODES" in env else len(addresses)
    addresses = _address_list("skypilot", "SKYPILOT_NODE_IPS", env, nnodes)
    _rank_in_range("skypilot", "SKYPILOT_NODE_RANK", rank, nnodes)
    return Topology("skypilot", nnodes, rank, addresses[0], DEFAULT_PORT,
                    _optional_int(env, "SKYPILOT_NUM_GPUS_PER_NODE"), env.get("SKYPILOT_TASK_ID", ""))


def kubeflow(env: Mapping[str, str]) -> Topology | None:
    """Kubeflow Trainer's torch plugin (and PyTorchJob's elastic mode): torchrun's own PET_ options."""
    if "PET_NNODES" not in env or "PET_NODE_RANK" not in env:
        return None
    nnodes, rank = _nodes_and_rank("kubeflow", env, "PET_NNODES", "PET_NODE_RANK")
    head = _host("PET_MASTER_ADDR", env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR", ""))
    port_var = "PET_MASTER_PORT" if "PET_MASTER_PORT" in env else "MASTER_PORT"
    port = _int(env, port_var, 1) if port_var in env else DEFAULT_PORT
    return Topology("kubeflow", nnodes, rank, head, port, _optional_int(env, "PET_NPROC_PER_NODE"))


def pytorchjob(env: Mapping[str, str]) -> Topology | None:
    """The older PyTorchJob without torchrun: WORLD_SIZE is the pod count and RANK the pod's index."""
    names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
    if "PET_NNODES" in env or not all(name in env for name in names):
        return None
    nnodes, rank = _nodes_and_rank("pytorchjob", env, "WORLD_SIZE", "RANK")
    return Topology("pytorchjob", nnodes, rank, _host("MASTER_ADDR", env["MASTER_ADDR"]),
                    _int(env, "MASTER_PORT", 1))


def dstack(env: Mapping[str, str]) -> Topology | None:
    if "DSTACK_NODE_RANK" not in env or "DSTACK_NODES_NUM" not in env:
        return None
    nnodes, rank = _nodes_and_rank("dstack", env, "DSTACK_NODES_NUM", "DSTACK_NODE_RANK")
    head = _host("DSTACK_MASTER_NODE_IP", env.get("DSTACK_MASTER_NODE_IP", ""))
    if "DSTACK_NODES_IPS" in env and head not in _address_list("dstack", "DSTACK_NODES_IPS", env, nnodes):
        raise LauncherError(f"dstack: DSTACK_MASTER_NODE_IP={head} is not one of DSTACK_NODES_IPS")
    return Topology("dstack", nnodes, rank, head, DEFAULT_PORT, _optional_int(env, "DSTACK_GPUS_PER_NODE"),
                    env.get("DSTACK_RUN_NAME", ""))


def detect(env: Mapping[str, str], hostnames: Callable[[str], list[str]] | None = scontrol_hostnames) -> Topology | None:
    """The launcher this node runs under, or None. Two launchers at once (SkyPilot on a SLURM cluster) must agree."""
    found = [t for t in (slurm(env, hostnames), skypilot(env), kubeflow(env), pytorchjob(env), dstack(env)) if t]
    for other in found[1:]:
        if (other.nnodes, other.node_rank) != (found[0].nnodes, found[0].node_rank):
            raise LauncherError(f"two launchers disagree: {found[0].describe()}; {other.describe()}")
    return found[0] if found else None


def settle(found: Topology | None, nnodes: str, node_rank: str, endpoint: str) -> Topology | None:
    """The launcher's topology with the user's flags on top (empty string: the flag was not given)."""
    if found is None:
        return None
    for flag, given, launcher_says in (("--nnodes", nnodes, found.nnodes), ("--node-rank", node_rank, found.node_rank)):
        if given and given != str(launcher_says):
            raise LauncherError(f"{flag} {given} contradicts {found.describe()}; drop the flag or fix the job's request")
    head, port = found.head, found.port
    if endpoint:
        head, _, port_text = endpoint.rpartition(":")
        if not head or not port_text.isdigit():
            raise LauncherError(f"--rdzv-endpoint '{endpoint}' must be HOST:PORT")
        port = int(port_text)
    if not head:
        raise LauncherError(f"{found.launcher} names no head address here; pass --rdzv-endpoint HOST:PORT")
    if not 1 <= port <= 65535:
        raise LauncherError(f"the rendezvous port {port} is not in 1..65535")
    job_id = re.sub(r"[^A-Za-z0-9_.-]", "-", found.job_id)  # (it names the rendezvous: no spaces, no slashes)
    return Topology(found.launcher, found.nnodes, found.node_rank, head, port, found.gpus_per_node, job_id)


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m trainers.launchers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nnodes", default="")
    parser.add_argument("--node-rank", default="")
    parser.add_argument("--rdzv-endpoint", default="")
    args = parser.parse_args(argv)
    env = env if env is not None else os.environ
    try:
        # the head's name only when no flag names it: a cluster without scontrol on PATH still runs with the flag
        topology = settle(detect(env, None if args.rdzv_endpoint else scontrol_hostnames),
                          args.nnodes, args.node_rank, args.rdzv_endpoint)
    except LauncherError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if topology is None:
        return 0
    for key, value in (("launcher", topology.launcher), ("nnodes", topology.nnodes),
                       ("node_rank", topology.node_rank), ("rdzv_endpoint", f"{topology.head}:{topology.port}"),
                       ("gpus_per_node", topology.gpus_per_node or ""), ("job_id", topology.job_id),
                       ("summary", topology.describe())):
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
