"""Structured logs for every component: one event per line.

Code logs ``"event=name key=value ..."`` messages through the standard
``logging`` module. The text format prefixes time, level and logger; the
JSON format turns the same key=value pairs into fields, for log shippers.
Secrets never go into a message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

_TEXT_FORMAT: Final = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        fields: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        rest = []
        for token in message.split(" "):
            key, sep, value = token.partition("=")
            if sep and key.isidentifier():
                fields[key] = value
            else:
                rest.append(token)
        if rest:
            fields["message"] = " ".join(rest)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC (etcd) and asyncio chatter is not ours to report at INFO.
    logging.getLogger("asyncio").setLevel(logging.WARNING)
