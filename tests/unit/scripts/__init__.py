"""The pure parts of scripts/: benchmark helpers and the committed algorithm plot."""
