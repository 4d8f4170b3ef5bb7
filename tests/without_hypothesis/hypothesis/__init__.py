"""Stands in for Hypothesis in the processes the tests start, where it is not installed.

``tests/conftest.py`` puts the folder above this one first on ``PYTHONPATH``
for the tests' child processes (brokers, gateways, the ``shoal`` command).
kio imports ``hypothesis.strategies`` whenever it can and then registers
strategies for its types: a quarter of a second of CPU in every child, for
nothing, since only the property tests in the pytest process itself use them.
Production installs have no Hypothesis, so a child that finds this instead
behaves as it would there.
"""

raise ModuleNotFoundError(
    "No module named 'hypothesis' (kept out of the tests' child processes)", name="hypothesis"
)
