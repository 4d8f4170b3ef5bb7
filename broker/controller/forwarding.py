"""Admin requests that place replicas go to the controller, as KRaft forwards them.

CreateTopics and CreatePartitions decide where replicas go; the controller
makes that decision for the whole cluster. Clients normally send them to the
controller (Metadata names it), but a client may ask any broker: that broker
forwards the request as it is and returns the controller's answer, after its
own image shows the result, so the client's next Metadata there sees it.

If no controller is reachable (an election under way), the broker decides
itself with the same placement rules: topic creation is a compare-and-swap
in etcd either way, so two deciders cannot both create one topic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from shoal.broker.cluster.model import ClusterImage, NodeId
from shoal.broker.replication.channel import ChannelError, PeerLink

from shoal.wire import ApiSchema

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S: Final = 5.0
_REQUEST_TIMEOUT_S: Final = 60.0


class ForwardingError(Exception):
    pass


class ControllerForwarder:
    def __init__(self, node_id: NodeId, image: Callable[[], ClusterImage]) -> None:
        self.node_id = node_id
        self.image = image
        self._link = PeerLink(f"shoal-forwarder-{node_id}")

    def is_controller(self) -> bool:
        controller = self.image().controller
        return controller is not None and controller.node_id == self.node_id

    async def forward(self, api: ApiSchema, request: Any) -> Any:
        """The controller's answer to ``request``; ForwardingError if it cannot be had."""
        image = self.image()
        controller = image.controller
        broker = image.brokers.get(controller.node_id) if controller is not None else None
        if controller is None or broker is None:
            raise ForwardingError("no controller is registered")
        try:
            channel = await self._link.to(broker.host, broker.port, _CONNECT_TIMEOUT_S)
            return await channel.call(api, request, _REQUEST_TIMEOUT_S)
        except ChannelError as exc:
            raise ForwardingError(f"controller {controller.node_id}: {exc}") from exc

    async def close(self) -> None:
        await self._link.close()
