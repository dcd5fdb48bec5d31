"""Node images: the build context, the engine conversation with progress, and the record of what was built."""
