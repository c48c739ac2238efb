"""The CLSTM-PPO trading agent (seed 001)."""
