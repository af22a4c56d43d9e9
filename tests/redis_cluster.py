"""A private Redis Cluster for the tests: real redis-server processes, masters with replicas, real failovers.

Cluster semantics (CROSSSLOT refusals, MOVED after a failover, scripts confined to one slot) exist only
on a real cluster, so ``ClusterServers`` starts one: N masters with R replicas each (3 x 1 by default), each
node a ``RedisServer`` on free ports in its own temp dir, joined with ``redis-cli --cluster create``.
The node timeout is short and replicas are always eligible, so a killed master is replaced in a few seconds.

``python -m tests.redis_cluster`` starts one, prints its nodes and timings, and stops it (a smoke check).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import redis
from redis.cluster import ClusterNode

from tests.redis_server import RedisServer, _ExitedEarlyError, find_redis_cli, find_redis_server, free_port

HOST = "127.0.0.1"
SLOTS = 16384

NODE_TIMEOUT_MS = 1000  # a dead master is flagged FAIL after ~1 s (the default 15 s would make failover tests slow)
CLUSTER_ARGS = [
    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
    # A replica may be promoted however long it last heard from its master: in a test the master is killed
    # right after the write, and a stale-replica veto would only make the failover wait or never happen.
    "--cluster-replica-validity-factor", "0",
    # Redis 7.0 waits 5 s by default for more replicas before a diskless full sync: every replica would wait.
    "--repl-diskless-sync-delay", "0",
    # CLUSTER SLOTS, where clients learn the topology, hides a replica whose replication offset is still 0 (Redis
    # 7.0); the master's pings to its replicas move that offset, every 10 s by default.
    "--repl-ping-replica-period", "1",
]


@dataclass
class _ClusterNode(RedisServer):
    """A RedisServer in cluster mode; its bus port is free-port-picked too, since port + 10000 may not be."""

    bus_port: int = field(default_factory=free_port)

    def _start(self) -> None:
        self.extra_args = [*CLUSTER_ARGS, "--cluster-port", str(self.bus_port)]
        try:
            super()._start()
        except _ExitedEarlyError:
            # Either port may be the one taken: start() retries on a new port, and on a new bus port from here.
            self.bus_port = free_port()
            raise


class NodeView(NamedTuple):
    """One line of ``CLUSTER NODES``: how one node sees another."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str  # "-" for a master
    slots: int  # how many slots it serves

    @property
    def is_master(self) -> bool:
        return "master" in self.flags and "fail" not in self.flags


def node_client(port: int) -> redis.Redis:
    """A plain client of one node: it sees only that node's slots, and is not redirected."""
    return redis.Redis(host=HOST, port=port, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)


def _slot_count(ranges: list[str]) -> int:
    # "0-5460", "5461", or "[93->-id]" (a slot being migrated: not served here yet)
    count = 0
    for r in ranges:
        if not r.startswith("["):
            lo, _, hi = r.partition("-")
            count += int(hi or lo) - int(lo) + 1
    return count


def cluster_nodes(port: int) -> list[NodeView]:
    """The cluster as the node on ``port`` sees it (``CLUSTER NODES``, parsed)."""
    with node_client(port) as c:
        text = c.execute_command("CLUSTER", "NODES")  # split in two: no redis-py reply callback reshapes it
    views = []
    for line in str(text).splitlines():
        node_id, addr, flags, master_id, *_ = line.split(" ")
        node_port = int(addr.split("@")[0].rsplit(":", 1)[1])
        views.append(NodeView(node_id, node_port, frozenset(flags.split(",")), master_id,
                              _slot_count(line.split(" ")[8:])))
    return views


def cluster_info(port: int) -> dict[str, str]:
    """``CLUSTER INFO`` of the node on ``port``, as a dict."""
    with node_client(port) as c:
        text = c.execute_command("CLUSTER", "INFO")
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


