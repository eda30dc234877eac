"""The generative conformance suite (README.md beside this file)."""
