"""The engine core: models, forwards and their caches, events, the acceptance rules and the phases
every method shares. It imports no method and no trained part (models.py loads the exit-tuned
model's delta lazily from trained/)."""
