"""Shoal: a multi-tenant, Kafka-compatible event streaming service.

The component folders of the checkout (``broker/``, ``gateway/``, ...) are
mapped into this package by ``pyproject.toml``, so ``shoal.broker`` exists
only where Shoal is installed (the editable install's link tree included).
A Python started in the checkout root (a REPL, ``python -c``, PySpark's
workers) finds this folder first, through the working directory at the
head of ``sys.path``, and would then miss every component. Extending the
package's path over every ``shoal`` folder on ``sys.path``, the installed
one included, lets such a process import all of ``shoal.*``.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
