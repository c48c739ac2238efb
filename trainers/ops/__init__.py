"""The machine and the artefacts: preflight, the all-reduce check, packaging."""
