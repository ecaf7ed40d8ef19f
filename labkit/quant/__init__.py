"""What a GGUF tensor type is, below both engines: one record per type (formats.py) and random
valid blocks of any type (random_blocks.py)."""
