"""Per-symbol LSTM direction models (seed 003), many at once on every device."""
