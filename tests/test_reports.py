"""The reports' pure parts (stats table, CSV, chart, replay table) and password hashing."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

import pytest

from backends.errors import ConfigurationError
from core.auth import AuthConfig, auth_from_env, hash_password, verify_password
from core.reports import replay_markdown, stats_csv, stats_figure, stats_markdown, stats_rows
from store import StoredReply
from core.timing import RequestRecord


def reply(backend: str, ttft: float | None, rate: float | None, tokens: int, prompt: str = "hi") -> StoredReply:
    return StoredReply(
        id=f"{backend}-{tokens}", thread_id="t", user_identifier=None,
        created_at=datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc), backend=backend, backend_label=backend.upper(),
        model="m", mode="chat", round_id=None, column_label=None, prompt=prompt, reply_text="x", status="completed",
        first_token_s=ttft, decode_tokens_per_s=rate, output_tokens=tokens, total_s=1.5, ms_per_output_token=12.345,
        settings_sent={}, record={},
    )


def test_stats_rows_csv_and_table_carry_every_reply_in_readable_units():
    replies = [reply("vllm", 0.0912, 30.04, 64, prompt='say "a|b", please'), reply("tgi", None, None, 0)]
    rows = stats_rows(replies)
    assert rows[0]["first_token_ms"] == 91.2 and rows[0]["decode_tokens_per_s"] == 30.04
    assert rows[1]["first_token_ms"] is None
    parsed = list(csv.DictReader(io.StringIO(stats_csv(rows).decode("utf-8"))))
    assert [row["backend"] for row in parsed] == ["vllm", "tgi"]
    assert parsed[0]["prompt"] == 'say "a|b", please' and parsed[0]["first_token_ms"] == "91.2"
    table = stats_markdown(rows)
    assert table.count("\n") == 3 and "| 1 | vllm | chat | completed | 91.2 | 30.04 | 64 |" in table
    assert "| 2 | tgi | chat | completed | – | – | 0 |" in table
    figure = stats_figure(rows)
    assert {trace.name for trace in figure.data} == {"vllm TTFT (ms)", "vllm tokens/s", "tgi TTFT (ms)", "tgi tokens/s"}


def test_replay_table_has_medians_failures_and_totals():
    def record(ttft: float, rate: float, tokens: int) -> RequestRecord:
        return RequestRecord(backend="b", model="m", status="completed", started_at_unix_s=0.0, total_s=2.0,
                             first_byte_s=ttft, first_token_s=ttft, last_chunk_s=1.9, output_tokens=tokens,
                             decode_tokens_per_s=rate, ms_per_output_token=None, itl=None, finish_reason="stop",
                             tokens_exact=True, token_source="", server=None, count_disagreement=None,
                             chunk_times_s=(), chunk_tokens=())

    table = replay_markdown({"vLLM": [record(0.1, 30, 10), record(0.3, 40, 20), record(0.2, 50, 5)]},
                            {"vLLM": ["down once"]})
    assert "| vLLM | 3 | 1 | 200.0 | 40.0 | 35 | 6.0 |" in table


def test_passwords_are_hashed_salted_and_checked_in_constant_time(monkeypatch):
    """Constant time: every check of a well-formed hash, right or wrong, compares the whole digest
    with hmac.compare_digest (seen here through a spy), never with ==, which stops at the first
    differing byte."""
    import hmac

    compared: list[tuple[bytes, bytes]] = []
    real_compare = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    hashed = hash_password("correct horse", iterations=1000)
    assert hashed.startswith("pbkdf2_sha256$1000$") and "correct" not in hashed
    assert verify_password("correct horse", hashed) and not verify_password("wrong", hashed)
    assert len(compared) == 2 and all(len(a) == len(b) == 32 for a, b in compared), compared
    assert hash_password("same", iterations=1000) != hash_password("same", iterations=1000)  # salted
    assert not verify_password("x", "md5$nonsense") and not verify_password("x", "garbage")
    with pytest.raises(ValueError):
        hash_password("")


def test_login_configuration_from_env():
    alice, bob = hash_password("a-pass", iterations=1000), hash_password("b-pass", iterations=1000)
    config = auth_from_env({"AUTH_USERS": f"alice:{alice}, bob:{bob}", "TEACHERS": "alice",
                            "CHAINLIT_AUTH_SECRET": "s"})
    assert config.enabled and config.check("alice", "a-pass") and not config.check("alice", "b-pass")
    assert not config.check("mallory", "a-pass")
    assert config.is_teacher("alice") and not config.is_teacher("bob")
    assert not AuthConfig().enabled and AuthConfig().is_teacher(None)  # no login: the local user teaches
    for env, words in [({"AUTH_USERS": "alice"}, "not name:hash"),
                       ({"AUTH_USERS": f"alice:{alice},alice:{bob}", "CHAINLIT_AUTH_SECRET": "s"}, "twice"),
                       ({"AUTH_USERS": f"alice:{alice}", "TEACHERS": "carol", "CHAINLIT_AUTH_SECRET": "s"}, "carol"),
                       ({"AUTH_USERS": f"alice:{alice}"}, "CHAINLIT_AUTH_SECRET")]:
        with pytest.raises(ConfigurationError, match=words):
            auth_from_env(env)


def test_a_daily_vote_cap_is_read_from_env_and_applies_only_with_login():
    alice = hash_password("a-pass", iterations=1000)
    login = {"AUTH_USERS": f"alice:{alice}", "CHAINLIT_AUTH_SECRET": "s"}
    assert auth_from_env({**login, "VOTES_PER_DAY": "30"}).vote_cap == 30
    assert auth_from_env({**login, "VOTES_PER_DAY": " "}).vote_cap is None
    assert auth_from_env({"VOTES_PER_DAY": "30"}).vote_cap is None  # login off: one local user, no cap
    for raw in ("0", "-3", "ten", "2.5"):
        with pytest.raises(ConfigurationError, match=f"VOTES_PER_DAY='{raw}': give a whole number"):
            auth_from_env({**login, "VOTES_PER_DAY": raw})


@pytest.mark.parametrize("typed, expected", [
    ("/leaderboard", ("leaderboard", "")),
    ("  /leaderboard category=code lang=zh ", ("leaderboard", "category=code lang=zh")),
    ("/stats", ("stats", "")),
    ("/prompt", ("prompt", "")),
    ("/stats please", None),  # only the leaderboard takes words after it
    ("/nothing", None),
    ("leaderboard", None),
])
def test_commands_typed_as_text(typed, expected):
    from ui.commands import typed_command

    assert typed_command(typed) == expected


def test_a_view_buttons_payload_is_only_ever_text():
    from ui.commands import view_arguments

    assert view_arguments({"arguments": "lang=zh"}) == "lang=zh"
    assert view_arguments({"arguments": ["lang=zh"]}) == view_arguments(None) == view_arguments({}) == ""
