"""The load tool: inference-perf run against an engine, its reports read and judged.

inference-perf does the measuring; kvgate writes its config (`config`), reads the JSON
reports it writes and judges each stage (`report`), and runs it in its own venv
(`runner`, `make loadenv`). `tokenizer` builds the offline tokenizer for the simulator.
"""
