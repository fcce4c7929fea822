"""What the user asks: the KVCacheRollout's spec, read, checked and bounded."""
