"""The lesson's Demo 5 as a whole class: `bash scripts/lab.sh --class N` (30 by default) and N
simulated students (Locust users, load/blind_vote.py) who each log in through the login form's
endpoint, send `/prompt` in Blind mode and, once every round is final, vote at the same moment;
meanwhile the teacher's tab loads the page and opens `/engines` once a second.

Goals, each with a verdict (exit 1 naming a miss):
- every student logged in, got a final blind round and had the vote recorded;
- every vote is in the database once: one per student, on that student's round, with the winner
  the student chose;
- the reveal each student saw names the backend the database holds for each column;
- the teacher's page (GET /) and `/engines` answer within 1 s at p99, all through the run.

    .venv/bin/python -m experiments.lesson_class [--students 30] [--without vllm]

Locust runs from its own venv (.venv-load, bash scripts/load_venv.sh); the lab and its class live
in a temporary folder, stopped and removed at the end. Everything is on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench.verdict import Goal, all_of, at_most, exit_status
from backends.registry import backend_configs
from config import REPO
from load.chainlit_client import ChainlitClient
from servers.process import free_port

LAB_START_TIMEOUT_S = 420.0
TEACHER_EVERY_S = 1.0
TEACHER_GOAL_S = 1.0
LOCUST = REPO / ".venv-load" / "bin" / "locust"


def start_lab(folder: Path, students: int, without: str) -> tuple[subprocess.Popen, dict[str, str], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("BACKENDS", "AUTH_USERS", "TEACHERS", "CHAINLIT_AUTH_SECRET", "DATABASE_URL")}
    env.update(DATABASE_URL=f"sqlite:///{folder}/lab.db", DEFAULT_MAX_NEW_TOKENS="32", DEFAULT_TEMPERATURE="0")
    out = open(folder / "lab.out", "w")
    process = subprocess.Popen(["bash", "scripts/lab.sh", "--class", str(students), "--port", str(port),
                                "--class-dir", str(folder / "class"), "--logs", str(folder / "logs"),
                                "--without", without or "none"],
                               cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + LAB_START_TIMEOUT_S
    while "LAB_BACKENDS=" not in (folder / "lab.out").read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_lab(process)
            raise SystemExit(f"the lab did not start:\n{(folder / 'lab.out').read_text()[-2000:]}")
        time.sleep(0.5)
    lines = dict(re.findall(r"^(LAB_\w+)=(.*)$", (folder / "lab.out").read_text(), re.M))
    return process, lines, port


def stop_lab(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)


class Teacher(threading.Thread):
    """The teacher's tab: the page and /engines, once a second, timed, until told to stop."""

    def __init__(self, url: str, password: str) -> None:
        super().__init__(daemon=True)
        self.url, self.password = url, password
        self.page_s: list[float] = []
        self.engines_s: list[float] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        browser = requests.Session()
        login = browser.post(self.url + "/login", timeout=60,
                             files={"username": (None, "teacher"), "password": (None, self.password)})
        if login.status_code != 200:
            self.failures.append(f"the teacher's login: HTTP {login.status_code}")
            return
        with ChainlitClient(self.url, http=browser) as tab:
            tab.open_chat(timeout_s=120)
            while not self.done.is_set():
                started = time.perf_counter()
                page = browser.get(self.url + "/", timeout=30)
                self.page_s.append(time.perf_counter() - started)
                if page.status_code != 200:
                    self.failures.append(f"GET / answered {page.status_code}")
                record = tab.ask("/engines", 30)
                if record.reply_s is None or record.outcome not in ("empty", "replied"):
                    self.failures.append(f"/engines: {record.outcome}")
                self.engines_s.append(record.reply_s if record.reply_s is not None else 30.0)
                self.done.wait(max(0.0, TEACHER_EVERY_S - (time.perf_counter() - started)))


def results(folder: Path) -> list[dict]:
    lines = []
    for path in folder.glob("votes-*.jsonl"):
        lines += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines


