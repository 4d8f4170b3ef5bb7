"""A tenant's namespace: its names as it sees them and as the brokers store them.

A tenant's topic ``orders`` is ``acme.orders`` on the brokers, and its group
``billing`` is ``acme.billing``; transactional ids are mapped the same way.
Tenant names never contain a dot, so the first dot of a broker-side name
always ends the tenant part, and a tenant's own names may contain dots freely
(``acme.a.b`` is tenant ``acme``'s ``a.b``). Mapping is total in the
tenant-to-broker direction: whatever a tenant names lands inside its own
prefix, so no spelling reaches another tenant. The other direction answers
None for names outside the prefix, which callers drop from listings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Namespace:
    tenant: str

    @property
    def prefix(self) -> str:
        return self.tenant + "."

    def inward(self, name: str) -> str:
        """The brokers' name for one of the tenant's names."""
        return self.prefix + name

    def outward(self, name: str | None) -> str | None:
        """The tenant's name for a broker-side name, or None if it is not the tenant's."""
        if not self.owns(name):
            return None
        assert name is not None
        return name[len(self.prefix) :]

    def outward_id(self, name: str | None) -> str | None:
        """:meth:`outward` for a group id or coordinator key, which may be empty.

        Kafka serves the empty group id (offsets of the old consumers that had
        none) and finds a coordinator for an empty key like any other, so a
        tenant's ``""`` is ``acme.`` on the brokers and comes back as ``""``.
        Topic names and transactional ids are never empty (InitProducerId
        refuses ``""``), so :meth:`outward` does not map the bare prefix.
        """
        if name == self.prefix:
            return ""
        return self.outward(name)

    def owns(self, name: str | None) -> bool:
        return name is not None and name.startswith(self.prefix) and len(name) > len(self.prefix)
