"""Runs after submission: their info.yaml, what the work dir says about them, and following their logs."""
