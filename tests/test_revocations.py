"""The rule of revoked login tokens (core/revocations.py) on a real SQLite table (store/revocations.py),
with tokens signed as Chainlit signs them, and the pure parts of the middleware around it. The app
itself, attacked from outside: tests/test_sign_out_app.py and tests/test_sign_out_replicas.py.
"""

from __future__ import annotations

import secrets
import time

import jwt
import pytest

from config import ConfigurationError
from core.revocations import Revocations, read_claims, token_digest
from store import Store
from store.db import create_engine
from store.revocations import RevocationTable
from ui.body_limit import MIB, MIN_MAX_BODY_MB, max_body_bytes
from ui.page_headers import secure_cookie
from ui.sign_out import one_cookie_header, token_of, without_token

SECRET = secrets.token_urlsafe(32)


def token(identifier: str, issued_at_s: float, lifetime_s: float = 3600) -> str:
    return jwt.encode({"identifier": identifier, "metadata": {}, "iat": int(issued_at_s),
                       "exp": int(issued_at_s + lifetime_s)}, SECRET, algorithm="HS256")


async def migrated_table(path) -> RevocationTable:
    url = f"sqlite:///{path}"
    store = await Store.open(url)
    await store.migrate()
    await store.aclose()
    return RevocationTable(create_engine(url))


def test_a_token_is_known_by_what_verifies_not_by_how_it_is_spelt():
    good = token("student07", time.time())
    padded = good + "="  # PyJWT (so Chainlit) accepts it: the same token
    assert read_claims(padded, SECRET) is not None
    assert token_digest(padded) == token_digest(good)
    assert token_digest(token("student07", time.time() - 5)) != token_digest(good)
    assert read_claims(good, "another-secret-" + secrets.token_hex(16)) is None and read_claims("garbage", SECRET) is None


async def test_a_logged_out_token_is_refused_and_another_of_the_same_person_is_not(tmp_path):
    revocations = Revocations(SECRET, await migrated_table(tmp_path / "lab.db"))
    await revocations.ready()
    now = time.time()
    first, second = token("student07", now - 10), token("student07", now - 5)
    assert await revocations.log_out(first) is not None
    assert revocations.revoked(first) and revocations.revoked(first + "=")
    assert not revocations.revoked(second)
    assert await revocations.log_out("not-a-token") is None  # nothing to revoke, nothing kept
    await revocations.aclose()


async def test_a_sign_out_refuses_the_persons_tokens_issued_before_it_only(tmp_path):
    clock = [int(time.time()) - 30.5]  # in the past: PyJWT refuses a token issued in the future
    revocations = Revocations(SECRET, await migrated_table(tmp_path / "lab.db"), clock=lambda: clock[0])
    await revocations.ready()
    before, same_second = token("student07", clock[0] - 60), token("student07", clock[0])
    classmate = token("student08", clock[0] - 60)
    assert await revocations.sign_out(["student07"]) is True
    assert revocations.revoked(before) and revocations.revoked(same_second)  # whole seconds: counted as before
    assert not revocations.revoked(classmate)
    assert not revocations.revoked(token("student07", clock[0] + 1))  # a login after it works
    await revocations.aclose()


async def test_they_outlive_the_process_in_the_table(tmp_path):
    table = await migrated_table(tmp_path / "lab.db")
    logged_out, signed_out, kept = token("a", time.time() - 9), token("b", time.time() - 9), token("c", time.time() - 9)
    first = Revocations(SECRET, table)
    await first.ready()
    await first.log_out(logged_out)
    await first.sign_out(["b"])
    await first.aclose()
    restarted = Revocations(SECRET, RevocationTable(create_engine(f"sqlite:///{tmp_path / 'lab.db'}")))
    assert not restarted.revoked(logged_out)  # control: nothing is known before the table is read
    await restarted.ready()
    assert restarted.revoked(logged_out) and restarted.revoked(signed_out) and not restarted.revoked(kept)
    await restarted.aclose()


async def test_a_database_that_is_not_there_keeps_them_here_and_they_are_written_once_it_is(tmp_path):
    path = tmp_path / "later.db"
    revocations = Revocations(SECRET, RevocationTable(create_engine(f"sqlite:///{path}")))
    await revocations.ready()  # the file does not exist: the first reading fails, and nobody waits for it
    signed_out = token("student07", time.time() - 9)
    assert await revocations.sign_out(["student07"]) is False
    assert revocations.problem and revocations.revoked(signed_out)
    await migrated_table(path)
    await revocations._retry_unsaved()
    assert revocations.problem is None
    reread = Revocations(SECRET, RevocationTable(create_engine(f"sqlite:///{path}")))
    await reread.ready()
    assert reread.revoked(signed_out)
    for each in (revocations, reread):
        await each.aclose()


def test_the_token_is_read_where_chainlit_reads_it_and_taken_out_of_every_place():
    headers = [(b"cookie", b"lab_browser=b1"), (b"cookie", b"access_token=from-cookie; other=1"),
               (b"authorization", b"Bearer from-header")]
    joined = one_cookie_header(headers)
    assert [key for key, _ in joined].count(b"cookie") == 1
    assert token_of(joined) == "from-cookie"  # the cookie first, as Chainlit
    assert token_of([(b"authorization", b"bearer  from-header ")]) == "from-header"
    assert token_of([(b"authorization", b"Basic abc")]) is None
    kept, removed = without_token(joined + [(b"cookie", b"access_token_0=chunk")])
    assert removed == ["access_token", "access_token_0"]
    assert kept == [(b"cookie", b"lab_browser=b1; other=1")]


def test_secure_is_added_once():
    assert secure_cookie(b"access_token=x; HttpOnly; Path=/") == b"access_token=x; HttpOnly; Path=/; Secure"
    assert secure_cookie(b"a=b; secure; Path=/") == b"a=b; secure; Path=/"
    assert secure_cookie(b"secure=1; Path=/") == b"secure=1; Path=/; Secure"  # a cookie named so is not the attribute


def test_the_body_limit_is_in_mib_and_never_under_the_sockets_biggest_message():
    assert max_body_bytes({}) == 8 * MIB and max_body_bytes({"LAB_MAX_BODY_MB": "16"}) == 16 * MIB
    for wrong in (str(MIN_MAX_BODY_MB - 1), "0", "-8", "8.5", "lots"):
        with pytest.raises(ConfigurationError, match="LAB_MAX_BODY_MB"):
            max_body_bytes({"LAB_MAX_BODY_MB": wrong})
