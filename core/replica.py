"""Which app process (replica) this is, when several serve one class behind a proxy.

`LAB_REPLICA_ID` names it (the lecture-hall script sets app-1, app-2, ...); without it the
host name and process id do. Every answer carries it (`X-Lab-Replica`), `/lab/state` shows it,
and a load run started here is shown to the other replicas under it.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Mapping

REPLICA_HEADER = "X-Lab-Replica"
# This process's own key among the running app processes (the item of its "alive" lock, see
# store.locks): a reply marked with it was being answered here.
_PROCESS_KEY = secrets.randbelow(2**31)


def replica_id(env: Mapping[str, str] | None = None) -> str:
    """LAB_REPLICA_ID, else host:pid."""
    env = os.environ if env is None else env
    return env.get("LAB_REPLICA_ID", "").strip() or f"{socket.gethostname()}:{os.getpid()}"


def process_key() -> int:
    """This app process's key: random per start, so a restarted replica is a new process."""
    return _PROCESS_KEY
