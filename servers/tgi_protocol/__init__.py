"""A stand-in server that speaks TGI's HTTP protocol, on a real GGUF model or a paced engine.

No TGI can run on these machines, so tests, benchmarks and classroom demos talk
to this instead; its numbers are a stand-in's, and /info says so in `router`.
server.py is the server (`python -m servers.tgi_protocol`), contract.py TGI's
OpenAPI spec as an executable contract, handle.py starts one in a process of
its own and reads its test-only routes.
"""

from servers.tgi_protocol.handle import TGIServer, start_paced_tgi_server, start_tgi_server

__all__ = ["TGIServer", "start_paced_tgi_server", "start_tgi_server"]
