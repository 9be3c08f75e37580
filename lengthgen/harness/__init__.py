"""The train-short / evaluate-long harness."""
