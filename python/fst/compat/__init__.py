"""Other loaders' Python APIs, name for name, over fst's loader."""
