"""The words every layer shares, defined once: chat modes, run orders, blind reveals, how many
columns a round has, and which hosts are this machine.

The settings panel offers them, `.env` is checked against them (config.py), rounds run by
them (core/rounds.py), the store keeps them (store/records.py) and the ratings count them
(core/ratings). Adding a reveal or a mode starts here.
"""

from __future__ import annotations

# Chat with one backend, compare 2-4 side by side, or judge them blind (names hidden until the vote).
MODES = ("chat", "compare", "blind")
ROUND_MODES = ("compare", "blind")
# Modes a stored reply may have: a round's two, a single chat, or a replay of a chat on every backend.
REPLY_MODES = ("chat", "compare", "blind", "replay")

# How a round's columns run: "auto" is sequential when two chosen backends share this machine.
RUN_ORDERS = ("auto", "sequential", "concurrent")
RUN_ORDERS_TAKEN = ("sequential", "concurrent")  # what "auto" becomes: the order a round really ran in

# Blind text: when every column has finished; at one common pace (core.rounds.RevealPace); or live,
# each column as its engine sends it (speed in plain view: what the speed-controlled ratings measure).
REVEALS = ("finished", "pace", "live")

MIN_COLUMNS, MAX_COLUMNS = 2, 4
COLUMN_LABELS = ("A", "B", "C", "D")

# This machine, as a URL or a client address may name it.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

# A vote on a round: one column wins, a tie, or every column is bad; each column may be judged.
VOTE_OUTCOMES = ("win", "tie", "both_bad")
JUDGEMENTS = ("good", "bad")

# How a measured reply ended (core.timing's final states; what the store keeps).
REPLY_STATUSES = ("completed", "stopped", "error")
