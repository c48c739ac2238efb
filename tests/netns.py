"""Several nodes on one machine: each node a network namespace this test creates, with its own address on a bridge
the test creates, its own host name (a UTS namespace) and a hosts file naming every node (bound over /etc/hosts in
a mount namespace of its own). Traffic goes only between the namespaces and the bridge's own
address in the root namespace, where a test's servers (moto, slurmctld) listen. Needs root (CAP_NET_ADMIN).

    with Cluster(2) as cluster:
        proc = cluster.popen(0, ["bash", "deploy_8gpu.sh", ...], env=...)
        cluster.kill(1)   # SIGKILL every process of node 1
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path


def can_make_namespaces() -> str | None:
    """None when this machine lets a test make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not all(shutil.which(tool) for tool in ("ip", "unshare", "nsenter")):
        return "needs ip (iproute2), unshare and nsenter (util-linux)"
    name = f"kt{random.randrange(16**6):06x}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Cluster:
    def __init__(self, nodes: int):
        tag = f"{random.randrange(16**4):04x}"
        self.subnet = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.bridge = f"ktb{tag}"
        self.head_address = f"{self.subnet}.1"  # the root namespace's side: where the test's servers listen
        self.names = [f"ktn{tag}-{i}" for i in range(nodes)]
        self.hosts = [f"node{i}" for i in range(nodes)]
        self.addresses = [f"{self.subnet}.{10 + i}" for i in range(nodes)]
        self._procs: list[subprocess.Popen] = []
        self._replaced = 0

    def __enter__(self) -> "Cluster":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.head_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(len(self.names)):
                self._add_node(i)
        except BaseException:
            self.close()
            raise
        return self

    def _add_node(self, i: int) -> None:
        ns = self.names[i]
        _ip("netns", "add", ns)
        self.write_hosts()
        outside, inside = f"{ns[-6:]}a{i}", f"{ns[-6:]}b{i}"
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("link", "set", inside, "netns", ns)
        _ip("addr", "add", f"{self.addresses[i]}/24", "dev", inside, ns=ns)
        _ip("link", "set", inside, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)

    def write_hosts(self) -> None:
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for a, h in zip(self.addresses, self.hosts))
        hosts += f"{self.head_address} bridge\n"
        for ns in self.names:
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts)

    def replace(self, node: int) -> None:
        """Node `node` gone (every process killed, its namespace deleted) and a new machine in its place: the same
        host name, a new namespace and a new address on the same bridge (where the test's servers still listen)."""
        self.kill(node)
        subprocess.run(["ip", "netns", "del", self.names[node]], capture_output=True)
        shutil.rmtree(f"/etc/netns/{self.names[node]}", ignore_errors=True)
        self._replaced += 1
        self.names[node] = f"{self.names[node].rsplit('-', 1)[0]}-r{self._replaced}"
        self.addresses[node] = f"{self.subnet}.{100 + self._replaced}"
        self._add_node(node)

    def __exit__(self, *exc) -> None:
        self.close()

    def command(self, node: int, argv: list[str]) -> list[str]:
        """argv run inside node's network namespace, under its host name, with the hosts file naming every node.
        (Not `ip netns exec`: it mounts a fresh /sys, without the cgroup tree slurmd needs.)"""
        hosts = f"/etc/netns/{self.names[node]}/hosts"
        return ["nsenter", f"--net=/run/netns/{self.names[node]}", "unshare", "--uts", "--mount", "sh", "-c",
                f'mount --bind {hosts} /etc/hosts && hostname {self.hosts[node]} && exec "$@"', "sh", *argv]

    def popen(self, node: int, argv: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(node, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, node: int) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.names[node]], capture_output=True, text=True)
        return [int(p) for p in listed.stdout.split()]

    def kill(self, node: int) -> int:
        """SIGKILL every process of the node, as a node that loses power: returns how many there were."""
        killed = 0
        for _ in range(5):  # (a process may fork while the others die)
            pids = self.pids(node)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # (it ended on its own meanwhile)
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.2)
        return killed

    def close(self) -> None:
        for i in range(len(self.names)):
            self.kill(i)
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
