"""`bash scripts/lab.sh`, as a person runs it: every engine this machine can run and the app with all
of them, one compare round across them over Chainlit's socket.io, then Ctrl-C stops every process
the script started. And where an engine cannot come, the script says why and the app still starts.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from config import REPO
from load.chainlit_client import ChainlitClient
from servers.process import free_port

# The vllm and llama_server markers come from the fixtures (tests/conftest.py): the lab starts its own.
pytestmark = pytest.mark.slow
LAB_START_TIMEOUT_S = 420.0  # vLLM's CPU build alone takes about a minute to start, more on busy cores
ROUND_TIMEOUT_S = 400.0  # a safety bound: four columns one after another on two busy cores


def start_lab(logs: Path, *args: str, **env: str) -> tuple[subprocess.Popen, dict[str, str], str]:
    """Run the script in a session of its own (as a terminal runs a foreground job); return it,
    its LAB_* lines and its output once it says it is ready."""
    ignored = ("BACKENDS", "DATABASE_URL", "TGI_BASE_URL", "VLLM_SERVE_MODEL")  # the test says what the lab gets
    full_env = {k: v for k, v in os.environ.items() if k not in ignored}
    full_env.update(DATABASE_URL=f"sqlite:///{logs}/lab.db", **env)
    out_path = logs / "lab.out"
    with open(out_path, "w") as out:
        process = subprocess.Popen(["bash", "scripts/lab.sh", "--logs", str(logs), *args], cwd=REPO, env=full_env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + LAB_START_TIMEOUT_S
    while "LAB_BACKENDS=" not in out_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail(f"the lab did not start:\n{out_path.read_text()[-3000:]}", pytrace=False)
        time.sleep(1)
    output = out_path.read_text()
    lines = dict(re.findall(r"^(LAB_\w+)=(.*)$", output, re.M))
    return process, lines, output


def ctrl_c(process: subprocess.Popen) -> None:
    """What Ctrl-C in a terminal does: SIGINT to the foreground process group (the script's)."""
    os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout=120)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        ctrl_c(process)


def processes_started_by(logs: Path, script_pid: int) -> dict[int, str]:
    """Every live process in the sessions the script started (each PID in its pids.txt leads one),
    with its start time (so a reused PID is not taken for a survivor)."""
    leaders = {int(line.split()[1]) for line in (logs / "pids.txt").read_text().splitlines()}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        session, start_ticks = int(fields[3]), fields[19]
        if session in leaders and fields[0] != "Z":
            found[int(entry.name)] = start_ticks
    return found


def still_alive(pid: int, start_ticks: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[19] == start_ticks and fields[0] != "Z"


@pytest.mark.timeout(1200)
def test_the_lab_runs_a_round_on_every_engine_and_ctrl_c_stops_all_it_started(tmp_path, tgi_server, vllm_installed,
                                                                                 llama_server_installed):
    port = free_port()
    process, lab, output = start_lab(tmp_path, "--port", str(port), DEFAULT_MODE="compare",
                                     DEFAULT_MAX_NEW_TOKENS="32", DEFAULT_TEMPERATURE="0",
                                     TGI_BASE_URL=tgi_server.url)
    try:
        assert lab["LAB_URL"] == f"http://127.0.0.1:{port}"
        # Every engine this machine can run: the embedded model, llama-server, vLLM, and the TGI that answers.
        assert lab["LAB_BACKENDS"].split(",") == ["llama_cpp", "llama_server", "vllm", "tgi"], output
        for name in ("llama_cpp", "llama_server", "vllm", "tgi"):
            assert re.search(rf"^\s+up\s+{name}\s", output, re.M), output

        with ChainlitClient(lab["LAB_URL"], record_events=True) as client:
            client.open_chat(timeout_s=120)
            record = client.ask("Name one colour.", ROUND_TIMEOUT_S)
            rounds = [data["props"] for _, event, data in client.events
                      if event == "element" and isinstance(data, dict)
                      and isinstance(data.get("props"), dict) and data["props"].get("kind") == "compare"]
        assert record.outcome in ("replied", "empty"), record.as_dict()
        assert rounds and rounds[-1]["final"], "no final compare round came back"
        columns = rounds[-1]["columns"]
        assert [column["state"] for column in columns] == ["completed"] * 4, columns
        assert all(column["text"].strip() for column in columns), columns
        # The TGI here is the TGI-protocol stand-in, which the app labels as such.
        assert {column["backend"] for column in columns} == \
            {"llama.cpp (embedded)", "llama.cpp server", "vLLM", "TGI (stand-in)"}, columns

        started = processes_started_by(tmp_path, process.pid)
        # Control: the app, llama-server and vLLM (with its engine process) were running just now.
        assert len(started) >= 4 and all(still_alive(pid, ticks) for pid, ticks in started.items())
    finally:
        stop(process)
    assert process.returncode == 0, (tmp_path / "lab.out").read_text()[-2000:]
    left = [pid for pid, ticks in started.items() if still_alive(pid, ticks)]
    assert not left, f"Ctrl-C left {left} running"
    assert "Stopping what this script started" in (tmp_path / "lab.out").read_text()


def test_the_lab_says_why_an_engine_is_not_up_and_starts_the_app_without_it(tmp_path, vllm_installed):
    dead_port = free_port()  # nothing listens there
    port = free_port()
    # A machine where nvidia-smi works: vLLM would be the GPU build, which needs to be told its model.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: a stand-in for this test'\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    process, lab, output = start_lab(tmp_path, "--port", str(port), "--without", "llama_server",
                                     TGI_BASE_URL=f"http://127.0.0.1:{dead_port}",
                                     PATH=f"{fake_bin}:{os.environ['PATH']}")
    try:
        assert lab["LAB_BACKENDS"] == "llama_cpp"
        assert re.search(r"^\s+not up\s+llama_server\s+left out \(--without\)", output, re.M), output
        assert re.search(r"^\s+not up\s+vllm\s+a GPU is here: say which model vLLM serves with VLLM_SERVE_MODEL",
                         output, re.M), output
        assert re.search(rf"^\s+not up\s+tgi\s+nothing answers at TGI_BASE_URL=http://127.0.0.1:{dead_port}",
                         output, re.M), output
        with ChainlitClient(lab["LAB_URL"]) as client:
            client.open_chat(timeout_s=120)
            assert client.ask("Say hello.", ROUND_TIMEOUT_S).ok
        # Without --class the app is this machine's alone: 127.0.0.1 only, not even 127.0.0.2
        # (tests/test_lab_class.py reaches a class lab there).
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.2:{port}/", timeout=10)
        assert "LAB_JOIN_URLS" not in lab and "login is on" not in output
        started = processes_started_by(tmp_path, process.pid)
        assert started  # the app
    finally:
        stop(process)
    assert process.returncode == 0
    assert not [pid for pid, ticks in started.items() if still_alive(pid, ticks)]
