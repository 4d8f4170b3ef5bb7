"""An in-memory stand-in for the gateway's ACL store (etcd in production)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shoal.tenancy.model import AclBinding
from shoal.tenancy.store import TenancyStoreError


@dataclass
class StubAclStore:
    held: list[AclBinding] = field(default_factory=list)
    unreachable: bool = False

    def _check(self) -> None:
        if self.unreachable:
            raise TenancyStoreError("etcd at stub:2379 is unreachable")

    async def bindings(self, tenant: str) -> Sequence[AclBinding]:
        self._check()
        return [b for b in self.held if b.tenant == tenant]

    async def add(self, tenant: str, bindings: Sequence[AclBinding]) -> None:
        self._check()
        self.held.extend(b for b in bindings if b.tenant == tenant and b not in self.held)

    async def remove(self, tenant: str, bindings: Sequence[AclBinding]) -> None:
        self._check()
        self.held = [b for b in self.held if b.tenant != tenant or b not in bindings]
