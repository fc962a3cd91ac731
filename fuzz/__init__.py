"""Coverage-guided fuzzing (atheris, libFuzzer) of what parses network input: one harness per parser, each a module
runnable as `python -m fuzz.<name> [libFuzzer flags] CORPUS_DIR`; `python -m fuzz.run` (`make fuzz`) runs them all
for a bounded time and writes a summary. The same parsers have hypothesis properties in tests/fuzz/ (make test)."""
