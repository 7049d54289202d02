"""The runner's integration tests use the session's Ray cluster, ``ray_two_hosts``
(tests/integration/_ray_cluster.py, shared with the sandbox fleet's tests)."""
