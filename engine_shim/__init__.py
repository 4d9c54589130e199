"""What the engine imports: enqueue gathers, read published replies, never wait past the deadline."""
