"""Framework shapes: corpus runs logged by the real frameworks with their default logging.

The classic corpus (corpusgen/train.py) drives every writer from one loop, so
all its runs log every step. What a new user points trainsentry at looks
different: the HF Trainer logs a 500-step mean, Lightning one step in 50,
Keras a running epoch mean beside an epoch series whose step is the epoch,
a TF2-style writer tensor-encoded scalars. Each run here trains a tiny model
through the framework's own training API and logger, and faults are injected
with the framework's callbacks and hooks, never by editing what was written.
"""
