"""The ``shoal`` command (:mod:`shoal.cli.app`) and what only its commands use.

This package's own import is empty on purpose: the benchmarks' client
processes import :mod:`shoal.cli.loadgen` alone, without the servers that the
command's subcommands bring in.
"""
