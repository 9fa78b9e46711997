"""Demo 5 of the lesson, by a class of simulated students (Locust users; experiments/lesson_class.py
runs it against `lab.sh --class N`).

Each student takes the next login of the class sheet (LESSON_SHEET, the CSV `user,password`),
logs in from an address of its own (127.0.1.N: its own machine, as in a room) through the login
form's endpoint (`POST /login`, as the page sends it), opens a chat, sets Blind mode in the
settings panel and sends `/prompt`. Once its round is final it says so ("ready") and waits for
the class: when the file `go` appears in LESSON_RESULTS_DIR every student votes at the same
moment (`POST /project/action`, as the vote button does), then reads the revealed round from the
app and writes what it saw. One JSON line per step in LESSON_RESULTS_DIR.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import time
from pathlib import Path

import gevent
import requests
from locust import User, constant, task
from requests.adapters import HTTPAdapter
from locust.exception import StopUser

# Locust puts this file's folder on the import path, so the client imports by its own name.
from chainlit_client import ChainlitClient, ChatFailed

RESULTS_DIR = Path(os.environ.get("LESSON_RESULTS_DIR", "."))
GO_FILE = RESULTS_DIR / "go"
ROUND_TIMEOUT_S = float(os.environ.get("LESSON_ROUND_TIMEOUT_S", "600"))
WAIT_FOR_CLASS_S = float(os.environ.get("LESSON_WAIT_FOR_CLASS_S", "900"))


def students(sheet: str) -> list[dict[str, str]]:
    with open(sheet, newline="", encoding="utf-8") as rows:
        return [row for row in csv.DictReader(rows) if row["user"] != "teacher"]


STUDENTS = students(os.environ["LESSON_SHEET"]) if os.environ.get("LESSON_SHEET") else []
_next = itertools.count()


def write(kind: str, **fields: object) -> None:
    line = json.dumps({"kind": kind, "at": time.time(), **fields}, ensure_ascii=False)
    with open(RESULTS_DIR / f"votes-{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
        out.write(line + "\n")


class FromAddress(HTTPAdapter):
    """Connections that leave from one loopback address: each student's machine is its own client
    address, as in a room (the login limits take turns per address)."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


def rounds_seen(client: ChainlitClient) -> list[dict]:
    """The compare elements' props the app sent this tab, in order."""
    return [data["props"] for _, event, data in (client.events or [])
            if event == "element" and isinstance(data, dict) and isinstance(data.get("props"), dict)
            and data["props"].get("kind") == "compare"]


class BlindVoter(User):
    """One student of the class: a login, one blind round, one vote at the class's moment."""

    wait_time = constant(1)

    @task
    def vote_once(self) -> None:
        number = next(_next)
        if number >= len(STUDENTS):
            raise StopUser()
        user = STUDENTS[number]["user"]
        browser = requests.Session()
        browser.mount("http://", FromAddress(f"127.0.1.{number + 1}"))
        started = time.perf_counter()
        login = browser.post(self.host + "/login", timeout=120,
                             files={"username": (None, user), "password": (None, STUDENTS[number]["password"])})
        write("login", user=user, status=login.status_code, login_s=time.perf_counter() - started)
        if login.status_code != 200:
            raise StopUser()
        client = ChainlitClient(self.host, http=browser, record_events=True)
        try:
            client.open_chat(timeout_s=120)
            client.change_settings(mode="blind")
            record = client.ask("/prompt", ROUND_TIMEOUT_S)
            final = [props for props in rounds_seen(client) if props.get("final")]
            round_id = final[-1]["roundId"] if final else None
            write("ready", user=user, outcome=record.outcome, round_id=round_id,
                  labels=[column["label"] for column in final[-1]["columns"]] if final else [])
            if round_id is None:
                raise StopUser()
            deadline = time.monotonic() + WAIT_FOR_CLASS_S
            while not GO_FILE.exists() and time.monotonic() < deadline:
                gevent.sleep(0.02)
            winner = final[-1]["columns"][number % len(final[-1]["columns"])]["label"]
            sent = time.time()
            answer = browser.post(self.host + "/project/action", timeout=120, json={
                "sessionId": client.session_id,
                "action": {"name": "vote", "payload": {"round_id": round_id, "outcome": "win", "winner": winner}}})
            vote_s = time.time() - sent
            response = answer.json().get("response", {}) if answer.ok else {}
            revealed = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and response.get("ok"):
                shown = [props for props in rounds_seen(client) if props.get("roundId") == round_id
                         and props.get("revealed")]
                if shown:
                    revealed = {column["label"]: column.get("backend") for column in shown[-1]["columns"]}
                    break
                gevent.sleep(0.05)
            write("vote", user=user, round_id=round_id, winner=winner, status=answer.status_code,
                  ok=bool(response.get("ok")), message=response.get("message"), sent_wall_s=sent, vote_s=vote_s,
                  revealed=revealed)
        except (ChatFailed, ValueError, requests.RequestException) as error:
            write("failed", user=user, error=str(error)[:300])
        finally:
            client.close()
        raise StopUser()
