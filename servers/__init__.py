"""The stand-in servers the product uses for tests, benchmarks and classroom demos.

Each one stands in for a real serving engine (or starts the app itself), and is
labelled a stand-in wherever its numbers appear:

- `paced_openai`: an OpenAI-protocol server that streams at an exact, known pace
  (`python -m servers.paced_openai`), and `PacedServer`, a handle on a running one.
- `tgi_protocol`: a server that speaks TGI's protocol, checked against TGI's
  OpenAPI spec, on a real GGUF model or a paced engine (`python -m servers.tgi_protocol`).
- `app`: the app itself (`chainlit run app.py --headless`) on a free loopback port.
- `browser`: Debian's chromium for Playwright (a test and experiment dependency only).
- `process`: starting a server process, waiting for its HTTP, stopping it by PID.
"""
