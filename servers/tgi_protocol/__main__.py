"""`python -m servers.tgi_protocol`: run the TGI-protocol stand-in on a GGUF model or its paced engine.

    python -m servers.tgi_protocol --host 127.0.0.1 --port 8080 --model M.gguf \
        [--max-concurrent 128] [--max-input-tokens 1024 --max-total-tokens 2048]
    python -m servers.tgi_protocol --port 8080 --paced-rate 200 [--paced-tokens 100]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from servers.tgi_protocol.engines import LlamaCppEngine, PacedEngine
from servers.tgi_protocol.routes import TGIProtocolServer
from servers.tgi_protocol.validation import Limits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m servers.tgi_protocol",
                                     description="A stand-in server that speaks TGI's HTTP protocol.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", type=Path, help="a GGUF file (not needed with --paced-rate)")
    parser.add_argument("--paced-rate", type=float, default=0.0,
                        help="serve no model: stream ` w1 w2 ...` at this many tokens/s (measurement tests)")
    parser.add_argument("--paced-tokens", type=int, default=100, help="tokens per paced reply")
    parser.add_argument("--paced-first-token-s", type=float, default=0.0, help="delay before the first paced token")
    parser.add_argument("--model-id", default="", help="the model id /info reports (default: the file name)")
    parser.add_argument("--max-concurrent", type=int, default=128, help="TGI's --max-concurrent-requests")
    parser.add_argument("--max-input-tokens", type=int, default=1024)
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    args = parser.parse_args(argv)
    if args.max_input_tokens >= args.max_total_tokens:
        parser.error("--max-input-tokens must be lower than --max-total-tokens (as in TGI)")
    if args.paced_rate > 0:
        engine = PacedEngine(args.paced_rate, args.paced_tokens, args.paced_first_token_s)
    elif args.model is None:
        parser.error("give --model (a GGUF file) or --paced-rate")
    else:
        engine = LlamaCppEngine(args.model, n_ctx=args.max_total_tokens, threads=args.threads)
    limits = Limits(args.max_input_tokens, args.max_total_tokens, args.max_concurrent)
    server = TGIProtocolServer(engine, limits, args.model_id or engine.model_path.name)
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
