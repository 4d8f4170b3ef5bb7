"""What a tenant's Kafka client needs to connect with one API key, as files.

``client.properties`` works for librdkafka (``kcat -F``, confluent-kafka's
config readers) and for the Java client; the Java client also needs the
``sasl.jaas.config`` line, which librdkafka refuses as an unknown property,
so it travels apart (:func:`jaas_config`) for Java clients to add.

Values are written in the Java ``.properties`` syntax
(``java.util.Properties.load``): backslash escapes for ``\\``, line breaks,
tabs and form feeds, a leading space, and ``=``, ``:``, ``#``, ``!`` and spaces
in keys; anything outside printable ASCII as ``\\uXXXX``. Key ids, secrets and
host names never need them, so librdkafka's plain reader sees the same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_ESCAPES: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}
_KEY_SPECIALS: Final = frozenset("=: #!")


def escape_property(text: str, key: bool = False) -> str:
    """``text`` as a .properties key (``key=True``) or value."""
    out = []
    for i, char in enumerate(text):
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif (key and char in _KEY_SPECIALS) or (i == 0 and char in " #!"):
            out.append("\\" + char)
        elif not " " <= char <= "~":
            out.extend(f"\\u{unit:04x}" for unit in _utf16_units(char))
        else:
            out.append(char)
    return "".join(out)


def _utf16_units(char: str) -> list[int]:
    encoded = char.encode("utf-16-be")
    return [int.from_bytes(encoded[i : i + 2], "big") for i in range(0, len(encoded), 2)]


def properties_text(properties: Mapping[str, str]) -> str:
    return "".join(
        f"{escape_property(k, key=True)}={escape_property(v)}\n" for k, v in properties.items()
    )


def client_properties(bootstrap: str, username: str, password: str, tls: bool) -> dict[str, str]:
    """The client settings of one key, in the names librdkafka and Java share."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": password,
    }


def jaas_config(username: str, password: str) -> str:
    """The Java client's ``sasl.jaas.config`` value for SASL/PLAIN."""
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
        f' username="{_jaas_quote(username)}" password="{_jaas_quote(password)}";'
    )


def _jaas_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
