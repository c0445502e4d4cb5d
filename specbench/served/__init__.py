"""Served engines: the ones teams deploy (vLLM first), measured over their HTTP API as a client sees
them, with acceptance read from the server's own metrics."""
