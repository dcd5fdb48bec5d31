"""The work-dir protocol: the store, its transfers and outage clock, and every record the nodes and the client both
read and write (see docs/protocol.md). Imports neither side."""
