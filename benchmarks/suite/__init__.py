"""The side-by-side suite behind ``make bench``: Shoal, NATS JetStream and Redis Streams.

``benchmarks/compare.py`` is the entry point. The pieces:

* :mod:`suite.systems` installs (Debian packages), starts and stops every
  system on loopback and says how its clients connect;
* :mod:`suite.nats_client` and :mod:`suite.redis_client` are the peers'
  load generators, built on :mod:`shoal.loadgen`'s pacing, payloads, stamps
  and result types so that every system is measured the same way (Kafka
  clients use :mod:`shoal.loadgen` itself);
* :mod:`suite.worker` runs one client role in its own process, so clients
  do not share one interpreter's lock with each other or with the suite;
* :mod:`suite.workloads` are the five workloads, :mod:`suite.report` the
  JSON, the Markdown table and the charts.
"""
