"""Validation: how far a judge agrees with careful humans (gold sets), and what its measured error rates
mean for a run's attack-success rate."""