def wait_for(folder: Path, kind: str, count: int, timeout_s: float, running: subprocess.Popen) -> list[dict]:
    """Every student's line of `kind` (or its failure), shown as it comes."""
    deadline, shown = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline and running.poll() is None:
        lines = results(folder)
        done = [line for line in lines if line["kind"] == kind]
        failed = [line for line in lines if line["kind"] == "failed"]
        if len(done) != shown:
            shown = len(done)
            print(f"    {kind}: {len(done)} of {count}" + (f" ({len(failed)} failed)" if failed else ""), flush=True)
        if len(done) + len(failed) >= count:
            break
        time.sleep(0.5)
    return [line for line in results(folder) if line["kind"] == kind]


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def stored_votes_and_rounds(database_url: str):
    from store import Store

    store = await Store.open(database_url)
    try:
        votes = [record.vote for record in await store.votes()]
        rounds = {round_.id: round_ for round_ in await store.rounds(limit=1000)}
        return votes, rounds
    finally:
        await store.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.lesson_class", description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--without", default="vllm", help="engines the lab leaves out (default: vllm)")
    args = parser.parse_args(argv)
    if not LOCUST.exists():
        raise SystemExit("Locust's venv is missing: bash scripts/load_venv.sh")
    folder = Path(tempfile.mkdtemp(prefix="lesson-class-"))
    votes_dir = folder / "votes"
    votes_dir.mkdir()
    print(f"lab.sh --class {args.students} --without {args.without}; {os.cpu_count()} cores; results in {folder}")
    lab, lines, port = start_lab(folder, args.students, args.without)
    url = f"http://127.0.0.1:{port}"
    goals: list[Goal] = []
    try:
        print(f"lab ready: BACKENDS={lines['LAB_BACKENDS']}")
        sheet = lines["LAB_CLASS_SHEET"]
        teacher_password = next(line.split(",", 1)[1] for line in Path(sheet).read_text().splitlines()
                                if line.startswith("teacher,"))
        teacher = Teacher(url, teacher_password)
        teacher.start()
        env = {**os.environ, "LESSON_SHEET": sheet, "LESSON_RESULTS_DIR": str(votes_dir)}
        locust = subprocess.Popen(
            [str(LOCUST), "-f", str(REPO / "load" / "blind_vote.py"), "--headless", "--host", url,
             "-u", str(args.students), "-r", str(args.students), "--run-time", "30m", "--only-summary",
             "--loglevel", "WARNING"],
            cwd=REPO, env=env, stdout=open(folder / "locust.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            started = time.monotonic()
            print("the class logs in, sends /prompt in Blind mode and waits for its round:")
            ready = wait_for(votes_dir, "ready", args.students, 1200, locust)
            rounds_s = time.monotonic() - started
            (votes_dir / "go").touch()
            print(f"every round final after {rounds_s:.0f} s; the class votes now:")
            cast = wait_for(votes_dir, "vote", len(ready), 300, locust)
        finally:
            os.killpg(locust.pid, signal.SIGINT)
            locust.wait(timeout=60)
            teacher.done.set()
            teacher.join(timeout=60)
        logins = [line for line in results(votes_dir) if line["kind"] == "login"]
        database_url = f"sqlite:///{folder}/lab.db"
        stored, rounds = asyncio.run(stored_votes_and_rounds(database_url))
    finally:
        stop_lab(lab)

    (folder / "teacher.json").write_text(json.dumps({"page_s": teacher.page_s, "engines_s": teacher.engines_s,
                                                     "failures": teacher.failures}))
    students = [f"student{n:02d}" for n in range(1, args.students + 1)]
    label_of = {config.name: config.label for config in backend_configs({"BACKENDS": lines["LAB_BACKENDS"]})}
    by_user = {vote.user_identifier: vote for vote in stored}
    chosen = {line["user"]: line for line in cast}
    recorded_once = sum(
        1 for user in students
        if [vote.user_identifier for vote in stored].count(user) == 1 and user in chosen
        and by_user[user].round_id == chosen[user]["round_id"] and by_user[user].winner_label == chosen[user]["winner"])
    revealed_right = sum(
        1 for user, line in chosen.items()
        if line["round_id"] in rounds and line["revealed"]
        and line["revealed"] == {c.label: label_of.get(c.backend, c.backend) for c in rounds[line["round_id"]].columns})
    vote_s = [line["vote_s"] for line in cast if line.get("ok")]
    print(f"\nlogins {sum(line['status'] == 200 for line in logins)} of {args.students} "
          f"(median {statistics.median([line['login_s'] for line in logins]) if logins else 0:.2f} s); "
          f"rounds final {len(ready)}; votes answered ok {sum(bool(line.get('ok')) for line in cast)}, "
          f"each vote's answer median {statistics.median(vote_s) * 1000 if vote_s else 0:.0f} ms, "
          f"slowest {max(vote_s) * 1000 if vote_s else 0:.0f} ms; votes in the database {len(stored)}")
    print(f"teacher: {len(teacher.page_s)} page loads, p99 {(p99(teacher.page_s) or 0) * 1000:.0f} ms; "
          f"{len(teacher.engines_s)} /engines, p99 {(p99(teacher.engines_s) or 0) * 1000:.0f} ms"
          + (f"; problems: {teacher.failures[:3]}" if teacher.failures else ""))
    goals += [
        all_of("students logged in through the form", sum(line["status"] == 200 for line in logins), args.students),
        all_of("students with a final blind round", len([line for line in ready if line.get("round_id")]),
               args.students),
        all_of("votes recorded once, on the student's round, as chosen", recorded_once, args.students),
        at_most("votes in the database beyond one per student", len(stored) - recorded_once, 0, digits=0),
        all_of("reveals naming the stored backend of every column", revealed_right, args.students),
        at_most("teacher's page, p99", p99(teacher.page_s), TEACHER_GOAL_S, unit="s", digits=2),
        at_most("teacher's /engines, p99", p99(teacher.engines_s), TEACHER_GOAL_S, unit="s", digits=2),
        at_most("teacher's requests that failed", len(teacher.failures), 0, digits=0),
    ]
    return exit_status(goals)


if __name__ == "__main__":
    sys.exit(main())
