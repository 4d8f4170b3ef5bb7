"""The reserved values of Fetch's session fields (KIP-227), for brokers and gateway alike.

A request's ``session_epoch`` of 0 asks for a new session, -1 fetches without
one; a ``session_id`` of 0 names no session, in requests and answers.
"""

from typing import Final

NO_SESSION: Final = 0
INITIAL_EPOCH: Final = 0
FINAL_EPOCH: Final = -1
