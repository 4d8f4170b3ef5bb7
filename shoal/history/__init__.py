"""Histories of what Kafka clients saw, and a checker that finds what went wrong.

``shoal history run`` records one against any Kafka-compatible cluster (the
fault tests and the soak use it the same way); ``shoal history check`` reads
it back and reports lost, duplicated and reordered writes, phantom reads,
split brains and committed offsets that went backwards.
"""
