"""What one client can send the real app (`chainlit run app.py`, login on): bodies over LAB_MAX_BODY_MB
get 413 before they are read, the page's headers, and Secure cookies over https.

The uploads are sent as an attacker sends them, over a raw socket: 200 MB declared in a
Content-Length (the 413 comes before a byte of the body left), and 200 MB chunked, with no length
at all (the 413 comes once the limit is over, while most of it is still unsent), to Chainlit's
file upload, the login form, a JSON route (its body is read before its login is checked) and the
chat socket's long-polling endpoint (engine.io reads a chunked body to its end before it answers).
The app's memory (psutil) must not grow with them. Controls: a 3.3 MB
long-polling message (a 1.1 MB paste of Chinese) still reaches engine.io; the login form still works.
"""

from __future__ import annotations

import json
import select
import secrets
import socket
from typing import Iterator

import psutil
import pytest
import requests

from core.auth import hash_password
from servers.app import AppServer, backend_env, client_from, log_in
from tests.fixtures_app import closed_loopback_url
from ui.body_limit import DEFAULT_MAX_BODY_MB, MIB

pytestmark = pytest.mark.slow

PASSWORDS = {"teacher": "teacher-" + secrets.token_hex(4), "student01": "student01-" + secrets.token_hex(4)}
UPLOAD_BYTES = 200 * MIB
CHUNK_BYTES = 64 * 1024
# What the kernel's socket buffers and uvicorn's own read-ahead hold on loopback, beyond the limit.
BUFFERED_BYTES = 24 * MIB
RSS_GROWTH_MB = 40
SOCKET = "/ws/socket.io/?EIO=4&transport=polling"


@pytest.fixture(scope="module")
def login_app(app_factory) -> AppServer:
    env = {
        "BACKENDS": "down",
        **backend_env("down", kind="openai", base_url=closed_loopback_url(), label="Down", connect_timeout_s="1"),
        "AUTH_USERS": ",".join(f"{name}:{hash_password(password, iterations=1000)}"
                               for name, password in PASSWORDS.items()),
        "TEACHERS": "teacher", "CHAINLIT_AUTH_SECRET": secrets.token_urlsafe(32),
    }
    return app_factory(env, name="chainlit-request-limits")


def rss_mb(app: AppServer) -> float:
    return psutil.Process(app.process.process.pid).memory_info().rss / MIB


BOUNDARY = "lab-upload-boundary"
MULTIPART = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
PART_HEAD = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n"
             "Content-Type: text/plain\r\n\r\n").encode()


def chunks(total: int) -> Iterator[bytes]:
    """A file part of `total` bytes, in HTTP/1.1 chunked encoding (64 KiB a chunk), never ended."""
    yield b"%x\r\n%s\r\n" % (len(PART_HEAD), PART_HEAD)
    block = b"x" * CHUNK_BYTES
    for _ in range(total // CHUNK_BYTES):
        yield b"%x\r\n%s\r\n" % (len(block), block)


def send_until_answered(app: AppServer, path: str, headers: dict[str, str], body: Iterator[bytes]) -> tuple[int, int]:
    """POST `path`, sending `body` until the app answers; (its status, body bytes sent before the answer)."""
    host, port = app.url.removeprefix("http://").split(":")
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(head.encode() + b"\r\n")
        connection.settimeout(5)
        sent = 0
        try:
            for piece in body:
                if select.select([connection], [], [], 0)[0]:
                    break  # the answer is there
                connection.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the app stopped reading: its answer is waiting
        connection.settimeout(30)
        status_line = connection.recv(4096).split(b"\r\n", 1)[0]
    return int(status_line.split()[1]), sent


def socket_id(app: AppServer) -> str:
    """A long-polling socket's id, from engine.io's handshake (which needs no login)."""
    handshake = requests.get(app.url + SOCKET, timeout=30)
    assert handshake.status_code == 200 and handshake.text.startswith("0"), handshake.text[:200]
    return json.loads(handshake.text[1:])["sid"]


def test_a_200_mb_body_gets_413_before_it_is_read_and_the_apps_memory_stays(login_app: AppServer):
    before_mb = rss_mb(login_app)
    # The file upload, the login form, a JSON route (read whole before its login is checked), the socket.
    for path in ("/project/file?session_id=none", "/login", "/project/threads", f"{SOCKET}&sid={socket_id(login_app)}"):
        declared = {**MULTIPART, "Content-Length": str(UPLOAD_BYTES)}
        assert send_until_answered(login_app, path, declared, iter(())) == (413, 0), path  # at once, nothing read
        chunked = {**MULTIPART, "Transfer-Encoding": "chunked"}
        status, sent = send_until_answered(login_app, path, chunked, chunks(UPLOAD_BYTES))
        assert status == 413 and sent < DEFAULT_MAX_BODY_MB * MIB + BUFFERED_BYTES, (path, status, sent)
    assert rss_mb(login_app) - before_mb < RSS_GROWTH_MB, (before_mb, rss_mb(login_app))
    assert requests.get(login_app.url + "/", timeout=30).status_code == 200


def test_a_long_polling_message_of_a_big_chinese_paste_still_reaches_engine_io(login_app: AppServer):
    sid = socket_id(login_app)
    message = ('42["paste",' + json.dumps("中" * 1_100_000, ensure_ascii=False) + "]").encode()
    assert 3 * MIB < len(message) < DEFAULT_MAX_BODY_MB * MIB
    answer = requests.post(f"{login_app.url}{SOCKET}&sid={sid}", data=message, timeout=60,
                           headers={"Content-Type": "text/plain;charset=UTF-8"})
    assert (answer.status_code, answer.text) == (200, "OK")  # engine.io took it


def test_every_page_and_file_carries_the_frame_and_type_headers(login_app: AppServer):
    for path in ("/", "/login", "/public/serving-lab.js", "/auth/config"):
        answer = requests.get(login_app.url + path, timeout=30)
        assert answer.status_code == 200, path
        policy = answer.headers["Content-Security-Policy"]
        assert "frame-ancestors 'self'" in policy and "img-src 'self'" in policy, (path, policy)
        assert answer.headers["X-Content-Type-Options"] == "nosniff", path


def test_cookies_are_secure_when_the_request_came_over_https_through_a_trusted_proxy(login_app: AppServer):
    def cookies_from(address: str, headers: dict[str, str]) -> dict[str, str]:
        with client_from(address) as client:
            client.headers.update(headers)
            response = log_in(client, login_app.url, "student01", PASSWORDS["student01"])
        assert response.status_code == 200
        return {line.split("=", 1)[0]: line for line in response.headers.get_list("set-cookie")}

    over_https = cookies_from("127.0.0.1", {"X-Forwarded-Proto": "https"})  # the proxy on the app's machine
    assert {"access_token", "lab_login_device", "lab_browser"} <= over_https.keys(), over_https
    assert all("Secure" in line for line in over_https.values()), over_https
    plain = cookies_from("127.0.0.1", {})  # control: over plain http the cookies could not be Secure
    claimed = cookies_from("127.0.0.2", {"X-Forwarded-Proto": "https"})  # not a trusted proxy (FORWARDED_ALLOW_IPS)
    for cookies in (plain, claimed):
        assert "Secure" not in cookies["access_token"], cookies
