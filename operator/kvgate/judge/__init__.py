"""What the evidence says: each gate, the statistics behind it and the verdict over all of them."""
