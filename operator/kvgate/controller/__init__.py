"""The kopf layer: `handlers` registers the handlers; the other modules observe, act and record."""
