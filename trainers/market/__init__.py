"""Market data: one long table (date, ticker, open, high, low, close, volume) from any source."""
