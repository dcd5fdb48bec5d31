"""The node bootstrap: the program every node runs (see docs/protocol.md)."""
