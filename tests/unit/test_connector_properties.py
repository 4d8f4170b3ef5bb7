"""client.properties files as the connector's kafka.* options."""

from __future__ import annotations

from pathlib import Path

import pytest
from shoal.connector import client_options
from shoal.connector.options import Mode, parse_read_options


def properties(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def test_every_setting_becomes_a_kafka_option(tmp_path: Path) -> None:
    path = properties(
        tmp_path,
        "# written by shoal dev\n"
        "bootstrap.servers=localhost:9092\n"
        "\n"
        "   \n"
        "! another comment style\n"
        "  security.protocol = SASL_PLAINTEXT  \n"
        "sasl.mechanism=PLAIN\n"
        "sasl.username=tenant-key\n"
        "sasl.password=c2VjcmV0==\n"
        "empty.setting=\n",
    )
    assert client_options(path) == {
        "kafka.bootstrap.servers": "localhost:9092",
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.username": "tenant-key",
        "kafka.sasl.password": "c2VjcmV0==",  # only the first = separates
        "kafka.empty.setting": "",
    }


def test_options_from_a_file_are_a_valid_read(tmp_path: Path) -> None:
    path = properties(tmp_path, "bootstrap.servers=gw:9092\nsasl.username=k\n")
    options = parse_read_options({**client_options(str(path)), "subscribe": "t"}, Mode.BATCH)
    assert options.client == {"bootstrap.servers": "gw:9092", "sasl.username": "k"}


def test_a_line_without_equals_fails_naming_file_and_line(tmp_path: Path) -> None:
    path = properties(tmp_path, "# header\nbootstrap.servers=gw:9092\n\nsasl.username tenant\n")
    with pytest.raises(ValueError, match="expected setting=value") as caught:
        client_options(path)
    assert str(caught.value).startswith(f"{path}:4: ")
    assert "'sasl.username tenant'" in str(caught.value)


def test_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        client_options(tmp_path / "nope.properties")
