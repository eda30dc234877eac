"""The chute record format (`.crec`): writer, reader and spec (FORMAT.md)."""
