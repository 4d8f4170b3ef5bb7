"""The Shoal operator: Cluster, Topic and Tenant resources made real.

kopf runs the handlers (:mod:`shoal.operator.handlers`); they stay thin and
call three kinds of module, kept apart so each is tested on its own:

* pure builders, spec in and manifests out (:mod:`shoal.operator.builders`,
  :mod:`shoal.operator.cluster_spec`), unit-tested without a cluster;
* cluster actions over the Kafka admin protocol and etcd
  (:mod:`shoal.operator.kafka_admin`, :mod:`shoal.operator.topics`,
  :mod:`shoal.operator.tenants`, :mod:`shoal.operator.roller`,
  :mod:`shoal.operator.rebalance`), tested against a real local Shoal cluster;
* the Kubernetes I/O (:mod:`shoal.operator.kube`), tested against a fake API
  server (kmock).

:mod:`shoal.operator.endpoints` names every child object and address, so the
builders and the cluster actions agree on them.
"""
