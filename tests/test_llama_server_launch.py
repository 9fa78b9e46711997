"""The llama-server launcher and build script agree on flags, cache folder and command (no binary needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from scripts import llama_server_launch as launch
from config import REPO


def _script_print(flag: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "llama_server_launch.py"), flag],
        capture_output=True, text=True, env=env, check=True,
    )
    return result.stdout.strip()


def test_default_flags_are_the_wheels():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    x86 = re.search(r'if \[ "\$\(uname -m\)" = x86_64 \]; then\n\s*DEFAULT_CMAKE_ARGS="([^"]*)"\nelse\n'
                    r'\s*DEFAULT_CMAKE_ARGS="([^"]*)"', setup)
    assert x86, "setup.sh's DEFAULT_CMAKE_ARGS block changed: keep llama_server_launch in step"
    assert launch.default_cmake_args("x86_64") == x86.group(1)
    assert launch.default_cmake_args("aarch64") == x86.group(2)
    assert 'LLAMA_CPP_CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS' in setup


def test_cache_key_follows_the_override(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("LLAMA_CPP_CMAKE_ARGS", None)
    default_dir = launch.build_dir(env)
    assert default_dir.parent == tmp_path / "serving-lab" / "llama-server"
    assert _script_print("--print-build-dir", env) == str(default_dir)
    assert launch.binary_path(env) == default_dir / "llama-server"

    native = {**env, "LLAMA_CPP_CMAKE_ARGS": "-DGGML_NATIVE=ON"}
    assert launch.build_dir(native) != default_dir
    assert _script_print("--print-build-dir", native) == str(launch.build_dir(native))
    assert _script_print("--print-cmake-args", native).endswith(" -DGGML_NATIVE=ON")
    # An empty override means the defaults, as in setup.sh's ${LLAMA_CPP_CMAKE_ARGS:-...}.
    assert launch.build_dir({**env, "LLAMA_CPP_CMAKE_ARGS": ""}) == default_dir


def test_missing_binary_says_how_to_build(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    message = launch.missing_binary_message(env)
    assert message and "bash scripts/llama_server.sh --setup-only" in message
    binary = launch.binary_path(env)
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert launch.missing_binary_message(env) is None


def test_server_command(tmp_path):
    model = tmp_path / launch.BUNDLED_FILE
    command = launch.server_command(model, 8123, binary="/x/llama-server", extra_args=["--parallel", "2"])
    assert command[0] == "/x/llama-server"
    pairs = dict(zip(command[1:], command[2:]))
    assert pairs["--model"] == str(model)
    assert pairs["--alias"] == launch.BUNDLED_MODEL_NAME
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--ctx-size"] == "2048" and pairs["--threads"] == "2"
    assert {"--metrics", "--slots", "--no-ui"} <= set(command) and "--props" not in command
    assert command[-2:] == ["--parallel", "2"]
    other = launch.server_command(tmp_path / "qwen.gguf", 1)
    assert other[other.index("--alias") + 1] == "qwen"


def test_the_build_pins_the_sdist_and_the_commit():
    assert re.fullmatch(r"[0-9a-f]{64}", launch.SDIST_SHA256)
    assert re.fullmatch(r"[0-9a-f]{40}", launch.LLAMA_CPP_COMMIT)
    assert f"-DLLAMA_BUILD_COMMIT={launch.LLAMA_CPP_COMMIT[:9]}" in launch.SERVER_CMAKE_ARGS
    # No network at build time: neither the prebuilt web UI download nor HTTPS/CURL.
    for flag in ("-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"):
        assert flag in launch.SERVER_CMAKE_ARGS
    script = (REPO / "scripts" / "llama_server.sh").read_text()
    assert "--require-hashes" in script and "--target llama-server" in script
