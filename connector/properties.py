"""A client.properties file as data source options.

Shoal hands every API key out as a librdkafka ``client.properties`` (``shoal
dev`` writes one; the operator puts one in each key's Secret). Its settings
are the connector's ``kafka.*`` options one to one, so a job can say
``.options(**client_options(path))``.
"""

from __future__ import annotations

from pathlib import Path

from shoal.connector.options import KAFKA_PREFIX


def client_options(path: str | Path) -> dict[str, str]:
    """``kafka.<setting>`` options for every ``setting=value`` line of the file."""
    options: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{number}: expected setting=value, got {line!r}")
        options[KAFKA_PREFIX + name.strip()] = value.strip()
    return options
