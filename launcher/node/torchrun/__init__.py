"""torchrun as the node starts it: its command line and rank environment, the shim, warm starts and the spare, the
ranks' output pipes."""
