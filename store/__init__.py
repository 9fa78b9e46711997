"""Storage: replies with their figures, compare rounds and votes, plus Chainlit's history tables.

One database for both, chosen by `DATABASE_URL` (default: the SQLite file
`.data/serving_lab.db`). `Store` is the app's API; Chainlit's data layer on
the same database comes from `ui.chat_history.chainlit_data_layer()`
(kept out of this import so the store works without Chainlit).
`python -m store init` creates or migrates the tables; `python -m store info` shows them.
"""

from store.db import Store
from store.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    NotSaved,
    RoundNotFound,
    RowRefused,
    SavedLater,
    SchemaTooNew,
    StoreError,
    VoteLimitReached,
    VoteRejected,
)
from store.records import (ColumnReply, CompareRound, ReplySpeed, RoundColumn, StoredReply, StoredSweep, Vote,
                           VoteRecord, check_vote, names_in_comment)
from store.schema import SCHEMA_VERSION
from store.urls import database_url, mask_password, normalise_url

__all__ = [
    "SCHEMA_VERSION", "ColumnReply", "CompareRound", "ConfigurationError", "DatabaseUnavailable", "NotSaved",
    "ReplySpeed", "RoundColumn", "RoundNotFound", "RowRefused", "SavedLater", "SchemaTooNew", "Store", "StoreError", "StoredReply", "StoredSweep",
    "Vote", "VoteLimitReached", "VoteRecord", "VoteRejected", "check_vote", "database_url", "mask_password",
    "names_in_comment", "normalise_url",
]
