"""A third-party plugin with bugs: it must not break smdebug nor the other plugins."""
