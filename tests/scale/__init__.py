"""Deployment at scale, against real servers the tests start (marker ``scale``).

Skewed and jumping consumer clocks, Redis Sentinel failover, Redis Cluster, PgBouncer in
transaction mode, network partitions. Run by ``.ci/scale`` (``pytest -m scale
tests/scale``), apart from ``tests/run.sh``: these start many servers and take minutes.
"""
