"""The trained parts and their loading: the EAGLE head and the drafters that use it, Medusa heads,
Kangaroo's adapter (kangaroo.py), SPACE's mask model, the early-exit adapters, the
LayerSkip delta, and the artifact files they ship in (assets/<kind>/)."""
