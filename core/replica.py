"""Which app process (replica) this is, when several serve one class behind a proxy.

`LAB_REPLICA_ID` names it (the lecture-hall script sets app-1, app-2, ...); without it a random
name made once per process does (`replica-` and 8 hex digits). Every answer carries it
(`X-Lab-Replica`), `/lab/state` shows it, and a load run started here is shown to the other
replicas under it. Never the host name or the process id: the header goes to everyone who
loads a page, and those would tell a stranger about the machine behind the proxy.
"""

from __future__ import annotations

import os
import secrets
from typing import Mapping

REPLICA_HEADER = "X-Lab-Replica"
# This process's own key among the running app processes (the item of its "alive" lock, see
# store.locks): a reply marked with it was being answered here.
_PROCESS_KEY = secrets.randbelow(2**31)
# This process's name when LAB_REPLICA_ID is unset: random, drawn once, derived from nothing.
_RANDOM_REPLICA_ID = f"replica-{secrets.token_hex(4)}"


def replica_id(env: Mapping[str, str] | None = None) -> str:
    """LAB_REPLICA_ID, else this process's random name (the same for every call in the process)."""
    env = os.environ if env is None else env
    return env.get("LAB_REPLICA_ID", "").strip() or _RANDOM_REPLICA_ID


def process_key() -> int:
    """This app process's key: random per start, so a restarted replica is a new process."""
    return _PROCESS_KEY
