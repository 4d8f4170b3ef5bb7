"""ElectLeaders (43): the platform admin's alone.

Leadership is shared by every tenant's partitions on a broker, so moving it
is the platform's decision, whatever ACLs a tenant gave itself. Any other
key is answered as Kafka answers a principal without ALTER on the cluster:
CLUSTER_AUTHORIZATION_FAILED, at the top and for every partition it named.
The platform admin's request reaches the controller unchanged, in the
brokers' names, since an election is a cluster operation and may span
tenants (``kafka-leader-election.sh --all-topic-partitions``).
"""

from __future__ import annotations

from typing import Any

from shoal.gateway.apis.base import NO_THROTTLE, Answer, E, Forward, RequestContext, Step

_REFUSAL = "leader elections are the platform's; tenants may not ask for them"


async def elect_leaders(ctx: RequestContext, request: Any) -> Step:
    if ctx.access.platform_admin:
        return Forward(request)
    api = ctx.api
    results = tuple(
        api.make(
            "ReplicaElectionResult",
            topic=topic.topic,
            partition_result=tuple(
                api.make(
                    "PartitionResult",
                    partition_id=index,
                    error_code=E.cluster_authorization_failed,
                    error_message=_REFUSAL,
                )
                for index in topic.partitions
            ),
        )
        for topic in request.topic_partitions or ()
    )
    return Answer(
        api.response(
            throttle_time=NO_THROTTLE,
            error_code=E.cluster_authorization_failed,
            replica_election_results=results,
        )
    )
