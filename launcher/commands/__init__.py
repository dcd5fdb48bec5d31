"""One module per CLI verb that needs more than a few lines; here, what several verbs share."""

CANCEL_GRACE_SECONDS = 15.0  # how long nodes have to stop on their own before they are forced (cancel, the ui's)
