"""The gateway: the tenants' only door to the cluster.

A Kafka-protocol proxy (:mod:`shoal.gateway.server`) that authenticates each
connection with SASL/PLAIN against the tenancy records, maps every name a
request carries into the tenant's namespace and back, checks each resource
against the tenant's ACLs, throttles tenants over their byte-rate quotas, and
forwards what remains to the broker that leads it. Brokers never learn of
tenants.

Module map:

* :mod:`~shoal.gateway.config` - settings (flags and ``SHOAL_*`` variables).
* :mod:`~shoal.gateway.namespace` - ``orders`` <-> ``acme.orders``.
* :mod:`~shoal.gateway.access` - one principal's view: ACL checks, namespace.
* :mod:`~shoal.gateway.apis` - per-API rewriting (pure but for lookups).
* :mod:`~shoal.gateway.acl_grants` - what a key may grant through CreateAcls.
* :mod:`~shoal.gateway.quotas` - each tenant's byte budgets: waits and throttles (pure).
* :mod:`~shoal.gateway.admission` - holds requests until their tenant's budget lets them go.
* :mod:`~shoal.gateway.quota_shares` - each replica's part of a tenant's quota (pure).
* :mod:`~shoal.gateway.membership` - the replicas, and the traffic reports they exchange.
* :mod:`~shoal.gateway.sasl` - the SASL/PLAIN exchange.
* :mod:`~shoal.gateway.tenancy_view` - the tenancy records, polled from etcd.
* :mod:`~shoal.gateway.cluster_view` - brokers and topic ids, learned from the brokers.
* :mod:`~shoal.gateway.upstream` - a Kafka connection to one broker.
* :mod:`~shoal.gateway.session` - one client connection, request by request.
* :mod:`~shoal.gateway.server` - listeners, membership, lifecycle.
"""
