"""The Redis Cluster fixtures are a real cluster (issue 16): slots spread over masters, one-slot scripts, failover.

These pin what the cluster itself does, with redis-py's ``RedisCluster`` as the client, so that a RedisStorage
test on the cluster fixtures fails for the storage's reasons, not the fixture's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterCrossSlotError, RedisClusterException, ResponseError
from redis.retry import Retry

from tests.redis_cluster import ClusterServers, node_client
from tests.redis_server import RedisServer, find_redis_server

pytestmark = pytest.mark.redis

TWO_KEYS = ("redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]);"
            " return redis.call('MGET', KEYS[1], KEYS[2])")


def cluster_client(url_or_cluster: str | ClusterServers) -> redis.RedisCluster:
    """A RedisCluster client. After a ConnectionError it reloads the slot map from another node and retries.

    redis-py 8.1 uses only the retry count for single commands (no backoff between them), so the count is what
    carries a client across a failover that ``wait_failover`` already waited for.
    """
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=10)
    if isinstance(url_or_cluster, str):
        return redis.RedisCluster.from_url(url_or_cluster, decode_responses=True, retry=retry)
    return redis.RedisCluster(startup_nodes=url_or_cluster.startup_nodes, decode_responses=True, retry=retry)


@pytest.fixture
def rc(redis_cluster_url: str) -> Iterator[redis.RedisCluster]:
    client = cluster_client(redis_cluster_url)
    yield client
    client.close()


def keys_on(port: int) -> set[str]:
    """The keys the node on ``port`` holds itself (SCAN on one node sees only its own slots)."""
    with node_client(port) as c:
        return set(c.scan_iter())


def test_the_client_sees_every_master_and_replica(rc: redis.RedisCluster, redis_cluster: ClusterServers) -> None:
    assert rc.ping()
    masters = redis_cluster.masters()
    assert len(masters) == 3
    assert {n.port for n in rc.get_primaries()} == set(masters)
    assert {n.port for n in rc.get_replicas()} == {redis_cluster.replica_of(m) for m in masters}


def test_each_hash_tag_lives_on_one_master_and_the_tags_spread_over_all(
    rc: redis.RedisCluster, redis_cluster: ClusterServers
) -> None:
    tags = [f"job-{i}" for i in range(30)]
    for tag in tags:
        rc.set(f"{{{tag}}}:record", 1)
        rc.set(f"{{{tag}}}:messages", 1)

    held = {port: keys_on(port) for port in redis_cluster.masters()}
    assert all(held.values()), held  # 30 tags over 3 masters: each holds some
    for tag in tags:
        owners = [port for port, keys in held.items() if f"{{{tag}}}:record" in keys]
        assert len(owners) == 1
        assert f"{{{tag}}}:messages" in held[owners[0]]  # the same tag, the same slot, the same master
    assert sum(len(keys) for keys in held.values()) == 2 * len(tags)


def test_a_script_on_one_hash_tag_runs(rc: redis.RedisCluster) -> None:
    script = rc.register_script(TWO_KEYS)
    assert script(keys=["{job-1}:a", "{job-1}:b"], args=["v"]) == ["v", "v"]


def test_a_script_on_two_hash_tags_is_refused_by_the_client_and_by_the_server(rc: redis.RedisCluster) -> None:
    keys = ["{job-1}:a", "{job-2}:a"]
    assert rc.keyslot(keys[0]) != rc.keyslot(keys[1])
    # redis-py refuses before sending anything ...
    with pytest.raises(RedisClusterException, match="EVALSHA - all keys must map to the same key slot"):
        rc.register_script(TWO_KEYS)(keys=keys, args=["v"])
    # ... and a node the script is sent to anyway refuses it too, with nothing written.
    with pytest.raises(ClusterCrossSlotError, match="Keys in request don't hash to the same slot"):
        rc.execute_command("EVAL", TWO_KEYS, 2, *keys, "v", target_nodes=rc.get_node_from_key(keys[0]))
    assert rc.exists(*keys[:1]) == 0 and rc.exists(*keys[1:]) == 0


def test_a_script_touching_an_undeclared_key_on_another_master_is_refused(rc: redis.RedisCluster) -> None:
    """The client only checks declared KEYS; a key name built from ARGV reaches the server, which refuses it.

    (On the same master as KEYS[1], Redis 7.0 lets it through: such a script works or fails by slot placement.)
    """
    declared = "{job-1}:a"
    elsewhere = next(k for k in (f"{{job-{i}}}:a" for i in range(2, 100))
                     if rc.get_node_from_key(k).port != rc.get_node_from_key(declared).port)
    script = rc.register_script("redis.call('SET', KEYS[1], 'v'); return redis.call('GET', ARGV[1])")
    with pytest.raises(ResponseError, match="Script attempted to access a non local key in a cluster node"):
        script(keys=[declared], args=[elsewhere])


def test_a_key_written_to_a_replica_survives_its_master_being_killed(fresh_redis_cluster: ClusterServers) -> None:
    cluster = fresh_redis_cluster
    rc = cluster_client(cluster)
    try:
        key = "{job-1}:record"
        owner = rc.get_node_from_key(key)
        replica = cluster.replica_of(owner.port)
        # WAIT counts the replicas that acknowledged this connection's writes, so SET and WAIT share one
        # connection: a pipeline on the owning node's client. (rc.wait() would go to an arbitrary node.)
        assert owner.redis_connection is not None
        acked = owner.redis_connection.pipeline(transaction=False).set(key, "before").wait(1, 1000).execute()
        assert acked == [True, 1]

        cluster.stop(owner.port)
        assert cluster.wait_failover(owner.port) == replica

        assert rc.get(key) == "before"  # the dead node refuses; the client reloads the slot map and retries
        assert rc.get_node_from_key(key).port == replica
        assert rc.set(key, "after") and rc.get(key) == "after"  # the promoted replica takes writes
        assert len(cluster.masters()) == 3
    finally:
        rc.close()


def test_a_server_given_a_port_another_server_holds_moves_to_a_free_one() -> None:
    # Two nodes of one test cluster once drew the same free port: the second's PING was answered by the
    # first while its own redis-server failed to bind, and the cluster was created with five nodes of six.
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    first = RedisServer(binary)
    first.start()
    second = RedisServer(binary, port=first.port)
    try:
        second.start()
        assert second.port != first.port
        assert second.proc is not None and second._answering_pid() == second.proc.pid
        assert first.proc is not None and first._answering_pid() == first.proc.pid
    finally:
        second.cleanup()
        first.cleanup()
