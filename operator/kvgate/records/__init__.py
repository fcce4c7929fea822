"""What kvgate keeps: the typed status and the records that cross stages, and how they are stored."""
