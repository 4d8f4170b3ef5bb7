"""The side-by-side suite behind ``make bench``: Shoal, NATS JetStream and Redis Streams.

``python -m shoal.benchmarks.compare`` is the entry point. The pieces:

* :mod:`.systems` installs (Debian packages), starts and stops every
  system on loopback and says how its clients connect;
* :mod:`.nats_client` and :mod:`.redis_client` are the peers'
  load generators, built on :mod:`shoal.cli.loadgen`'s pacing, payloads, stamps
  and result types so that every system is measured the same way (Kafka
  clients use :mod:`shoal.cli.loadgen` itself);
* :mod:`.worker` runs one client role in its own process, so clients
  do not share one interpreter's lock with each other or with the suite;
* :mod:`.workloads` are the five workloads, :mod:`.report` the
  JSON, the Markdown table and the charts.
"""
