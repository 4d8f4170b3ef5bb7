"""``HOST:PORT`` as every component's flags spell it (Kafka's listener syntax)."""

from __future__ import annotations


def split_host_port(value: str, default_port: int = 9092) -> tuple[str, int]:
    """``":9092"`` means every interface, as in Kafka; a bare host takes ``default_port``."""
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, default_port
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - every interface, as asked
