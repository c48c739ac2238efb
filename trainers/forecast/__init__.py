"""The S&P 500 return forecaster (seed 000)."""
