"""kvgate: gate an LLM server's switch to an FP8 KV cache on evidence."""

__version__ = "0.1.0"
