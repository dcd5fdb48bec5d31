"""Why training failed or seems hung (cause, stacks, hang watch), and how the node ends."""
