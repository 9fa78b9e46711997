"""`bash scripts/lab.sh --class 3`, as a teacher runs it before class: the app listens beyond
loopback (reached here at 127.0.0.2, which a 127.0.0.1-only app refuses), prints where students
go and never a password, every student logs in with the sheet's password over Chainlit's
`/login` (a wrong one is refused plainly), a student cannot start load or export the class's
trace while the teacher can, the teacher closes a rehearsal's open blind round, and SIGTERM and
Ctrl-C stop everything the script started. Running it again keeps the class.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from core.classroom import CPU_SLO, SHEET_FILE, machine_addresses
from load.chainlit_client import ChainlitClient
from servers.process import free_port
from tests.test_lab import ctrl_c, processes_started_by, still_alive

pytestmark = pytest.mark.slow
LAB_START_TIMEOUT_S = 240.0
REPLY_TIMEOUT_S = 240.0
REACHED_AT = "127.0.0.2"  # loopback, but not the one address a 127.0.0.1-bound app listens on


def start_class_lab(logs: Path, class_dir: Path, port: int, *args: str, students: int = 3,
                    without: str = "vllm,llama_server", **env: str):
    """The script in a session of its own, as a terminal's foreground job; its LAB_* lines once ready."""
    ignored = ("BACKENDS", "DATABASE_URL", "TGI_BASE_URL", "VLLM_SERVE_MODEL", "CAPACITY_SLO", "AUTH_USERS",
               "TEACHERS", "CHAINLIT_AUTH_SECRET", "BLIND_OPEN_S")
    full_env = {k: v for k, v in os.environ.items() if k not in ignored}
    full_env.update({"DATABASE_URL": f"sqlite:///{logs}/lab.db", "DEFAULT_MAX_NEW_TOKENS": "16",
                     "DEFAULT_TEMPERATURE": "0", **env})
    logs.mkdir(parents=True, exist_ok=True)
    out_path = logs / "lab.out"
    with open(out_path, "w") as out:
        process = subprocess.Popen(["bash", "scripts/lab.sh", "--class", str(students), "--port", str(port), "--logs",
                                    str(logs), "--class-dir", str(class_dir), "--without", without, *args],
                                   cwd=Path(__file__).resolve().parents[1], env=full_env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + LAB_START_TIMEOUT_S
    while "LAB_BACKENDS=" not in out_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                ctrl_c(process)
            pytest.fail(f"the lab did not start:\n{out_path.read_text()[-3000:]}", pytrace=False)
        time.sleep(0.5)
    output = out_path.read_text()
    return process, dict(re.findall(r"^(LAB_\w+)=(.*)$", output, re.M)), output


def sheet(path: str | Path) -> dict[str, str]:
    with open(path, newline="") as sheet_file:
        return {row["user"]: row["password"] for row in csv.DictReader(sheet_file)}


class Lab:
    def __init__(self, root: Path, tgi_url: str) -> None:
        self.root, self.tgi_url = root, tgi_url
        self.class_dir = root / "class"
        self.port = free_port()
        self.url = f"http://{REACHED_AT}:{self.port}"
        self.process, self.lines, self.output = start_class_lab(root / "first", self.class_dir, self.port,
                                                                TGI_BASE_URL=tgi_url)
        self.logins = sheet(self.lines["LAB_CLASS_SHEET"])

    def log_in(self, user: str, password: str | None = None) -> tuple[requests.Session, requests.Response]:
        browser = requests.Session()
        response = browser.post(self.url + "/login", timeout=60,
                                files={"username": (None, user), "password": (None, password or self.logins[user])})
        return browser, response

    def chat(self, user: str) -> ChainlitClient:
        browser, response = self.log_in(user)
        assert response.status_code == 200, response.text
        client = ChainlitClient(self.url, http=browser, record_events=True)
        client.open_chat(timeout_s=120)
        return client


@pytest.fixture(scope="module")
def lab(tmp_path_factory, tgi_server):
    made = Lab(tmp_path_factory.mktemp("class-lab"), tgi_server.url)
    yield made
    if made.process.poll() is None:
        ctrl_c(made.process)


def said(record) -> str:
    return "\n".join(record.notes)


def post_action(lab: Lab, browser: requests.Session, client: ChainlitClient, name: str, payload: dict) -> dict:
    """What the page posts when a button is pressed, with that person's login."""
    response = browser.post(f"{lab.url}/project/action", timeout=60,
                            json={"sessionId": client.session_id, "action": {"name": name, "payload": payload}})
    assert response.ok, response.text
    return response.json()["response"]


def test_the_class_lab_listens_beyond_loopback_and_says_where_students_go_but_no_password(lab: Lab):
    assert requests.get(lab.url + "/", timeout=30).status_code == 200
    assert lab.lines["LAB_URL"] == f"http://127.0.0.1:{lab.port}"
    addresses = machine_addresses()
    assert lab.lines["LAB_JOIN_URLS"].split() == [f"http://{address}:{lab.port}" for address in addresses]
    assert "127.0.0.1" not in lab.lines["LAB_JOIN_URLS"]
    if addresses:
        assert "Students open: http://" in lab.output
    else:
        assert "Students cannot reach this machine" in lab.output
    assert lab.lines["LAB_CLASS_SHEET"] == str((lab.class_dir / SHEET_FILE).resolve())
    assert Path(lab.lines["LAB_CLASS_SLIPS"]).is_file()
    assert lab.lines["LAB_CAPACITY_SLO"] == CPU_SLO and "Objective of the capacity sweep" in lab.output
    assert list(lab.logins) == ["teacher", "student01", "student02", "student03"]
    logs = [path for path in (lab.root / "first").rglob("*") if path.is_file()]
    for path in logs:
        content = path.read_text(errors="replace")
        assert not [user for user, password in lab.logins.items() if password in content], path


def test_each_student_logs_in_with_the_sheets_password_and_a_wrong_one_is_told_so(lab: Lab):
    for user in ("student01", "student02", "student03", "teacher"):
        browser, response = lab.log_in(user)
        assert response.status_code == 200, (user, response.text)
        me = browser.get(lab.url + "/user", timeout=30)
        assert me.ok and me.json()["identifier"] == user
    for user, password in (("student01", lab.logins["student02"]), ("student09", lab.logins["student01"])):
        _, response = lab.log_in(user, password)
        assert response.status_code == 401 and response.json()["detail"] == "wrong user name or password"


def test_a_student_cannot_start_load_or_export_the_class_trace_and_the_teacher_can(lab: Lab):
    with lab.chat("student01") as student, lab.chat("teacher") as teacher:
        assert student.ask("Name one colour.", REPLY_TIMEOUT_S).ok  # the class's traffic, for the trace
        assert "Only a teacher may export the class's trace" in said(student.ask("/trace", REPLY_TIMEOUT_S))
        assert "Only a teacher may start load" in said(student.ask("/bench", REPLY_TIMEOUT_S))
        refused = post_action(lab, student.http, student, "simulate", {"users": 1})
        assert refused["ok"] is False and "Only a teacher may start load" in refused["message"]

        trace = said(teacher.ask("/trace", REPLY_TIMEOUT_S))
        assert re.search(r"Class trace\*\* \(1 students, \d+ messages", trace), trace
        started = post_action(lab, teacher.http, teacher, "simulate", {"users": 1})
        assert started["ok"] is True and "Simulating 1 user(s)" in started["message"], started


def test_the_teacher_closes_a_rehearsals_open_blind_round_and_the_class_sees_the_engines_again(lab: Lab):
    with lab.chat("student02") as voter, lab.chat("student03") as other, lab.chat("teacher") as teacher:
        voter.change_settings(mode="blind")
        round_record = voter.ask("Say hello.", REPLY_TIMEOUT_S)
        assert round_record.outcome in ("replied", "empty"), round_record.as_dict()
        held = said(other.ask("/engines", REPLY_TIMEOUT_S))
        assert "live load is for the teacher while a blind round is open" in held, held
        assert "120 minutes after the newest one started" in held  # BLIND_OPEN_S with login on: 2 hours
        assert "Only a teacher may close" in said(other.ask("/close_rounds", REPLY_TIMEOUT_S))
        assert "live load is for the teacher" in said(other.ask("/engines", REPLY_TIMEOUT_S))  # still held

        closed = said(teacher.ask("/close_rounds", REPLY_TIMEOUT_S))
        assert "Closed 1 open blind round(s) of 1 person(s)" in closed, closed
        assert "live load is for the teacher" not in said(other.ask("/engines", REPLY_TIMEOUT_S))
        status = said(voter.ask("/status", REPLY_TIMEOUT_S))  # the voter's own views go on too
        assert "waits" not in status and status, status
        assert "No blind round of the class waits" in said(teacher.ask("/close_rounds", REPLY_TIMEOUT_S))


def test_sigterm_stops_everything_and_running_again_keeps_the_class_until_ctrl_c(lab: Lab):
    started = processes_started_by(lab.root / "first", lab.process.pid)
    assert started and all(still_alive(pid, ticks) for pid, ticks in started.items())  # control
    os.kill(lab.process.pid, signal.SIGTERM)
    lab.process.wait(timeout=120)
    assert lab.process.returncode == 0
    assert not [pid for pid, ticks in started.items() if still_alive(pid, ticks)], "SIGTERM left processes"

    again, lines, output = start_class_lab(lab.root / "again", lab.class_dir, lab.port, TGI_BASE_URL=lab.tgi_url)
    try:
        assert sheet(lines["LAB_CLASS_SHEET"]) == lab.logins
        assert "the class kept from" in output
        _, response = lab.log_in("student03")
        assert response.status_code == 200
        started = processes_started_by(lab.root / "again", again.pid)
        assert started and all(still_alive(pid, ticks) for pid, ticks in started.items())
    finally:
        ctrl_c(again)
    assert again.returncode == 0
    assert not [pid for pid, ticks in started.items() if still_alive(pid, ticks)], "Ctrl-C left processes"
