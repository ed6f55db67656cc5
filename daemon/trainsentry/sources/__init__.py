"""Decoders for what training jobs write, and the tailer that feeds them bytes."""
