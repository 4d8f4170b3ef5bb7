"""Topic regular expressions as Kafka matches them: RE2 syntax, whole names, linear time.

Kafka's group coordinator resolves KIP-848 regex subscriptions
(``subscribed_topic_regex``) with RE2/J, whose matching time is linear in
the name: no pattern can make it backtrack for ever. A tenant's pattern runs
on a broker's event loop, shared by every tenant, so Shoal matches with RE2
too (google-re2), never with Python's backtracking ``re``; the syntax is
then Kafka's as well.
"""

from __future__ import annotations

from typing import Any

import re2  # type: ignore[import-untyped]


class TopicRegexError(ValueError):
    """A pattern RE2 does not accept (Kafka answers INVALID_REGULAR_EXPRESSION)."""


class TopicRegex:
    """A compiled pattern, matched against whole topic names."""

    def __init__(self, pattern: str) -> None:
        options = re2.Options()
        options.log_errors = False  # refusals are answered, not logged by RE2 itself
        try:
            self._compiled: Any = re2.compile(pattern, options)
        except re2.error as exc:
            raise TopicRegexError(str(exc)) from exc
        self.pattern = pattern

    def fullmatch(self, name: str) -> bool:
        return self._compiled.fullmatch(name) is not None