def _poll(what: str, timeout: float, check: Callable[[], bool]) -> None:
    """Wait until ``check()`` holds; a node that refuses or times out counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"redis cluster: {what} within {timeout} s")


@dataclass
class ClusterServers:
    """A Redis Cluster of ``masters_count`` masters with ``replicas`` replicas each, on free ports (see module doc).

    Named so as not to clash with ``redis.RedisCluster``, the client. Ports identify nodes everywhere.
    """

    binary: str
    cli: str
    masters_count: int = 3
    replicas: int = 1
    nodes: dict[int, _ClusterNode] = field(default_factory=dict)  # by port, the stopped ones included
    _replicas_at_stop: dict[int, list[int]] = field(default_factory=dict)

    def start(self, timeout: float = 60) -> None:
        """Start every node, join them into one cluster and wait until it serves every slot everywhere."""
        servers = [_ClusterNode(self.binary) for _ in range(self.masters_count * (1 + self.replicas))]
        try:
            for s in servers:
                s.start()  # retries a taken port on a new one: nobody holds the ports before the create below
            self.nodes = {s.port: s for s in servers}
            self._create(timeout)
            self.wait_ok(timeout)
        except BaseException:
            for s in servers:  # the started ones and the temp dirs of all
                s.cleanup()
            raise

    def _create(self, timeout: float) -> None:
        # redis-cli makes the first `masters_count` addresses masters and spreads the replicas over them.
        args = [self.cli, "--cluster", "create", *(f"{HOST}:{p}" for p in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        run = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
        if run.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed ({run.returncode}):\n{run.stdout}{run.stderr}")

    def live(self) -> list[int]:
        """Ports of the nodes still running."""
        return [port for port, node in self.nodes.items() if node.proc is not None]

    def _view(self) -> list[NodeView]:
        # Any live node's view will do for the roles: wait_ok()/wait_failover() made them agree.
        return cluster_nodes(self.live()[0])

    def masters(self) -> list[int]:
        """Ports of the live masters that serve slots."""
        live = set(self.live())
        return [n.port for n in self._view() if n.is_master and n.slots and n.port in live]

    def replicas_of(self, master_port: int) -> list[int]:
        """Ports of the live replicas of the master on ``master_port``."""
        view = self._view()
        master_id = next(n.id for n in view if n.port == master_port)
        live = set(self.live())
        return [n.port for n in view if n.master_id == master_id and "fail" not in n.flags and n.port in live]

    def replica_of(self, master_port: int) -> int:
        """The port of one replica of the master on ``master_port``."""
        return self.replicas_of(master_port)[0]

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """Every live node, for ``redis.RedisCluster(startup_nodes=...)``."""
        return [ClusterNode(HOST, port) for port in self.live()]

    @property
    def url(self) -> str:
        """``redis://`` URL of a live master, for ``redis.RedisCluster.from_url`` (which discovers the rest)."""
        return f"redis://{HOST}:{self.masters()[0]}"

    def _healthy(self) -> bool:
        """Every live node: cluster_state ok, all slots served; every live replica: its link to its master up."""
        live = self.live()
        for port in live:
            info = cluster_info(port)
            if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != SLOTS:
                return False
        view = cluster_nodes(live[0])
        if sum(n.slots for n in view if n.is_master) != SLOTS:
            return False
        # Every live node is a master serving slots or, in this view, a replica of one: right after
        # `redis-cli --cluster create` a replica's role may not have reached this node yet, and its master
        # would read as having none (replicas_of(), which reads this view, found no replica).
        serving = {n.id for n in view if n.is_master and n.slots and n.port in live}
        if len(serving) + sum(1 for n in view if n.port in live and n.master_id in serving) != len(live):
            return False
        for n in view:
            if n.port in live and "slave" in n.flags:
                with node_client(n.port) as c:
                    if c.info("replication").get("master_link_status") != "up":
                        return False
        # What a client is told: every slot range with its master and as many replicas as are alive.
        expected = {n.id: sum(1 for r in view if r.master_id == n.id and r.port in live) for n in view if n.is_master}
        for port in live:
            with node_client(port) as c:
                ranges = c.execute_command("CLUSTER", "SLOTS")
            if any(len(r) - 3 != expected.get(r[2][2], -1) for r in ranges):
                return False
        return True

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until the cluster serves every slot on every live node and the replicas are in sync."""
        _poll("every node to say cluster_state:ok with every slot served", timeout, self._healthy)

    def stop(self, port: int) -> None:
        """Kill the node on ``port`` (SIGKILL: a crash, nothing handed over). Its data dir stays until stop_all."""
        self._replicas_at_stop[port] = self.replicas_of(port)
        self.nodes[port].kill()

    def wait_failover(self, old_master_port: int, timeout: float = 30) -> int:
        """Wait until a replica of the stopped master is promoted and the cluster is ok again; its port.

        "Ok" is as every surviving node sees it, not just one: a client may ask any of them for the slot map.
        """
        candidates = self._replicas_at_stop.get(old_master_port)
        if not candidates:
            raise ValueError(f"node {old_master_port} was not a master with replicas when stop() killed it")

        def promoted() -> bool:
            return (any(p in candidates for p in self.masters())
                    and all("fail" in n.flags for n in cluster_nodes(self.live()[0]) if n.port == old_master_port)
                    and self._healthy())

        _poll(f"a replica of {old_master_port} to take over", timeout, promoted)
        return next(p for p in self.masters() if p in candidates)

    def rejoin(self, port: int, timeout: float = 30) -> None:
        """Start the node stopped on ``port`` again (same port, same nodes.conf): it comes back as a replica.

        Redis makes a returning master that lost its slots a replica of the one that took them over; wait
        until it is in sync, so the failed-over slots have a replica again.
        """
        self.nodes[port].start()
        self.wait_ok(timeout)

    def flushall(self) -> None:
        """Empty every master (their replicas follow)."""
        for port in self.masters():
            with node_client(port) as c:
                c.flushall()

    def stop_all(self) -> None:
        """Stop every node and remove its data dir."""
        for node in self.nodes.values():
            node.cleanup()


def start_cluster(masters: int = 3, replicas: int = 1) -> ClusterServers:
    """A started ClusterServers with the installed binaries (RuntimeError naming the missing one)."""
    binary, cli = find_redis_server(), find_redis_cli()
    if binary is None or cli is None:
        raise RuntimeError(f"{'redis-server' if binary is None else 'redis-cli'} is not installed")
    cluster = ClusterServers(binary, cli, masters, replicas)
    cluster.start()
    return cluster


def _smoke() -> int:
    t0 = time.monotonic()
    cluster = start_cluster()
    try:
        started = time.monotonic() - t0
        print(f"started in {started:.2f} s: {cluster.url}")
        for n in sorted(cluster_nodes(cluster.live()[0]), key=lambda n: n.port):
            print(f"  {n.port}  {','.join(sorted(n.flags - {'myself'})):8} slots={n.slots}")
        print("cluster_info:", {k: v for k, v in cluster_info(cluster.live()[0]).items()
                                if k in ("cluster_state", "cluster_slots_ok", "cluster_known_nodes", "cluster_size")})
        victim = cluster.masters()[0]
        t1 = time.monotonic()
        cluster.stop(victim)
        new = cluster.wait_failover(victim)
        print(f"killed master {victim}: replica {new} promoted, cluster ok again in {time.monotonic() - t1:.2f} s")
    finally:
        cluster.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(_smoke())
