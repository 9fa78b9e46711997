"""`python -m servers.tgi_protocol`: run the TGI-protocol stand-in (see server.py)."""

from servers.tgi_protocol.server import main

if __name__ == "__main__":
    main()
