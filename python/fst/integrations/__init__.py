"""fst inside inference engines: each module here plugs fst into one engine
through that engine's own extension point (docs/engines.md)."""
