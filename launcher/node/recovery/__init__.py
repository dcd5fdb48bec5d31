"""A recovering node: its membership rounds one after another, and its restores."""
