"""The Chainlit side: views, commands, the settings panel, live rendering, login, the socket
guard and the /lab/state endpoint. It renders what `core` decides."""
