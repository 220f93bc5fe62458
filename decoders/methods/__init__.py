"""The decoding methods, one module each: its paper's algorithm as `decode` and its declaration
(`METHOD`: name, family, parameters, presets, the events it emits), from which the registry, the
UI and trace validation derive."""
