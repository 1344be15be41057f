"""The unit tests: pure logic, replayed traces, scripted GPUs, no real sleeping."""
