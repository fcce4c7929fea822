"""What a model's files say: KV scales, bytes per token, capacity per format, the engines' own advice."""
