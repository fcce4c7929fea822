"""kvgate eval: the paired GSM8K accuracy job (lm-eval adapter, task configs, gate decision)."""
