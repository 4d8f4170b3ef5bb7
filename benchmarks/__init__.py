"""Shoal's benchmarks, installed as ``shoal.benchmarks`` (the ``bench`` extra).

Each script runs as ``python -m shoal.benchmarks.<name>`` (or by its path) from
any working directory; README.md beside them holds the figures they write.
"""
