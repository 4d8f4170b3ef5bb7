from shoal.gateway.usage import TenantUsage, UsageLedger


def test_counts_add_up_per_tenant_and_copies_do_not_alias() -> None:
    ledger = UsageLedger()
    ledger.produced("acme", 1000, 0)
    ledger.produced("acme", 500, 20)
    ledger.fetched("acme", 4000, 5)
    ledger.fetched("globex", 10, 0)
    acme = ledger.of("acme")
    assert acme == TenantUsage(
        bytes_in=1500, bytes_out=4000, produce_requests=2, fetch_requests=1, throttle_ms=25
    )
    acme.bytes_in = 0
    assert ledger.of("acme").bytes_in == 1500
    assert ledger.of("nobody") == TenantUsage()
    assert set(ledger.all()) == {"acme", "globex"}
