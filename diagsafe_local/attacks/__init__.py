"""Adaptive attacks: an attacker model rewrites each harmful goal from the target's answers and the judge's
scores (PAIR), or steers a conversation towards it turn by turn (Crescendo)."""
