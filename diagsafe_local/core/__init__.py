"""Core helpers every stage uses: messages, settings files, errors, JSONL, atomic writes, caches, locks, hashes."""
