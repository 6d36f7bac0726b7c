"""What users install: the wheel in a fresh venv and the container image (marked slow by tests/conftest.py)."""
